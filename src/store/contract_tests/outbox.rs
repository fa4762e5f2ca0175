//! The webhook outbox's contract on every backend: a call's `call.ended` row commits with its
//! end and reports the call as ended (cost, transcript, latencies); claims, leases and settling;
//! the dead-letter list; and, on PostgreSQL, N instances claiming one outbox without taking a
//! row twice.

use serde_json::Value;

use super::*;
use crate::config::WebhookEvent;
use crate::store::outbox::{OutboxBody, OutboxEvent, new_id};

const URL: &str = "https://hooks.example.test/patterd";

fn event(call_id: &str, event: WebhookEvent, body: OutboxBody) -> OutboxEvent {
    OutboxEvent {
        id: new_id(),
        url: URL.into(),
        event,
        call_id: call_id.into(),
        at: 1_700_000_000_000,
        body,
        held: false,
    }
}

/// [`write_a_call`] with a `call.started` row and the end's `call.ended`.
fn write_a_reported_call(tx: &StoreTx, id: &str) -> String {
    let started = event(
        id,
        WebhookEvent::CallStarted,
        OutboxBody::Ready("{\"s\":1}".into()),
    );
    let ended = event(id, WebhookEvent::CallEnded, OutboxBody::CallEnded);
    let ended_id = ended.id.clone();
    // The whole call but its end, then the end with its event.
    tx.send(new_call(id, "inbound", "+15550001111"));
    tx.answered(id);
    tx.outbox(vec![started]);
    tx.turn(
        id,
        0,
        &entry(
            Speaker::Agent,
            "Hello, how can I help?",
            "Hello, how can I help?",
            0,
        ),
    );
    tx.turn(
        id,
        1,
        &entry(Speaker::Caller, "book a table", "book a table", 2000),
    );
    tx.reply_latency(id, 640_000);
    tx.send(Write::Cost {
        call_id: id.into(),
        cost: CallCost {
            total_usd: 0.25,
            ..Default::default()
        },
    });
    tx.ended_with(id, &EndReason::CallerHungUp, vec![ended]);
    ended_id
}

#[tokio::test]
async fn call_ended_commits_with_the_end_and_reports_the_call_as_ended() {
    for u in backends() {
        let ended_id = write_a_reported_call(&u.store.tx, "CA1");
        u.store.tx.flush().await.expect("flush");
        let rows = u.store.outbox_claim("me", 10, 60_000).await.expect("claim");
        assert_eq!(rows.len(), 2, "{}", u.name);
        let ended = rows
            .iter()
            .find(|r| r.id == ended_id)
            .expect("call.ended row");
        assert_eq!(
            (ended.event.as_str(), ended.url.as_str()),
            ("call.ended", URL)
        );
        assert_eq!(ended.attempts, 0);
        let v: Value = serde_json::from_str(&ended.body).expect("json body");
        assert_eq!(v["type"], "call.ended", "{}", u.name);
        let call = &v["data"]["call"];
        let ended_at = call["ended_at"].as_i64().expect("ended_at");
        assert_eq!(
            v["timestamp"],
            crate::util::time::rfc3339_ms(ended_at),
            "{}: the event happened when the call ended",
            u.name
        );
        assert_eq!(call["call_id"], "CA1");
        assert_eq!(call["status"], "completed", "{}: the end is in", u.name);
        assert_eq!(call["ended_reason"], "caller hung up");
        assert_eq!(
            call["cost_usd"], 0.25,
            "{}: the cost queued before the end is in",
            u.name
        );
        assert_eq!(v["data"]["transcript"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["data"]["transcript"][1]["response_latency_ms"], 640);
        assert_eq!(v["data"]["latency"]["p50_ms"], 640, "{}", u.name);
        let started = rows
            .iter()
            .find(|r| r.id != ended_id)
            .expect("call.started row");
        assert_eq!(started.body, "{\"s\":1}");
    }
}

#[tokio::test]
async fn claims_lease_settle_and_dead_letter_the_same_on_every_backend() {
    for u in backends() {
        let s = &u.store;
        let e = event(
            "CA9",
            WebhookEvent::CallStarted,
            OutboxBody::Ready("{}".into()),
        );
        let id = e.id.clone();
        s.tx.outbox(vec![e]);
        s.tx.flush().await.expect("flush");
        let counts = s.outbox_counts().await.expect("counts");
        assert_eq!((counts.pending, counts.dead), (1, 0), "{}", u.name);

        let a = s.outbox_claim("a", 5, 60_000).await.expect("claim");
        assert_eq!(a.len(), 1, "{}", u.name);
        assert!(
            s.outbox_claim("b", 5, 60_000)
                .await
                .expect("claim")
                .is_empty(),
            "{}: a leased row is nobody else's",
            u.name
        );
        // Not b's to settle.
        let retry = Settle::Retry {
            status: Some(500),
            error: "it answered HTTP 500".into(),
            delay_ms: 0,
        };
        assert!(
            !s.outbox_settle("b", &id, retry.clone())
                .await
                .expect("settle")
        );
        assert!(
            s.outbox_settle("a", &id, retry).await.expect("settle"),
            "{}",
            u.name
        );
        let d = s.outbox_get(&id).await.expect("get").expect("row");
        assert_eq!(
            (d.state.as_str(), d.attempts, d.last_status),
            ("pending", 1, Some(500))
        );
        assert_eq!(d.last_error.as_deref(), Some("it answered HTTP 500"));
        assert!(d.next_attempt_at.is_some());

        // A lease that ran out (0 ms) is taken again; the first holder's settle is refused.
        let a = s.outbox_claim("a", 5, 0).await.expect("claim");
        assert_eq!((a.len(), a[0].attempts), (1, 1), "{}", u.name);
        let b = s.outbox_claim("b", 5, 60_000).await.expect("claim");
        assert_eq!(b.len(), 1, "{}: the expired lease is b's now", u.name);
        let dead = Settle::Dead {
            status: Some(410),
            error: "it answered 410 Gone".into(),
            attempted: true,
        };
        assert!(
            !s.outbox_settle("a", &id, dead.clone())
                .await
                .expect("settle")
        );
        assert!(s.outbox_settle("b", &id, dead).await.expect("settle"));
        let listed = s.outbox_list(Some("dead".into()), 10).await.expect("list");
        assert_eq!(listed.len(), 1, "{}", u.name);
        assert_eq!((listed[0].attempts, listed[0].next_attempt_at), (2, None));
        assert!(listed[0].done_at.is_some());
        assert_eq!(s.outbox_counts().await.expect("counts").dead, 1);
        assert!(
            s.outbox_claim("a", 5, 60_000)
                .await
                .expect("claim")
                .is_empty()
        );

        // A dead letter retried by hand is due at once; delivered, it is done.
        assert!(s.outbox_retry(&id).await.expect("retry"), "{}", u.name);
        assert!(
            !s.outbox_retry(&id).await.expect("retry"),
            "only a dead one"
        );
        let again = s.outbox_claim("a", 5, 60_000).await.expect("claim");
        assert_eq!(again.len(), 1, "{}", u.name);
        assert!(
            s.outbox_settle("a", &id, Settle::Delivered { status: 204 })
                .await
                .expect("settle")
        );
        let d = s.outbox_get(&id).await.expect("get").expect("row");
        assert_eq!(
            (d.state.as_str(), d.attempts, d.last_status),
            ("delivered", 3, Some(204))
        );
        assert_eq!(
            s.outbox_counts().await.expect("counts"),
            OutboxCounts::default()
        );
        assert!(
            s.outbox_claim("a", 5, 60_000)
                .await
                .expect("claim")
                .is_empty()
        );
        assert!(s.outbox_get("msg_none").await.expect("get").is_none());
        let all = s.outbox_list(None, 10).await.expect("list");
        assert_eq!(all.len(), 1, "{}", u.name);
    }
}

/// Claims until nothing is due, as one instance's worker would.
async fn drain(s: &Store, owner: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let rows = s.outbox_claim(owner, 4, 60_000).await.expect("claim");
        if rows.is_empty() {
            return got;
        }
        got.extend(rows.into_iter().map(|r| r.id));
    }
}

