//! Post-call webhooks (`[[webhooks]]`) through the real wire: a call's events reach a strict
//! receiver (`patterd_sim::webhook_receiver`) signed so that the Standard Webhooks library
//! from PyPI (`standardwebhooks`, in the venv of tests/webhooks/setup.sh) verifies them, and a
//! forged copy fails; a receiver that answers 410 dead-letters the delivery, which the API
//! lists and retries by hand; a receiver that hangs is timed out and tried again; an agent's
//! `[agents.X.summary]` is written after the call, stored and sent in `call.ended` (which waits
//! for it), and a summary that fails is stored as failed without holding the event; and the
//! acceptance test: the daemon SIGKILLed with 100 undelivered `call.ended` events while the
//! receiver answers 500 for a minute — after the restart all 100 arrive, each acknowledged
//! once per id, every signature verified by the library.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use patterd_sim::webhook_receiver::{Answer, Delivery, FakeWebhookReceiver};
use serde_json::{Value, json};

use crate::common::daemon::{Daemon, Fakes};
use crate::common::*;

/// The signing secret of the tests (`whsec_` + base64 of 32 bytes).
const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// `[[webhooks]]` for `url` with `events`, and a fast retry schedule.
fn webhook_config(url: &str, events: &[&str]) -> String {
    let events = events
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[[webhooks]]
url = "{url}"
events = [{events}]
secret = "{SECRET}"
allow_loopback = true

[webhook_delivery]
timeout_s = 1
retry_base_ms = 100
retry_max_ms = 1000
poll_ms = 50
"#
    )
}

/// The Python of the webhooks venv (tests/webhooks/setup.sh), if it was set up.
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("PATTERD_WEBHOOKS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")));
            target.join("webhooks-venv")
        });
    let py = venv.join("bin/python");
    if py.exists() {
        return Some(py);
    }
    assert!(
        std::env::var("PATTERD_REQUIRE_WEBHOOKS_VENV").as_deref() != Ok("1"),
        "PATTERD_REQUIRE_WEBHOOKS_VENV=1 but {} is missing: run tests/webhooks/setup.sh",
        py.display()
    );
    eprintln!(
        "SKIPPED the Standard Webhooks library check: no venv at {}; run tests/webhooks/setup.sh",
        venv.display()
    );
    None
}

/// Each delivery verified by the Standard Webhooks library (tests/webhooks/verify.py):
/// `(webhook-id, verified)` in order, or `None` without the venv.
fn verify_with_library(deliveries: &[&Delivery]) -> Option<Vec<(String, bool)>> {
    let py = venv_python()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("deliveries.jsonl");
    let lines: String = deliveries
        .iter()
        .map(|d| json!({"headers": d.headers, "body": d.body}).to_string() + "\n")
        .collect();
    std::fs::write(&file, lines).expect("write deliveries");
    let out = std::process::Command::new(py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/webhooks/verify.py"
        ))
        .arg(SECRET)
        .arg(&file)
        .output()
        .expect("run verify.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify.py failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<(String, bool)> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("ok").is_some())
        .map(|v| {
            (
                v["id"].as_str().unwrap_or_default().to_string(),
                v["ok"] == true,
            )
        })
        .collect();
    assert_eq!(results.len(), deliveries.len(), "{stdout}");
    Some(results)
}

/// `d` with its body changed by one character (the signature no longer covers it).
fn forged(d: &Delivery) -> Delivery {
    let mut f = d.clone();
    f.body = f.body.replacen("\"data\"", "\"data\" ", 1);
    assert_ne!(f.body, d.body);
    f
}

