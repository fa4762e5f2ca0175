//! A flood of forged webhooks while calls are live (docs/ROBUSTNESS.md, "Floods"; the small
//! version that runs in `cargo test`): every forged request is refused with 403 and counted,
//! none reaches a provider, and the live calls go on talking.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::common::*;

/// Forged webhooks per carrier.
const PER_CARRIER: usize = 1000;
/// Requests in flight at once.
const CONCURRENCY: usize = 64;
/// Calls live during the flood.
const LIVE: usize = 5;

/// One forged webhook of carrier `i % 3`; returns its status.
async fn forged(client: &reqwest::Client, base: &str, i: usize) -> u16 {
    let call = format!("CA{i:032x}");
    let req = match i % 3 {
        0 => client
            .post(format!("{base}/twilio/voice"))
            .header("X-Twilio-Signature", "bm90IGEgc2lnbmF0dXJl")
            .form(&patterd_sim::twilio::voice_webhook_params(
                ACCOUNT_SID,
                &call,
                CALLER,
                OUR_NUMBER,
            )),
        1 => client
            .post(format!("{base}/telnyx/webhook"))
            .header("telnyx-signature-ed25519", "bm90IGEgc2lnbmF0dXJl")
            .header("telnyx-timestamp", patterd::carrier::webhook::unix_now().to_string())
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"data":{{"event_type":"call.initiated","id":"{call}","payload":{{"call_control_id":"v3:{call}","from":"{CALLER}","to":"{TELNYX_NUMBER}","direction":"incoming"}}}}}}"#
            )),
        _ => client
            .post(format!("{base}/plivo/answer"))
            .header("X-Plivo-Signature-V3", "bm90IGEgc2lnbmF0dXJl")
            .header("X-Plivo-Signature-V3-Nonce", i.to_string())
            .form(&patterd_sim::plivo::answer_params(
                &call,
                CALLER,
                PLIVO_NUMBER,
            )),
    };
    match req.send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_webhook_flood_while_calls_are_live() {
    // No idle nudges: on a loaded machine the flood can outlast the 6 s default, and a nudge
    // is TTS the assertions below would count as caused by a forgery.
    let stack = Stack::start(Opts {
        agent_extra: "idle_nudge_after_s = 0".into(),
        ..Opts::default()
    })
    .await;
    let mut calls = Vec::new();
    for _ in 0..LIVE {
        let (sid, sim) = stack.call().await;
        sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .unwrap();
        calls.push((sid, sim));
    }
    let app = &stack.server.app;
    let forbidden_before = app.metrics.webhooks_forbidden.load(Ordering::Relaxed);
    let stt_before = stack.dg.record().connections.len();
    let tts_before = stack.el.record().requests.len();

    let client = reqwest::Client::new();
    let started = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..3 * PER_CARRIER {
        let permit = slots.clone().acquire_owned().await.expect("semaphore");
        let (client, base) = (client.clone(), stack.base.clone());
        flood.spawn(async move {
            let status = forged(&client, &base, i).await;
            drop(permit);
            status
        });
    }
    let statuses: Vec<u16> = flood.join_all().await;
    let took = started.elapsed();
    let refused = statuses.iter().filter(|s| **s == 403).count();
    eprintln!(
        "flood: {} forged webhooks in {took:?} ({:.0}/s), {refused} refused with 403, {LIVE} calls live",
        statuses.len(),
        statuses.len() as f64 / took.as_secs_f64()
    );
    assert_eq!(refused, 3 * PER_CARRIER, "every forged webhook gets 403");
    assert_eq!(
        app.metrics.webhooks_forbidden.load(Ordering::Relaxed) - forbidden_before,
        (3 * PER_CARRIER) as u64,
        "every refusal is counted"
    );
    assert_eq!(
        stack.dg.record().connections.len(),
        stt_before,
        "no STT for a forgery"
    );
    assert_eq!(
        stack.el.record().requests.len(),
        tts_before,
        "no TTS for a forgery"
    );
    assert_eq!(app.calls.len(), LIVE, "no call admitted by a forgery");

    // The live calls go on: each caller speaks and gets a reply.
    for (_, sim) in &calls {
        speak(sim, 600);
    }
    for (_, sim) in &calls {
        sim.wait_for("reply after the flood", WAIT, |s| s.marks_echoed.len() >= 2)
            .await
            .unwrap();
        assert!(!sim.state().is_closed());
    }
    assert_eq!(stack.hermes.record().requests.len(), LIVE);
    for (_, sim) in &calls {
        sim.hang_up().await;
    }
    tokio::time::timeout(WAIT, app.calls.wait_empty())
        .await
        .expect("every call ends");
}
