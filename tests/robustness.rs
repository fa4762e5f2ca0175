//! Issue 11, holes 4 and 5, against the in-process stack: a Plivo webhook signed with V2 or
//! replaying a V3 nonce is refused (403) while the first use of a V3 signature is served; the
//! outbound caps hold under parallel originates (exactly `max_concurrent` dials reach the fake
//! carrier); an originate whose client goes away mid-dial leaves no carrier call behind and
//! gives its place back.

mod common;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::*;
use patterd::carrier::plivo::signature::compute_v3;
use patterd::sim::plivo::answer_params;
use serde_json::{Value, json};

async fn originate(base: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/calls"))
        .json(&body)
        .send()
        .await
        .expect("API request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The Plivo answer webhook: the first use of a V3 signature is served; the same request again
/// (same nonce) is a replay and refused; a V2-only signature — valid for Plivo's SDK, but
/// covering neither the body nor the query — is refused.
#[tokio::test]
async fn plivo_replayed_v3_and_v2_signatures_are_refused() {
    let stack = Stack::start(Opts::default()).await;
    let url = format!("{PUBLIC_URL}/plivo/answer");
    let params = answer_params("5b9a3a5e-0000-4000-8000-0000000000a1", CALLER, PLIVO_NUMBER);
    let nonce = "31582164297135082964";
    let sig = compute_v3(PLIVO_AUTH_TOKEN, "POST", &url, &params, nonce);
    let headers = [
        ("X-Plivo-Signature-V3", sig.as_str()),
        ("X-Plivo-Signature-V3-Nonce", nonce),
    ];
    let first = stack
        .plivo
        .post_with("/plivo/answer", &params, &headers)
        .await
        .expect("answer webhook");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains("<Stream"), "{first:?}");
    let forbidden_before = stack
        .server
        .app
        .metrics
        .webhooks_forbidden
        .load(std::sync::atomic::Ordering::Relaxed);

    let replay = stack
        .plivo
        .post_with("/plivo/answer", &params, &headers)
        .await
        .expect("replayed webhook");
    assert_eq!(
        replay.status, 403,
        "a replayed V3 nonce was served: {replay:?}"
    );
    // The replay also fails on another path (the hangup callback) with the same nonce.
    let hangup_url = format!("{PUBLIC_URL}/plivo/hangup");
    let hangup_sig = compute_v3(PLIVO_AUTH_TOKEN, "POST", &hangup_url, &params, nonce);
    let replay = stack
        .plivo
        .post_with(
            "/plivo/hangup",
            &params,
            &[
                ("X-Plivo-Signature-V3", hangup_sig.as_str()),
                ("X-Plivo-Signature-V3-Nonce", nonce),
            ],
        )
        .await
        .expect("replayed hangup");
    assert_eq!(replay.status, 403, "{replay:?}");

    // V2: HMAC-SHA256(auth token, URL without query + nonce), as Plivo's SDK builds it.
    let v2_params = answer_params("5b9a3a5e-0000-4000-8000-0000000000a2", CALLER, PLIVO_NUMBER);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, PLIVO_AUTH_TOKEN.as_bytes());
    let v2 = STANDARD.encode(ring::hmac::sign(&key, format!("{url}77777").as_bytes()));
    let v2_only = stack
        .plivo
        .post_with(
            "/plivo/answer",
            &v2_params,
            &[
                ("X-Plivo-Signature-V2", v2.as_str()),
                ("X-Plivo-Signature-V2-Nonce", "77777"),
            ],
        )
        .await
        .expect("V2 webhook");
    assert_eq!(
        v2_only.status, 403,
        "a V2 signature was accepted: {v2_only:?}"
    );
    let forbidden = stack
        .server
        .app
        .metrics
        .webhooks_forbidden
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(forbidden - forbidden_before, 3, "every refusal is counted");

    // A fresh V3 request still works.
    let fresh = stack
        .plivo
        .post(
            "/plivo/answer",
            &answer_params("5b9a3a5e-0000-4000-8000-0000000000a3", CALLER, PLIVO_NUMBER),
        )
        .await
        .expect("fresh webhook");
    assert_eq!(fresh.status, 200, "{fresh:?}");
}