#[tokio::test]
async fn a_call_reports_its_events_signed_for_the_standard_webhooks_library() {
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    let stack = Stack::start(Opts {
        agent_extra: "record = true".into(),
        extra_config: webhook_config(
            &hooks.url(),
            &[
                "call.started",
                "turn.completed",
                "call.ended",
                "recording.ready",
            ],
        ),
        ..Default::default()
    })
    .await;
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    let rec = hooks
        .wait_until("call.ended and recording.ready", WAIT, |r| {
            let kinds: BTreeSet<String> = r.acknowledged().iter().map(|d| d.event()).collect();
            kinds.contains("call.ended") && kinds.contains("recording.ready")
        })
        .await;
    let acked = rec.acknowledged();
    let kinds: Vec<String> = acked.iter().map(|d| d.event()).collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "call.started").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "call.ended").count(),
        1,
        "{kinds:?}"
    );
    // Greeting, the caller's turn, the agent's answer: each reported once, in order.
    let turns: Vec<(i64, String)> = acked
        .iter()
        .filter(|d| d.event() == "turn.completed")
        .map(|d| {
            let v = d.json();
            (
                v["data"]["seq"].as_i64().unwrap_or(-1),
                v["data"]["speaker"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            (0, "agent".into()),
            (1, "caller".into()),
            (2, "agent".into())
        ],
        "{kinds:?}"
    );
    assert_eq!(
        rec.ids().len(),
        acked.len(),
        "every event has an id of its own"
    );

    let ended = acked
        .iter()
        .find(|d| d.event() == "call.ended")
        .expect("ended");
    let v = ended.json();
    assert_eq!(v["data"]["call"]["call_id"], call_sid.as_str());
    assert_eq!(v["data"]["call"]["status"], "completed");
    assert_eq!(v["data"]["call"]["ended_reason"], "caller hung up");
    assert_eq!(v["data"]["call"]["from"], CALLER);
    assert!(v["data"]["call"]["cost"]["usage"].is_object(), "{v}");
    assert_eq!(v["data"]["transcript"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["data"]["transcript"][0]["heard_text"], GREETING);
    assert!(
        v["data"]["transcript"][1]["response_latency_ms"].is_i64(),
        "{v}"
    );
    assert_eq!(v["data"]["latency"]["turns"], 1);
    assert!(v["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    let recording = acked
        .iter()
        .find(|d| d.event() == "recording.ready")
        .expect("recording");
    assert_eq!(
        recording.json()["data"]["url"],
        format!("{PUBLIC_URL}/v1/calls/{call_sid}/recording").as_str()
    );
    assert!(recording.json()["data"]["bytes"].as_u64() > Some(44));
    for d in &acked {
        assert_eq!(d.header("content-type"), Some("application/json"));
        assert!(d.id().starts_with("msg_"), "{:?}", d.headers);
        assert!(
            d.header("webhook-signature")
                .is_some_and(|s| s.starts_with("v1,"))
        );
    }

    // The library verifies every delivery, and refuses a forged copy of one.
    let forgery = forged(ended);
    let mut checked: Vec<&Delivery> = acked.clone();
    checked.push(&forgery);
    if let Some(results) = verify_with_library(&checked) {
        let (real, fake) = results.split_at(acked.len());
        assert!(real.iter().all(|(_, ok)| *ok), "{real:?}");
        assert_eq!(fake, [(ended.id().to_string(), false)]);
    }

    // Delivered rows stay listed; nothing waits.
    let v: Value = stack
        .api_client()
        .get(format!(
            "{}/v1/webhooks/deliveries?state=delivered",
            stack.base
        ))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(
        v["deliveries"].as_array().map(Vec::len),
        Some(acked.len()),
        "{v}"
    );
    assert_eq!(
        (v["pending"].clone(), v["dead"].clone()),
        (json!(0), json!(0))
    );
}

#[tokio::test]
async fn a_receiver_that_answers_410_dead_letters_and_a_retry_by_hand_delivers() {
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    hooks.push(Answer::status(503).header("Retry-After", "0"));
    hooks.push(Answer::status(410));
    let stack = Stack::start(Opts {
        extra_config: webhook_config(&hooks.url(), &["call.ended"]),
        ..Default::default()
    })
    .await;
    let (call_sid, sim) = stack.call().await;
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    hooks
        .wait_until("503 then 410", WAIT, |r| r.deliveries.len() == 2)
        .await;
    let client = stack.api_client();
    let deliveries = format!("{}/v1/webhooks/deliveries", stack.base);
    let dead = loop {
        let v: Value = client
            .get(format!("{deliveries}?state=dead"))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        if v["dead"] == 1 {
            break v;
        }
        // The settle follows the 410 at once; the list is read from the store.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let d = &dead["deliveries"][0];
    assert_eq!(d["event"], "call.ended");
    assert_eq!(d["call_id"], call_sid.as_str());
    assert_eq!(d["attempts"], 2);
    assert_eq!(d["last_status"], 410);
    assert!(
        d["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("410 Gone")),
        "{d}"
    );
    let id = d["id"].as_str().expect("id").to_string();
    let metrics = client
        .get(format!("{}/metrics", stack.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for line in [
        "patterd_webhook_deliveries_total{outcome=\"retried\"} 1",
        "patterd_webhook_deliveries_total{outcome=\"dead\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing:\n{metrics}"
        );
    }

    // Bad requests: an unknown state, an unknown id, a retry of what is not dead.
    let bad = client
        .get(format!("{deliveries}?state=lost"))
        .send()
        .await
        .expect("list");
    assert_eq!(bad.status(), 400);
    let none = client
        .post(format!("{deliveries}/msg_nothing/retry"))
        .json(&json!({}))
        .send()
        .await
        .expect("retry");
    assert_eq!(none.status(), 404);
    // Operator only: the call's own token (or no token) may not look.
    let anon = reqwest::get(&deliveries).await.expect("anon");
    assert_eq!(anon.status(), 401);

    // Retried by hand: due at once, delivered (the receiver answers 200 now), same id.
    let r = client
        .post(format!("{deliveries}/{id}/retry"))
        .json(&json!({}))
        .send()
        .await
        .expect("retry");
    assert_eq!(r.status(), 200);
    let rec = hooks
        .wait_until("the retried delivery", WAIT, |r| {
            !r.acknowledged().is_empty()
        })
        .await;
    assert_eq!(rec.acknowledged()[0].id(), id);
    let again = client
        .post(format!("{deliveries}/{id}/retry"))
        .json(&json!({}))
        .send()
        .await
        .expect("retry");
    assert!(
        [200, 409].contains(&again.status().as_u16()),
        "pending or delivered by now: {}",
        again.status()
    );
}

#[tokio::test]
async fn a_receiver_that_hangs_is_timed_out_and_tried_again() {
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    // Longer than timeout_s = 1: patterd gives up on the first attempt.
    hooks.push(Answer::status(200).delayed(Duration::from_secs(3)));
    let stack = Stack::start(Opts {
        extra_config: webhook_config(&hooks.url(), &["call.ended"]),
        ..Default::default()
    })
    .await;
    let (call_sid, sim) = stack.call().await;
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    let rec = hooks
        .wait_until("a second attempt", WAIT, |r| r.deliveries.len() >= 2)
        .await;
    assert_eq!(rec.ids().len(), 1, "the same event, the same id");
    let first: i64 = rec.deliveries[0]
        .header("webhook-timestamp")
        .unwrap()
        .parse()
        .unwrap();
    let second: i64 = rec.deliveries[1]
        .header("webhook-timestamp")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        second >= first,
        "each attempt is signed with its own timestamp"
    );
}

/// `[agents.front-desk.summary]` on the fake Hermes' OpenAI-compatible side, with a schema.
const SUMMARY: &str = "summary = { llm = \"compat\", timeout_s = 10, schema = { type = \"object\", \
    properties = { party_size = { type = \"integer\" } }, required = [\"party_size\"] } }";

/// The `call.ended` of `call_sid` once the receiver has it.
async fn call_ended(hooks: &FakeWebhookReceiver, call_sid: &str) -> Value {
    let rec = hooks
        .wait_until("call.ended", WAIT, |r| {
            r.acknowledged().iter().any(|d| d.event() == "call.ended")
        })
        .await;
    let d = rec
        .acknowledged()
        .into_iter()
        .find(|d| d.event() == "call.ended")
        .expect("call.ended")
        .json();
    assert_eq!(d["data"]["call"]["call_id"], call_sid);
    d
}

#[tokio::test]
async fn a_summary_is_written_after_the_call_stored_with_it_and_sent_in_call_ended() {
    use patterd_sim::hermes::HermesReply;
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    let stack = Stack::start(Opts {
        transcripts: vec!["a table for two at eight".into()],
        agent_extra: SUMMARY.into(),
        extra_config: webhook_config(&hooks.url(), &["call.ended"]),
        ..Default::default()
    })
    .await;
    stack
        .hermes
        .push(HermesReply::text("Sure, two people at eight."));
    stack.hermes.push(HermesReply::text(
        "```json\n{\"summary\": \"The caller booked a table for two at eight.\", \"data\": {\"party_size\": 2}}\n```",
    ));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    sim.hang_up().await;
    stack.finished(&call_sid).await;

    let v = call_ended(&hooks, &call_sid).await;
    let summary = &v["data"]["call"]["summary"];
    assert_eq!(
        *summary,
        json!({"text": "The caller booked a table for two at eight.", "data": {"party_size": 2},
               "llm": "compat", "error": null}),
        "{v}"
    );
    // The brain read the transcript (what the caller said, what they heard of the agent).
    let rec = stack.hermes.record();
    let asked = rec.requests.last().expect("the summary request").messages();
    let text: String = asked.iter().map(|(_, c)| c.as_str()).collect();
    assert!(text.contains("caller: a table for two at eight"), "{text}");
    assert!(text.contains("agent: Sure, two people at eight."), "{text}");
    assert!(
        text.contains("party_size"),
        "the schema is in the prompt: {text}"
    );
    // Stored with the call.
    let call: Value = stack
        .api_client()
        .get(format!("{}/v1/calls/{call_sid}", stack.base))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(call["summary"], *summary);
}

#[tokio::test]
async fn a_failed_summary_is_stored_as_such_and_call_ended_goes_all_the_same() {
    use patterd_sim::hermes::HermesReply;
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    let stack = Stack::start(Opts {
        transcripts: vec!["a table for two".into()],
        agent_extra: SUMMARY.into(),
        extra_config: webhook_config(&hooks.url(), &["call.ended"]),
        ..Default::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Sure."));
    // The summary's brain answers something that is not the schema's data.
    stack.hermes.push(HermesReply::text(
        "{\"summary\": \"A booking.\", \"data\": {\"party_size\": \"two\"}}",
    ));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    sim.hang_up().await;
    let v = call_ended(&hooks, &call_sid).await;
    let summary = &v["data"]["call"]["summary"];
    assert_eq!(summary["text"], "A booking.", "{v}");
    assert_eq!(summary["data"], Value::Null);
    assert!(
        summary["error"]
            .as_str()
            .is_some_and(|e| e.contains("does not match the schema")),
        "{summary}"
    );
}

/// How long the acceptance test's receiver answers 500 (`PATTERD_TEST_WEBHOOK_FAIL_S`
/// shortens it for a quick local run).
fn failing_window() -> Duration {
    Duration::from_secs(
        std::env::var("PATTERD_TEST_WEBHOOK_FAIL_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

const CALLS: usize = 100;

/// The acceptance test: 100 `call.ended` events undelivered (the receiver answers 500) when
/// the daemon is SIGKILLed; after the restart every one arrives once the receiver recovers,
/// each acknowledged once per id, every signature verified by the Standard Webhooks library.
#[test]
fn a_hundred_undelivered_call_ended_events_survive_sigkill() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let hooks = FakeWebhookReceiver::start().await.expect("receiver");
        let window = failing_window();
        hooks.fail_for(window, 500);
        let failing_since = std::time::Instant::now();
        let fakes = Fakes::start(Vec::new()).await;
        let config = fakes.config_text() + &webhook_config(&hooks.url(), &["call.ended"]);
        let d = Daemon::start(&config);

        // 100 calls, 25 at a time: answered, then the caller hangs up.
        let mut sids = BTreeSet::new();
        for _ in 0..CALLS / 25 {
            let calls = (0..25).map(|_| async {
                let (sid, sim) = d.call().await;
                sim.hang_up().await;
                sid
            });
            sids.extend(futures_join_all(calls).await);
        }
        assert_eq!(sids.len(), CALLS);
        eprintln!("{CALLS} calls made in {:?}", failing_since.elapsed());
        // Every event was tried (and refused) at least once: all 100 are in the outbox.
        hooks
            .wait_until("a first attempt of every call.ended", WAIT * 4, |r| {
                r.ids().len() == CALLS
            })
            .await;
        let client = api_client(API_TOKEN);
        let v: Value = client
            .get(d.url("/v1/webhooks/deliveries?state=pending&limit=1"))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        assert_eq!(v["pending"], CALLS, "{v}");
        let before = hooks.record();
        assert!(
            before.acknowledged().is_empty() && failing_since.elapsed() < window,
            "the calls took longer than the receiver's failing window ({window:?}); raise it"
        );

        // SIGKILL, then the same daemon again on the same data directory.
        eprintln!(
            "SIGKILL with {CALLS} undelivered after {} attempts, at {:?}",
            before.deliveries.len(),
            failing_since.elapsed()
        );
        d.signal(libc::SIGKILL);
        let (code, d) = tokio::task::spawn_blocking(move || {
            let mut d = d;
            (d.wait_exit(WAIT), d)
        })
        .await
        .expect("join");
        assert_eq!(code, None, "killed by the signal");
        let d = tokio::task::spawn_blocking(move || d.restart(&config))
            .await
            .expect("restart");

        // Once the receiver answers 200 again, every event arrives.
        let rec = hooks
            .wait_until("all 100 acknowledged", window + WAIT * 2, |r| {
                r.acknowledged_ids().len() == CALLS
            })
            .await;
        eprintln!(
            "all {CALLS} acknowledged at {:?} (the receiver failed for {window:?})",
            failing_since.elapsed()
        );
        let acked = rec.acknowledged();
        let mut per_id: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &acked {
            *per_id.entry(a.id()).or_default() += 1;
        }
        assert!(
            per_id.values().all(|n| *n == 1),
            "an id acknowledged twice: {per_id:?}"
        );
        assert_eq!(per_id.len(), CALLS);
        assert!(
            acked.iter().all(|a| a.at >= window),
            "none before the receiver recovered"
        );
        let reported: BTreeSet<String> = acked
            .iter()
            .map(|a| {
                a.json()["data"]["call"]["call_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert_eq!(
            reported,
            sids.iter().cloned().collect(),
            "one call.ended per call"
        );
        assert!(acked.iter().all(|a| a.event() == "call.ended"));
        // The ids are the ones of the first attempts, before the kill.
        let first_ids: BTreeSet<&str> = before.ids();
        assert_eq!(
            per_id.keys().copied().collect::<BTreeSet<&str>>(),
            first_ids
        );

        // The Standard Webhooks library verifies every delivery (and not a forged one).
        let forgery = forged(acked[0]);
        let mut checked = acked.clone();
        checked.push(&forgery);
        if let Some(results) = verify_with_library(&checked) {
            let verified = results.iter().filter(|(_, ok)| *ok).count();
            assert_eq!(verified, CALLS, "{results:?}");
            assert!(!results[CALLS].1, "the forged copy verified");
        }

        // Nothing left waiting; the metrics say so too.
        let metrics = loop {
            let m = client
                .get(d.url("/metrics"))
                .send()
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text");
            if m.lines()
                .any(|l| l == "patterd_webhook_deliveries_pending 0")
            {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            metrics.lines().any(|l| l
                == format!("patterd_webhook_deliveries_total{{outcome=\"delivered\"}} {CALLS}")),
            "{metrics}"
        );
        assert!(
            metrics
                .lines()
                .any(|l| l == "patterd_webhook_dead_letters 0")
        );
        drop(d);
    });
}

/// Runs `futs` together (each call's webhook and media socket at once) and gives their
/// outputs in order.
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<std::pin::Pin<Box<F>>>> = futs.map(|f| Some(Box::pin(f))).collect();
    let mut results: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (slot, result) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *result = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
