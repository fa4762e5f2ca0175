//! The daemon as a child process: health, cold start, `check`, and drain on SIGTERM.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::daemon::{Daemon, Fakes};
use crate::common::*;

fn minimal_config() -> String {
    r#"
[server]
listen = "127.0.0.1:0"
data_dir = "${PATTERD_DATA_DIR}"
drain_timeout_s = 30
[log]
format = "json"
"#
    .to_string()
}

#[test]
fn healthz_answers_and_sigterm_with_no_calls_exits_zero_quickly() {
    patterd::util::init_tls();
    let started = Instant::now();
    let mut d = Daemon::start(&minimal_config());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (h, r, m) = rt.block_on(async {
        let h = reqwest::get(d.url("/healthz")).await.unwrap();
        let r = reqwest::get(d.url("/readyz")).await.unwrap();
        let m = reqwest::get(d.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (h.status().as_u16(), r.status().as_u16(), m)
    });
    assert_eq!((h, r), (200, 200));
    assert!(m.contains("patterd_calls_active 0"), "{m}");
    let healthy_after = started.elapsed();
    eprintln!("cold start to /healthz 200: {healthy_after:?}");
    d.signal(libc::SIGTERM);
    let code = d.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0));
}

/// `patterd healthcheck` (the container image's HEALTHCHECK): exit 0 while the daemon serves
/// `/healthz`, 1 with a line saying why once it is gone.
#[test]
fn healthcheck_subcommand_follows_the_daemon() {
    let exe = env!("CARGO_BIN_EXE_patterd");
    let mut d = Daemon::start(&minimal_config());
    let base = d.url("");
    let probe = || {
        Command::new(exe)
            .args(["healthcheck", "--url", &base, "--timeout", "5"])
            .env_remove("PATTERD_CONFIG")
            .output()
            .expect("run patterd healthcheck")
    };
    let up = probe();
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert_eq!(up.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("answered 200"), "{stdout}");
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(10)), Some(0));
    let down = probe();
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert_eq!(down.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("unhealthy: cannot connect to"),
        "{stderr}"
    );
}

#[test]
fn check_prints_redacted_config_and_fails_on_errors() {
    let exe = env!("CARGO_BIN_EXE_patterd");
    let root = env!("CARGO_MANIFEST_DIR");
    let ok = Command::new(exe)
        .args(["check", "--config"])
        .arg(format!("{root}/config/patter.toml"))
        .env_clear()
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(out.contains("[server]"), "{out}");
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains("unconfigured"), "{err}");
    // --strict turns the unconfigured warnings into a failure.
    let strict = Command::new(exe)
        .args(["check", "--strict", "--config"])
        .arg(format!("{root}/config/patter.toml"))
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(strict.status.code(), Some(1));

    // Secrets are shown as ***.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(
        &path,
        "[llm.hermes]\nkind = \"hermes\"\napi_key = \"${HERMES_SECRET}\"\n",
    )
    .unwrap();
    let out = Command::new(exe)
        .args(["check", "--config"])
        .arg(&path)
        .env_clear()
        .env("HERMES_SECRET", "sk-very-secret-value")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("sk-very-secret-value"));
    assert!(stdout.contains("\"***\""), "{stdout}");

    // A typo fails with the line and the suggestion.
    std::fs::write(&path, "[server]\nlisen = \"127.0.0.1:8080\"\n").unwrap();
    let out = Command::new(exe)
        .args(["check", "--config"])
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":2") && err.contains("listen"), "{err}");

    // Running with a broken config fails before binding anything.
    let out = Command::new(exe)
        .arg("--config")
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn sigterm_waits_for_a_live_call_then_exits_zero() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fakes = Fakes::start(Vec::new()).await;
        let text = fakes.config_text();
        let mut d = Daemon::start(&text);
        let base = format!("http://{}", d.addr);
        let (call_sid, sim) = d.call().await;
        sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
            .await
            .unwrap();

        d.signal(libc::SIGTERM);
        let line = tokio::task::spawn_blocking({
            let lines = std::mem::replace(&mut d.lines, std::sync::mpsc::channel().1);
            move || {
                let deadline = Instant::now() + WAIT;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match lines.recv_timeout(left) {
                        Ok(l) if l.contains("draining") => return (Some(l), lines),
                        Ok(_) => continue,
                        Err(_) => return (None, lines),
                    }
                }
            }
        })
        .await
        .unwrap();
        d.lines = line.1;
        assert!(line.0.is_some(), "no draining log line");
        // Draining: not ready, new calls refused as busy, the live call goes on.
        let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
        assert_eq!(ready.status(), 503);
        let (_, busy) = d
            .twilio()
            .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
            .await
            .unwrap();
        assert!(busy.body.contains(r#"reason="busy""#), "{}", busy.body);
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "exited with a live call"
        );
        crate::common::speak(&sim, 600);
        sim.wait_for("reply during drain", WAIT, |s| s.marks_echoed.len() >= 2)
            .await
            .unwrap();
        assert!(d.child.try_wait().unwrap().is_none());

        // The caller hangs up: the daemon exits 0.
        sim.hang_up().await;
        let (code, d) = tokio::task::spawn_blocking(move || (d.wait_exit(WAIT), d))
            .await
            .unwrap();
        assert_eq!(code, Some(0));
        // The call ended during the drain, just before the exit: the store was flushed, so the
        // next start finds it completed, not open (which it would close as failed).
        let store = patterd::store::Store::open(d.data_dir(), 30, 16).expect("reopen store");
        let call = store.call(&call_sid).await.unwrap().expect("call row");
        assert_eq!(call.status, "completed", "{call:?}");
        assert_eq!(call.ended_reason.as_deref(), Some("caller hung up"));
    });
}

