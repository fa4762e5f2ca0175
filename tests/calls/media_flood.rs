//! A caller that sends audio faster than real time (issue 31, item 1), against the real
//! `patterd` binary as a child process on 127.0.0.1 (its RSS is its own, whatever else this
//! binary runs): 8 s of flood over the browser phone's socket (60 ms frames, the largest it
//! takes, as fast as the socket allows) and over a Twilio media stream (JSON media frames at
//! 10× real time). The daemon paces the caller's audio (1.2× real time plus a 300 ms burst),
//! drops and counts the rest, and ends a call whose socket keeps flooding with a 1008 close:
//! its RSS barely moves, the STT hears about real time, the recording is as long as the call.
//!
//! The figures in docs/ROBUSTNESS.md ("Hardening round 2") are printed by
//! `cargo test --test calls media_flood -- --nocapture`.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use patterd::net::ws_client::connect;
use patterd::net::ws_pump::{self, WsIn};
use patterd::security::link::{PhoneLinks, unix_now};
use serde_json::{Value, json};

use crate::common::daemon::{Daemon, Fakes};
use crate::common::*;

/// How long the caller tries to flood.
const FLOOD: Duration = Duration::from_secs(8);
/// RSS growth allowed over the flood.
const RSS_GROWTH_MAX_KB: u64 = 20 * 1024;

/// The child's `VmRSS` and `VmHWM` (peak) in kB.
fn rss_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A daemon recording its calls, with the fakes it talks to.
async fn daemon() -> (Daemon, Fakes) {
    patterd::util::init_tls();
    let fakes = Fakes::start(Vec::new()).await;
    let opts = Opts {
        agent_extra: "record = true\nidle_nudge_after_s = 0".into(),
        ..Opts::default()
    };
    let text = config_text(
        &opts,
        &fakes.dg.base_url(),
        &fakes.el.base_url(),
        &fakes.hermes.base_url(),
        &fakes.rest.base_url,
        "",
    );
    (Daemon::start(&text), fakes)
}