/// Three instances drain one outbox at once: each row is claimed by exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn instances_never_claim_one_row_twice() {
    let Some(u) = postgres("n1") else {
        return;
    };
    let db = u.db.as_ref().expect("db");
    let events: Vec<OutboxEvent> = (0..60)
        .map(|i| {
            event(
                &format!("C{i}"),
                WebhookEvent::TurnCompleted,
                OutboxBody::Ready("{}".into()),
            )
        })
        .collect();
    u.store.tx.outbox(events);
    u.store.tx.flush().await.expect("flush");
    let others: Vec<Store> = ["n2", "n3"]
        .iter()
        .map(|n| Store::open_postgres(&db.url, 2, n, u._dir.path(), 30, 16).expect("open"))
        .collect();
    let (a, b, c) = tokio::join!(
        drain(&u.store, "n1"),
        drain(&others[0], "n2"),
        drain(&others[1], "n3")
    );
    let mut all: Vec<String> = a.iter().chain(&b).chain(&c).cloned().collect();
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(
        (total, all.len()),
        (60, 60),
        "claimed {} {} {}",
        a.len(),
        b.len(),
        c.len()
    );
}

/// A `call.ended` held for the call's summary is not delivered until the summary is stored;
/// then it goes, made again with the summary in it. One whose summary never comes is released
/// as it is.
#[tokio::test]
async fn a_held_call_ended_goes_once_the_summary_is_stored() {
    for u in backends() {
        let s = &u.store;
        for id in ["CA5", "CA6"] {
            s.tx.send(new_call(id, "inbound", "+15550001111"));
            s.tx.answered(id);
            let mut ended = event(id, WebhookEvent::CallEnded, OutboxBody::CallEnded);
            ended.held = true;
            s.tx.ended_with(id, &EndReason::CallerHungUp, vec![ended]);
        }
        s.tx.flush().await.expect("flush");
        assert!(
            s.outbox_claim("a", 5, 60_000)
                .await
                .expect("claim")
                .is_empty(),
            "{}",
            u.name
        );
        assert_eq!(
            s.outbox_counts().await.expect("counts").held,
            2,
            "{}",
            u.name
        );

        s.tx.summary(
            "CA5",
            serde_json::json!({"text": "A short call.", "error": null}),
        );
        s.tx.flush().await.expect("flush");
        let rows = s.outbox_claim("a", 5, 60_000).await.expect("claim");
        assert_eq!(rows.len(), 1, "{}", u.name);
        let v: Value = serde_json::from_str(&rows[0].body).expect("json");
        assert_eq!(
            v["data"]["call"]["summary"]["text"], "A short call.",
            "{}",
            u.name
        );
        let call = s.call("CA5").await.expect("read").expect("row");
        assert_eq!(
            call.summary,
            Some(serde_json::json!({"text": "A short call.", "error": null}))
        );

        // CA6's summary never comes: released without it.
        assert_eq!(
            s.outbox_release_stale(-60_000).await.expect("release"),
            1,
            "{}",
            u.name
        );
        let rows = s.outbox_claim("a", 5, 60_000).await.expect("claim");
        assert_eq!(rows.len(), 1, "{}", u.name);
        assert_eq!(rows[0].call_id, "CA6");
        assert_eq!(s.outbox_counts().await.expect("counts").held, 0);
    }
}
