//! The outbound caps under a race , against the in-process stack: twenty
//! parallel originates against `max_concurrent = 2` make exactly two dials at the fake Twilio
//! REST API; a failed dial gives its place back; an originate whose client goes away mid-dial
//! leaves no carrier call behind (it is cancelled there) and no reservation.

use patterd_sim::twilio::rest::RecordedRequest;
use serde_json::{Value, json};

use crate::common::*;

async fn originate(base: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/calls"))
        .bearer_auth(API_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("API request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
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
    // The client disconnects (its connection closes with the task); the dial is released
    // once patterd has seen the request go.
    let mut waiting = stack.server.app.outbound_caps.requests_waiting();
    assert_eq!(*waiting.borrow(), 1, "the request waits for its dial");
    client.abort();
    let _ = client.await;
    tokio::time::timeout(WAIT, waiting.wait_for(|n| *n == 0))
        .await
        .expect("patterd notices the client went away")
        .expect("caps alive");
    stack.rest.hold_dials(false);
    let created = stack
        .rest
        .wait_for_created(1, WAIT)
        .await
        .expect("the carrier created the call");
    let sid = created[0].created_sid.clone().expect("sid");
    // patterd cancels the call it can no longer report to anyone.
    let cancelled = |reqs: &[RecordedRequest]| {
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
