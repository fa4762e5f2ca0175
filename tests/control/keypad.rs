//! The caller's keypad against the daemon as a child process on 127.0.0.1 (issue 31 item 2):
//! keys are collected into a few caller turns, not one brain request each, and a flood of
//! keys over the browser phone costs little CPU and memory (measured from `/proc` of the
//! process); the fake brain (`openai_compatible`) counts the requests and their messages.
//! Figures: `cargo test --test control keypad -- --nocapture` (docs/ROBUSTNESS.md,
//! "Hardening round 2").

use std::time::{Duration, Instant};

use patterd::net::ws_client::connect;
use patterd::net::ws_pump::{self, WsIn};
use patterd::security::link::{PhoneLinks, unix_now};
use serde_json::{Value, json};

use crate::common::daemon::{Daemon, Fakes};
use crate::common::*;

/// The daemon's config: the `openai_compatible` brain (it is sent the history), no idle
/// nudges, calls long enough for any flood.
fn config(fakes: &Fakes) -> String {
    config_text(
        &Opts {
            llm: "compat".into(),
            agent_extra: "idle_nudge_after_s = 0".into(),
            max_duration_s: 600,
            ..Opts::default()
        },
        &fakes.dg.base_url(),
        &fakes.el.base_url(),
        &fakes.hermes.base_url(),
        &fakes.rest.base_url,
        "",
    )
}

/// CPU time (user + system) the process has used, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// A `/proc/PID/status` field in kB (`VmRSS`, `VmHWM`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("status field")
}

/// The keys of each request's newest caller message ("The caller pressed 123.").
fn keys_per_request(fakes: &Fakes) -> Vec<usize> {
    fakes
        .hermes
        .record()
        .requests
        .iter()
        .map(|r| {
            r.messages()
                .iter()
                .rev()
                .find(|(role, _)| role == "user")
                .map_or(0, |(_, c)| c.chars().filter(char::is_ascii_digit).count())
        })
        .collect()
}

#[test]
fn fifty_keys_at_ten_a_second_on_a_twilio_call_are_a_few_brain_requests() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fakes = Fakes::start(Vec::new()).await;
        let d = Daemon::start(&config(&fakes));
        let (call_sid, sim) = d.call().await;
        sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .unwrap();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for k in "0123456789".repeat(5).chars() {
            tick.tick().await;
            sim.send_dtmf(k);
        }
        // Every key reaches the brain once (the last ones after the inter-digit pause).
        let record = fakes
            .hermes
            .wait_until("all 50 keys sent to the brain", |r| {
                r.requests
                    .iter()
                    .filter_map(|q| q.messages().into_iter().rev().find(|(r, _)| r == "user"))
                    .map(|(_, c)| c.chars().filter(char::is_ascii_digit).count())
                    .sum::<usize>()
                    >= 50
            })
            .await;
        let requests = record.requests.len();
        let longest = record
            .requests
            .iter()
            .map(|r| r.messages().len())
            .max()
            .unwrap_or(0);
        println!(
            "FIGURE keypad twilio: 50 keys at 10/s -> {requests} brain requests, at most \
             {longest} messages each; keys per request {:?}",
            keys_per_request(&fakes)
        );
        assert!(requests <= 5, "{requests} brain requests for 50 keys");
        assert!(longest <= 2 * 5 + 1, "{longest} messages in one request");
        sim.hang_up().await;
        drop(call_sid);
    });
}