/// Twenty parallel originates against `max_concurrent = 2`, with the carrier holding every
/// dial until all twenty requests have been decided: exactly two dials reach the fake Twilio
/// REST API, the other eighteen are refused with 429 `concurrent_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_originates_never_pass_max_concurrent() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        outbound_max_concurrent: 2,
        ..Opts::default()
    })
    .await;
    stack.rest.hold_dials(true);
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let base = stack.base.clone();
            tokio::spawn(async move {
                originate(&base, json!({"to": format!("+1555765{:04}", 4000 + i)})).await
            })
        })
        .collect();
    // Two dials are held at the carrier; every other request must be refused meanwhile.
    stack
        .rest
        .wait_for_dials_started(2, WAIT)
        .await
        .expect("two dials reach the carrier");
    let mut refused = 0;
    let mut pending = Vec::new();
    for r in requests {
        if r.is_finished() {
            let (s, v) = r.await.expect("request task");
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (429, Some("concurrent_limit")),
                "{v}"
            );
            refused += 1;
        } else {
            pending.push(r);
        }
    }
    // The held ones are the two dials (or requests refused a moment later): release and count.
    stack.rest.hold_dials(false);
    let mut placed = 0;
    for r in pending {
        let (s, v) = r.await.expect("request task");
        match s {
            201 => placed += 1,
            429 => refused += 1,
            _ => panic!("unexpected answer {s}: {v}"),
        }
    }
    assert_eq!((placed, refused), (2, 18));
    assert_eq!(stack.rest.dials_started(), 2, "dials at the carrier");
    assert_eq!(stack.rest.created().len(), 2);
    assert_eq!(stack.server.app.outbound_caps.pending(), 0);
}

/// The dial fails at the carrier (500): its place under `max_concurrent = 1` is given back.
#[tokio::test]
async fn a_failed_dial_gives_its_place_back() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        outbound_max_concurrent: 1,
        ..Opts::default()
    })
    .await;
    stack.rest.fail_with(Some(500));
    for _ in 0..3 {
        let (s, v) = originate(&stack.base, json!({"to": "+15557654321"})).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (502, Some("carrier_error")),
            "{v}"
        );
    }
    stack.rest.fail_with(None);
    let (s, v) = originate(&stack.base, json!({"to": "+15557654321"})).await;
    assert_eq!(s, 201, "{v}");
}

/// The client goes away while the carrier is dialling: the carrier still creates the call
/// (as a real one would), patterd cancels it there, records it as canceled, and the place
/// under `max_concurrent = 1` is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn originate_dropped_mid_dial_cancels_the_call_and_frees_its_place() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        outbound_max_concurrent: 1,
        ..Opts::default()
    })
    .await;
    stack.rest.hold_dials(true);
    let base = stack.base.clone();
    let client = tokio::spawn(async move { originate(&base, json!({"to": "+15557654321"})).await });
    stack
        .rest
        .wait_for_dials_started(1, WAIT)
        .await
        .expect("the dial reaches the carrier");
    // The client disconnects (its connection closes with the task).
    client.abort();
    let _ = client.await;
    stack.rest.hold_dials(false);
    let created = stack
        .rest
        .wait_for_created(1, WAIT)
        .await
        .expect("the carrier created the call");
    let sid = created[0].created_sid.clone().expect("sid");
    // patterd cancels the call it can no longer report to anyone.
    let cancelled = |reqs: &[patterd::sim::twilio::rest::RecordedRequest]| {
        reqs.iter().any(|r| {
            r.call_sid() == Some(sid.as_str())
                && r.form()
                    .iter()
                    .any(|(k, v)| k == "Status" && v == "canceled")
        })
    };
    let mut n = 2;
    loop {
        let reqs = stack
            .rest
            .wait_for_requests(n, WAIT)
            .await
            .unwrap_or_else(|seen| panic!("no cancel of the orphaned call {sid}: {seen:?}"));
        if cancelled(&reqs) {
            break;
        }
        n = reqs.len() + 1;
    }
    let app = &stack.server.app;
    assert_eq!(app.outbound_caps.pending(), 0, "leaked reservation");
    assert_eq!(app.outbound_live(), 0);
    assert!(
        app.calls.get(&sid).is_none(),
        "no actor for the abandoned call"
    );
    app.store.tx.flush().await.expect("flush");
    let row = app
        .store
        .call(&sid)
        .await
        .expect("store")
        .expect("the call is recorded");
    assert_eq!(row.status, "canceled");
    // The place is free: the next call goes through.
    let (s, v) = originate(&stack.base, json!({"to": "+15557654322"})).await;
    assert_eq!(s, 201, "{v}");
}