#[test]
fn turns_survive_sigkill_mid_call() {
    turns_survive_sigkill_on("", |d, _| {
        patterd::store::Store::open(d.data_dir(), 30, 16).expect("reopen store")
    });
}

/// The same on the PostgreSQL store: what the killed daemon committed is in the database, and
/// the next start of the same instance (it registers under the same name) closes its call as
/// failed.
#[test]
fn turns_survive_sigkill_mid_call_on_postgres() {
    let Some(db) = patterd_sim::postgres::TestDatabase::create() else {
        return;
    };
    let extra = format!(
        "\n[store]\nbackend = \"postgres\"\nurl = \"{}\"\n\n[cluster]\ninstance_name = \"node-a\"\n",
        db.url
    );
    let url = db.url.clone();
    turns_survive_sigkill_on(&extra, move |d, config| {
        // The daemon owned its calls as `node-a`; the next `node-a` closes them as it registers
        // (before it is ready, which `Daemon::start` waits for).
        let again = Daemon::start(config);
        drop(again);
        patterd::store::Store::open_postgres(&url, 1, "node-a", d.data_dir(), 30, 16)
            .expect("reopen store")
    });
    drop(db);
}

fn turns_survive_sigkill_on(
    extra_config: &str,
    reopen: impl FnOnce(&Daemon, &str) -> patterd::store::Store,
) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use patterd_sim::hermes::HermesReply;
        let fakes = Fakes::start(vec!["book a table for two".into()]).await;
        fakes.hermes.push(HermesReply::text("Sure, for what time?"));
        let text = fakes.config_text() + extra_config;
        // The store says at debug when a turn is committed.
        let text = text.replace("level = \"info\"", "level = \"info,patterd::store=debug\"");
        let d = Daemon::start(&text);
        let base = format!("http://{}", d.addr);
        let (call_sid, sim) = d.call().await;
        sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .unwrap();
        crate::common::speak(&sim, 700);
        // Greeting and reply have played: the turns have ended.
        sim.wait_for("reply marks", WAIT, |s| s.marks_echoed.len() >= 2)
            .await
            .unwrap();
        // The turn is durable once it ended: wait for the store's debug line saying the reply
        // was committed with all it heard, then kill.
        let heard = "Sure, for what time?".len();
        let stored = format!("\"heard_bytes\":{heard}");
        let seq = "\"seq\":2";
        let sid = call_sid.clone();
        let (found, d) = tokio::task::spawn_blocking(move || {
            let found = d.wait_line_where(WAIT, |l| {
                l.contains("turn stored")
                    && l.contains(&sid)
                    && l.contains(seq)
                    && l.contains(&stored)
            });
            (found, d)
        })
        .await
        .unwrap();
        let mut d = d;
        assert!(found.is_some(), "the reply was not stored before the kill");
        let client = api_client(API_TOKEN);
        let url = format!("{base}/v1/calls/{call_sid}/transcript");
        let v: serde_json::Value = client.get(&url).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["transcript"][2]["heard_text"], "Sure, for what time?");
        d.signal(libc::SIGKILL);
        let code = tokio::task::spawn_blocking(move || {
            let c = d.wait_exit(WAIT);
            (c, d)
        })
        .await
        .unwrap();
        assert_eq!(code.0, None, "killed by a signal, no exit code");
        let d = code.1;

        // Reopen the database (migrations run again, idempotently) and read the call back.
        let store = reopen(&d, &text);
        let call = store.call(&call_sid).await.unwrap().expect("call row");
        assert_eq!(call.direction, "inbound");
        assert_eq!(call.from, CALLER);
        // The call was live when the daemon died: reopening closes it as failed.
        assert_eq!(call.status, "failed");
        assert!(call.ended_at.is_some());
        let turns = store.turns(&call_sid).await.unwrap();
        let got: Vec<(&str, &str)> = turns
            .iter()
            .map(|t| (t.speaker.as_str(), t.heard_text.as_str()))
            .collect();
        assert_eq!(
            got[..3],
            [
                ("agent", GREETING),
                ("caller", "book a table for two"),
                ("agent", "Sure, for what time?"),
            ]
        );
        let events = store.events(&call_sid).await.unwrap();
        assert!(events.iter().any(|e| e.kind == "media_start"));
        drop(sim);
    });
}