/// The daemon's counter `name` from `/metrics`.
async fn metric(d: &Daemon, name: &str) -> u64 {
    let text = api_client(API_TOKEN)
        .get(d.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The ended call's record from `GET /v1/calls/{id}`.
async fn ended(d: &Daemon, call_id: &str) -> Value {
    let client = api_client(API_TOKEN);
    let deadline = Instant::now() + WAIT;
    loop {
        let v: Value = client
            .get(d.url(&format!("/v1/calls/{call_id}")))
            .send()
            .await
            .expect("GET call")
            .json()
            .await
            .expect("call JSON");
        if v["live"] == false && v["cost"]["usage"].is_object() && v["duration_ms"].is_u64() {
            return v;
        }
        assert!(Instant::now() < deadline, "the call did not end: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The finished recording's size in bytes.
async fn wav_size(d: &Daemon, call_id: &str) -> u64 {
    let client = api_client(API_TOKEN);
    let deadline = Instant::now() + WAIT;
    loop {
        let resp = client
            .get(d.url(&format!("/v1/calls/{call_id}/recording")))
            .send()
            .await
            .expect("GET recording");
        if resp.status() == 200 {
            let len = resp.content_length().expect("Content-Length");
            let body = resp.bytes().await.expect("body");
            assert_eq!(body.len() as u64, len);
            assert_eq!(&body[..4], b"RIFF");
            return len;
        }
        assert_eq!(resp.status(), 404);
        assert!(Instant::now() < deadline, "the recording never appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one flood did, checked against the issue's bounds and printed.
struct Figures {
    what: &'static str,
    rss_before_kb: u64,
    rss_after_kb: u64,
    /// The most `VmRSS` seen during the flood and after it.
    most_kb: u64,
    /// The process's peak (`VmHWM`), start-up included.
    peak_kb: u64,
    sent_audio_ms: u64,
    flood_ms: u64,
    dropped: u64,
    call: Value,
    wav_bytes: u64,
}

impl Figures {
    fn check(&self) {
        let duration_ms = self.call["duration_ms"].as_u64().expect("duration_ms");
        let stt_ms = self.call["cost"]["usage"]["stt_audio_ms"]
            .as_u64()
            .expect("stt_audio_ms");
        eprintln!(
            "{}: sent {} s of audio in {} ms; RSS {} -> {} kB (at most {} kB, VmHWM {} kB); \
             stt_audio_ms {stt_ms} for duration_ms {duration_ms}; WAV {} bytes \
             ({:.2} s); frames dropped {}; ended: {}",
            self.what,
            self.sent_audio_ms / 1000,
            self.flood_ms,
            self.rss_before_kb,
            self.rss_after_kb,
            self.most_kb,
            self.peak_kb,
            self.wav_bytes,
            (self.wav_bytes - 44) as f64 / 32_000.0,
            self.dropped,
            self.call["ended_reason"],
        );
        assert!(
            self.sent_audio_ms > 5 * self.flood_ms,
            "not a flood: {} ms of audio in {} ms",
            self.sent_audio_ms,
            self.flood_ms
        );
        assert!(
            self.most_kb.saturating_sub(self.rss_before_kb) < RSS_GROWTH_MAX_KB,
            "RSS grew from {} kB to {} kB",
            self.rss_before_kb,
            self.most_kb
        );
        assert!(
            stt_ms * 100 <= duration_ms * 125,
            "STT heard {stt_ms} ms of a {duration_ms} ms call"
        );
        let real_time_bytes = duration_ms * 32;
        assert!(
            (self.wav_bytes - 44) * 100 <= real_time_bytes * 125,
            "a WAV of {} bytes for a {duration_ms} ms call",
            self.wav_bytes
        );
        assert!(self.dropped > 0, "no frame reported dropped");
        assert_eq!(
            self.call["ended_reason"],
            "hung up: the caller sent audio faster than real time"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_phone_flood_is_paced_and_closed() {
    let (d, _fakes) = daemon().await;
    let pid = d.child.id();
    let (link, claims) = PhoneLinks::from_secret(API_TOKEN)
        .expect("link key")
        .mint("front-desk", unix_now() + 60);
    let url = format!("ws://{}/phone/socket?link={link}", d.addr);
    let (ws, _) = connect(&url, &[], WAIT)
        .await
        .expect("the phone socket opens");
    let (mut rx, tx, _guard) = ws_pump::split(ws);
    tx.text(&json!({"event": "start"}).to_string())
        .await
        .expect("start");
    // The greeting's first audio: the call is up.
    let deadline = Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(WsIn::Text(t))) if t.contains(r#""event":"media""#) => break,
            Ok(Some(_)) => {}
            other => panic!("no greeting: {other:?}"),
        }
    }
    // Whatever the daemon sends from now on is read (and the close noted) alongside.
    let closed = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if matches!(m, WsIn::Close { .. } | WsIn::Failed(_)) {
                return Some(m);
            }
        }
        None
    });
    // The frames of the flood the issue reproduced (a second each) are refused and counted.
    let bad_before = metric(&d, "patterd_media_frames_bad_total").await;
    let second = json!({"event": "media", "payload": STANDARD.encode([0x55u8; 8000])}).to_string();
    for _ in 0..5 {
        tx.text(&second).await.expect("send");
    }
    let deadline = Instant::now() + WAIT;
    while metric(&d, "patterd_media_frames_bad_total").await < bad_before + 5 {
        assert!(Instant::now() < deadline, "1 s frames not refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (rss_before_kb, _) = rss_kb(pid);
    let dropped_before = metric(&d, "patterd_media_frames_paced_total").await;
    let frame = json!({"event": "media", "payload": STANDARD.encode([0x55u8; 480])}).to_string();
    let started = Instant::now();
    let mut sent = 0u64;
    let mut most_kb = rss_before_kb;
    while started.elapsed() < FLOOD && !closed.is_finished() {
        if tx.text(&frame).await.is_err() {
            break;
        }
        sent += 1;
        if sent.is_multiple_of(1000) {
            most_kb = most_kb.max(rss_kb(pid).0);
        }
    }
    let flood_ms = started.elapsed().as_millis() as u64;
    let close = tokio::time::timeout(WAIT, closed)
        .await
        .expect("the socket is closed")
        .expect("reader");
    let (rss_after_kb, peak_kb) = rss_kb(pid);
    let most_kb = most_kb.max(rss_after_kb);
    // The daemon closes with 1008; a client still writing may see the connection reset
    // before it reads that close (the daemon drops the socket with unread frames in it).
    match &close {
        Some(WsIn::Close { code, reason }) => {
            assert_eq!(
                (*code, reason.as_str()),
                (Some(1008), "audio faster than real time")
            )
        }
        Some(WsIn::Failed(_)) => {}
        other => panic!("the socket ended with {other:?}"),
    }
    let dropped = metric(&d, "patterd_media_frames_paced_total").await - dropped_before;
    assert_eq!(metric(&d, "patterd_media_floods_total").await, 1);
    let call = ended(&d, &claims.call_id).await;
    let wav_bytes = wav_size(&d, &claims.call_id).await;
    Figures {
        what: "browser phone, 60 ms frames as fast as the socket allows",
        rss_before_kb,
        rss_after_kb,
        most_kb,
        peak_kb,
        sent_audio_ms: sent * 60,
        flood_ms,
        dropped,
        call,
        wav_bytes,
    }
    .check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twilio_stream_at_ten_times_real_time_is_paced_and_closed() {
    let (d, _fakes) = daemon().await;
    let pid = d.child.id();
    let (call_sid, sim) = d.call().await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .expect("the greeting");
    let (rss_before_kb, _) = rss_kb(pid);
    let dropped_before = metric(&d, "patterd_media_frames_paced_total").await;
    let stream_sid = sim.stream_sid.clone();
    let payload = STANDARD.encode([0x55u8; 160]);
    // Ten 20 ms frames every 20 ms, on top of the simulator's own real-time frames.
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut sent = 0u64;
    let mut most_kb = rss_before_kb;
    while started.elapsed() < FLOOD && sim.state().closed.is_none() {
        tick.tick().await;
        most_kb = most_kb.max(rss_kb(pid).0);
        for _ in 0..10 {
            sent += 1;
            sim.send_raw(
                &json!({
                    "event": "media",
                    "sequenceNumber": (sent + 1_000_000).to_string(),
                    "media": {"track": "inbound", "chunk": sent.to_string(),
                              "timestamp": (sent * 2).to_string(), "payload": payload},
                    "streamSid": stream_sid,
                })
                .to_string(),
            );
        }
    }
    let flood_ms = started.elapsed().as_millis() as u64;
    let close = sim.wait_closed(WAIT).await.expect("the stream is closed");
    let (rss_after_kb, peak_kb) = rss_kb(pid);
    let most_kb = most_kb.max(rss_after_kb);
    assert_eq!(
        (close.code, close.reason.as_str()),
        (Some(1008), "audio faster than real time"),
        "{close:?}"
    );
    let dropped = metric(&d, "patterd_media_frames_paced_total").await - dropped_before;
    let call = ended(&d, &call_sid).await;
    let wav_bytes = wav_size(&d, &call_sid).await;
    Figures {
        what: "Twilio media stream at 10x real time",
        rss_before_kb,
        rss_after_kb,
        most_kb,
        peak_kb,
        sent_audio_ms: sent * 20,
        flood_ms,
        dropped,
        call,
        wav_bytes,
    }
    .check();
}
