//! What the instances share through the database, seen from outside: the outbound caps hold
//! across the cluster (30 parallel originates through the front against `max_concurrent = 5`
//! make exactly 5 dials), a webhook replayed to another instance is refused (the call id's
//! claim is the cluster-wide replay guard), and inbound overrides written on one instance are
//! in force on the others within a second (LISTEN/NOTIFY).

use std::time::{Duration, Instant};

use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::xml::parse_twiml;
use patterd_sim::twilio::{new_sid, voice_webhook_params};
use serde_json::{Value, json};

use crate::common::cluster::{ClusterSpec, TestCluster};
use crate::common::{ACCOUNT_SID, AUTH_TOKEN, CALLER, OUR_NUMBER, Opts, PUBLIC_URL, WAIT};

/// Thirty originates at once through the round-robin front (ten per instance) against
/// `max_concurrent = 5`, the carrier holding every dial until all are decided: exactly five
/// dials reach the fake Twilio REST API and the other 25 are refused `concurrent_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_originates_across_three_instances_make_exactly_five_dials() {
    let Some(cluster) = TestCluster::start(ClusterSpec {
        opts: Opts {
            allowed_destinations: vec!["+1555".into()],
            outbound_max_concurrent: 5,
            ..Opts::default()
        },
        ..ClusterSpec::default()
    })
    .await
    else {
        return;
    };
    let rest = &cluster.fakes.rest;
    rest.hold_dials(true);
    let api = cluster.api();
    let requests: Vec<_> = (0..30)
        .map(|i| {
            let api = api.clone();
            let url = cluster.shared("/v1/calls");
            tokio::spawn(async move {
                let r = api
                    .post(url)
                    .json(&json!({"to": format!("+1555765{:04}", 4000 + i)}))
                    .send()
                    .await
                    .expect("originate request");
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    rest.wait_for_dials_started(5, WAIT)
        .await
        .expect("five dials reach the carrier");
    // Every request not held at the carrier must be refused while the five are held.
    let deadline = Instant::now() + WAIT;
    while requests.iter().filter(|r| r.is_finished()).count() < 25 {
        assert!(Instant::now() < deadline, "25 refusals within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rest.hold_dials(false);
    let (mut placed, mut refused) = (0, 0);
    for r in requests {
        let (s, v) = r.await.expect("request task");
        match s {
            201 => placed += 1,
            429 => {
                assert_eq!(v["error"]["code"], "concurrent_limit", "{v}");
                refused += 1;
            }
            _ => panic!("unexpected answer {s}: {v}"),
        }
    }
    assert_eq!((placed, refused), (5, 25));
    assert_eq!(rest.dials_started(), 5, "dials at the carrier");
    assert_eq!(rest.created().len(), 5);
    // The five were placed by more than one instance (the front spread the requests), and
    // the database holds exactly their five slots.
    let owners = cluster
        .db
        .query("SELECT count(DISTINCT owner_id) FROM calls WHERE direction = 'outbound'");
    assert!(
        owners.trim().parse::<u32>().unwrap_or(0) >= 2,
        "owners: {owners}"
    );
    assert_eq!(
        cluster
            .db
            .query("SELECT count(*) FROM outbound_slots")
            .trim(),
        "5"
    );
}

/// A new-call webhook answered by one instance, replayed byte for byte (same signature) to
/// each other instance: refused there without a media stream, and the call still has one row
/// owned by the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_replayed_to_another_instance_is_refused() {
    let Some(cluster) = TestCluster::start(ClusterSpec::default()).await else {
        return;
    };
    let at = |i: usize| SimTwilio::new(&cluster.direct(i, ""), PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN);
    let call_sid = new_sid("CA");
    let params = voice_webhook_params(ACCOUNT_SID, &call_sid, CALLER, OUR_NUMBER);
    let first = at(0).post_form("/twilio/voice", &params).await.unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        parse_twiml(&first.body).unwrap().stream_url.is_some(),
        "the first delivery is answered with a stream: {}",
        first.body
    );
    for i in [1, 2, 0] {
        let again = at(i).post_form("/twilio/voice", &params).await.unwrap();
        let answer = parse_twiml(&again.body).unwrap();
        assert!(
            answer.stream_url.is_none(),
            "a replay to p{i} gets no stream: {}",
            again.body
        );
        assert!(again.body.contains("<Reject"), "{}", again.body);
    }
    let rows = cluster.db.query(&format!(
        "SELECT owner_id FROM calls WHERE call_id = '{call_sid}'"
    ));
    assert_eq!(rows.trim(), "p0");
}

/// `PUT /v1/inbound` on one instance: the two others serve the new override within a second,
/// and a call that lands on any instance is greeted with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_overrides_reach_every_instance_within_a_second() {
    let Some(cluster) = TestCluster::start(ClusterSpec::default()).await else {
        return;
    };
    let api = cluster.api();
    let r = api
        .put(cluster.direct(0, "/v1/inbound"))
        .json(&json!({"number": OUR_NUMBER, "firstMessage": "Welcome to the cluster."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let written = Instant::now();
    for i in [1, 2] {
        let url = cluster.direct(i, "/v1/inbound");
        cluster
            .eventually(&format!("p{i} serves the override"), WAIT, || {
                let api = api.clone();
                let url = url.clone();
                async move {
                    let v: Value = api.get(url).send().await.ok()?.json().await.ok()?;
                    let text = v.to_string();
                    text.contains("Welcome to the cluster.").then_some(())
                }
            })
            .await;
    }
    let took = written.elapsed();
    assert!(took < Duration::from_secs(1), "propagated in {took:?}");
    // Three calls through the front land on three instances; each is greeted the new way.
    let mut owners = Vec::new();
    for _ in 0..3 {
        let call = cluster.call().await;
        call.sim
            .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .unwrap();
        owners.push(call.owner);
        call.sim.hang_up().await;
    }
    owners.sort();
    owners.dedup();
    assert!(owners.len() >= 2, "calls spread: {owners:?}");
    let spoken = cluster.fakes.el.record().texts();
    assert_eq!(
        spoken
            .iter()
            .filter(|t| t.as_str() == "Welcome to the cluster.")
            .count(),
        3,
        "{spoken:?}"
    );
}