#[test]
fn twenty_thousand_keys_on_the_browser_phone_cost_little() {
    patterd::util::init_tls();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fakes = Fakes::start(Vec::new()).await;
        let d = Daemon::start(&config(&fakes));
        let pid = d.child.id();
        let links = PhoneLinks::from_secret(API_TOKEN).expect("link key");
        let (link, claims) = links.mint("front-desk", unix_now() + 120);
        let url = format!("ws://{}/phone/socket?link={link}", d.addr);
        let (ws, _) = connect(&url, &[], WAIT)
            .await
            .expect("the phone socket opens");
        let (mut rx, tx, _guard) = ws_pump::split(ws);
        tx.text(&json!({"event": "start"}).to_string())
            .await
            .expect("start");
        // Settled: the stream started (the page is told).
        loop {
            match tokio::time::timeout(WAIT, rx.recv()).await {
                Ok(Some(WsIn::Text(t))) if t.contains("media_start") => break,
                Ok(Some(_)) => continue,
                other => panic!("no media_start: {other:?}"),
            }
        }
        // The page's side: count what comes back until the socket closes.
        let reader = tokio::spawn(async move {
            let (mut frames, mut bytes) = (0u64, 0u64);
            while let Some(m) = rx.recv().await {
                match m {
                    WsIn::Text(t) => {
                        frames += 1;
                        bytes += t.len() as u64;
                    }
                    WsIn::Binary(b) => bytes += b.len() as u64,
                    _ => break,
                }
            }
            (frames, bytes)
        });
        let cpu_before = cpu_time(pid);
        let rss_before = status_kb(pid, "VmRSS");
        let started = Instant::now();
        let keys = "0123456789*#";
        for i in 0..20_000usize {
            let k = keys.as_bytes()[i % keys.len()] as char;
            tx.text(&json!({"event": "dtmf", "digit": k.to_string()}).to_string())
                .await
                .expect("a key");
        }
        // The keys the rate limit let through are one caller turn after the pause.
        fakes
            .hermes
            .wait_until("the keypad turn", |r| !r.requests.is_empty())
            .await;
        // The keys are all read once the call ends on the stop that follows them.
        tx.text(&json!({"event": "stop"}).to_string())
            .await
            .expect("stop");
        let (frames, bytes) = tokio::time::timeout(Duration::from_secs(120), reader)
            .await
            .expect("the socket closes after the stop")
            .expect("reader");
        let elapsed = started.elapsed();
        let cpu = cpu_time(pid).saturating_sub(cpu_before);
        let peak = status_kb(pid, "VmHWM");
        let growth_kb = peak.saturating_sub(rss_before);
        let requests = fakes.hermes.record().requests.len();
        let longest = fakes
            .hermes
            .record()
            .requests
            .iter()
            .map(|r| r.messages().len())
            .max()
            .unwrap_or(0);
        let call: Value = api_client(API_TOKEN)
            .get(d.url(&format!("/v1/calls/{}", claims.call_id)))
            .send()
            .await
            .expect("GET call")
            .json()
            .await
            .expect("JSON");
        println!(
            "FIGURE keypad browser: 20000 keys in {:.2} s -> {requests} brain requests (at most \
             {longest} messages), daemon CPU {:.2} s, RSS {} MB before, peak growth {:.1} MB, \
             {frames} frames ({bytes} bytes) to the page",
            elapsed.as_secs_f64(),
            cpu.as_secs_f64(),
            rss_before / 1024,
            growth_kb as f64 / 1024.0
        );
        assert_eq!(call["carrier"], "web", "{call}");
        let timeline: Value = api_client(API_TOKEN)
            .get(d.url(&format!("/v1/calls/{}/events", claims.call_id)))
            .send()
            .await
            .expect("GET events")
            .json()
            .await
            .expect("JSON");
        let events = timeline["events"].as_array().expect("events");
        let of = |kind: &str| -> Vec<&str> {
            events
                .iter()
                .filter(|e| e["kind"] == kind)
                .map(|e| e["detail"].as_str().unwrap_or(""))
                .collect()
        };
        let accepted = of("dtmf").len();
        println!(
            "FIGURE keypad browser: {accepted} keys acted on, dropped noted at {:?}",
            of("dtmf_dropped")
        );
        assert!(
            of("dtmf_dropped").contains(&"10000"),
            "the daemon read the flood and counted what it dropped: {:?}",
            of("dtmf_dropped")
        );
        assert!(accepted <= 40, "{accepted} keys acted on");
        assert!(requests <= 5, "{requests} brain requests");
        assert!(longest <= 2 * 5 + 1, "{longest} messages in one request");
        assert!(cpu < Duration::from_secs(3), "daemon CPU {cpu:?}");
        assert!(growth_kb < 20 * 1024, "RSS grew {growth_kb} kB");
        assert!(frames < 2_000, "{frames} progress frames for the page");
    });
}
