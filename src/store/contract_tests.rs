//! The store's contract, run against every backend: SQLite always, PostgreSQL when a server is
//! available (`patterd_sim::postgres`: `PATTERD_TEST_DATABASE_URL`, or a throwaway server of
//! the machine's own binaries; `PATTERD_REQUIRE_POSTGRES=1` makes a missing one a failure).
//! Each scenario writes through the queue as call actors do and reads back through the same
//! API the REST handlers use, so both backends must give the same rows and figures.

use std::time::Duration;

use super::*;
use crate::call::{EventKind, Speaker, TranscriptEntry};
use patterd_sim::postgres::TestDatabase;

/// A store under test, with what keeps its files or database alive.
struct Under {
    name: &'static str,
    store: Store,
    _dir: tempfile::TempDir,
    db: Option<TestDatabase>,
}

fn sqlite() -> Under {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), 30, 64).expect("open sqlite");
    Under {
        name: "sqlite",
        store,
        _dir: dir,
        db: None,
    }
}

fn postgres(owner: &str) -> Option<Under> {
    if !cfg!(feature = "postgres") {
        eprintln!("SKIPPED: built without the `postgres` feature");
        return None;
    }
    let db = TestDatabase::create()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_postgres(&db.url, 2, owner, dir.path(), 30, 64).expect("open postgres");
    Some(Under {
        name: "postgres",
        store,
        _dir: dir,
        db: Some(db),
    })
}

/// Every backend this machine can run.
fn backends() -> Vec<Under> {
    let mut v = vec![sqlite()];
    v.extend(postgres("node-a"));
    v
}

fn new_call(id: &str, direction: &'static str, from: &str) -> Write {
    Write::Call(NewCall {
        call_id: id.into(),
        carrier: "twilio".into(),
        carrier_account: "twilio".into(),
        direction,
        from: from.into(),
        to: "+15550002222".into(),
        agent: "a".into(),
        status: "ringing".into(),
    })
}

fn entry(speaker: Speaker, text: &str, heard: &str, start_ms: u64) -> TranscriptEntry {
    TranscriptEntry {
        speaker,
        text: text.into(),
        heard_text: heard.into(),
        interrupted: heard.len() < text.len(),
        start_ms,
        end_ms: start_ms + 900,
    }
}

fn event(t_ms: u64, kind: EventKind, detail: &str) -> CallEvent {
    CallEvent {
        t_ms,
        kind,
        detail: detail.into(),
    }
}

/// One whole call, written as an actor writes it, with a turn updated as playback goes.
fn write_a_call(tx: &StoreTx, id: &str) {
    tx.send(new_call(id, "inbound", "+15550001111"));
    tx.answered(id);
    tx.event(id, &event(5, EventKind::GreetingFirstFrame, "120000"));
    tx.turn(
        id,
        0,
        &entry(Speaker::Agent, "Hello, how can I help?", "", 0),
    );
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
    tx.event(id, &event(3000, EventKind::Filler, ""));
    tx.reply_latency(id, 640_000);
    tx.turn(
        id,
        2,
        &entry(Speaker::Agent, "Sure, for how many people?", "Sure,", 3200),
    );
    tx.event(id, &event(4000, EventKind::LlmError, "timeout"));
    tx.send(Write::Cost {
        call_id: id.into(),
        cost: CallCost {
            total_usd: 0.25,
            stt_usd: 0.1,
            ..Default::default()
        },
    });
    tx.ended(id, &EndReason::CallerHungUp);
}

#[tokio::test]
async fn a_whole_call_reads_back_the_same_on_every_backend() {
    let mut seen = Vec::new();
    for u in backends() {
        write_a_call(&u.store.tx, "CA1");
        let row = u.store.call("CA1").await.expect("read").expect("row");
        assert_eq!(row.status, "completed", "{}", u.name);
        assert_eq!(row.outcome.as_deref(), Some("answered"), "{}", u.name);
        assert!(
            row.ended_at.is_some() && row.duration_ms.is_some(),
            "{}",
            u.name
        );
        assert_eq!(row.turns, 3, "{}", u.name);
        assert_eq!(row.cost_usd, Some(0.25), "{}", u.name);
        assert_eq!(
            row.cost.as_ref().map(|c| c.stt_usd),
            Some(0.1),
            "{}",
            u.name
        );
        let turns = u.store.turns("CA1").await.expect("turns");
        assert_eq!(turns.len(), 3, "{}", u.name);
        assert_eq!(turns[0].heard_text, "Hello, how can I help?", "{}", u.name);
        assert_eq!(turns[1].response_latency_ms, Some(640), "{}", u.name);
        assert!(turns[2].interrupted, "{}", u.name);
        let events = u.store.events("CA1").await.expect("events");
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["greeting_first_frame", "filler", "llm_error"],
            "{}",
            u.name
        );
        let m = u.store.metrics(Some("CA1")).await.expect("metrics");
        assert_eq!((m.calls, m.answered, m.turns), (1, 1, 3), "{}", u.name);
        assert_eq!((m.caller_turns, m.agent_turns), (1, 2), "{}", u.name);
        assert_eq!(
            (m.interruptions, m.fillers, m.llm_errors),
            (1, 1, 1),
            "{}",
            u.name
        );
        assert_eq!(m.response_latency_ms_p50, Some(640), "{}", u.name);
        assert_eq!(m.greeting_latency_ms_avg, Some(120.0), "{}", u.name);
        let all = u.store.metrics(None).await.expect("all metrics");
        assert_eq!(
            all, m,
            "{}: one call, so the totals are its figures",
            u.name
        );
        // What differs between backends is only when the rows were written.
        let mut row = row;
        row.created_at = 0;
        row.answered_at = None;
        row.ended_at = None;
        row.duration_ms = None;
        seen.push((u.name, row, turns, m));
    }
    for pair in seen.windows(2) {
        assert_eq!(
            pair[0].1, pair[1].1,
            "{} and {} differ",
            pair[0].0, pair[1].0
        );
        assert_eq!(pair[0].2, pair[1].2);
        assert_eq!(pair[0].3, pair[1].3);
    }
}

#[tokio::test]
async fn a_terminal_status_is_never_replaced_by_a_late_callback() {
    for u in backends() {
        let tx = &u.store.tx;
        tx.send(new_call("CA2", "outbound", "+15550003333"));
        let status = |s: &str| Write::Status {
            call_id: "CA2".into(),
            status: Some(s.into()),
            outcome: None,
            answered_by: None,
            carrier_duration_s: None,
        };
        tx.send(status("busy"));
        tx.send(status("in-progress"));
        tx.send(Write::Status {
            call_id: "CA2".into(),
            status: None,
            outcome: Some("busy".into()),
            answered_by: Some("human".into()),
            carrier_duration_s: Some(7),
        });
        let row = u.store.call("CA2").await.expect("read").expect("row");
        assert_eq!(row.status, "busy", "{}", u.name);
        assert_eq!(row.outcome.as_deref(), Some("busy"), "{}", u.name);
        assert_eq!(row.answered_by.as_deref(), Some("human"), "{}", u.name);
        assert_eq!(row.carrier_duration_s, Some(7), "{}", u.name);
        tx.ended("CA2", &EndReason::CallerHungUp);
        let row = u.store.call("CA2").await.expect("read").expect("row");
        assert_eq!(
            row.status, "busy",
            "{}: the end keeps a terminal status",
            u.name
        );
    }
}

#[tokio::test]
async fn listing_filters_and_orders_the_same_on_every_backend() {
    for u in backends() {
        let tx = &u.store.tx;
        for (i, dir) in ["inbound", "outbound", "inbound", "outbound"]
            .iter()
            .enumerate()
        {
            tx.send(new_call(&format!("L{i}"), dir, &format!("+1555000{i:04}")));
            // Distinct creation times, newest last.
            u.store.tx.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        tx.ended("L0", &EndReason::CallerHungUp);
        let ids = |rows: Vec<CallRow>| rows.into_iter().map(|r| r.call_id).collect::<Vec<_>>();
        let all = u
            .store
            .calls(CallFilter {
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(ids(all), ["L3", "L2", "L1", "L0"], "{}", u.name);
        let outbound = u
            .store
            .calls(CallFilter {
                direction: Some("outbound".into()),
                limit: 1,
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(ids(outbound), ["L3"], "{}", u.name);
        let by_number = u
            .store
            .calls(CallFilter {
                number: Some("+15550002222".into()),
                status: Some("failed".into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(
            ids(by_number),
            ["L0"],
            "{}: ended unanswered → failed",
            u.name
        );
        let since = u.store.outbound_since(0).await.expect("count");
        assert_eq!(since, 2, "{}", u.name);
        assert_eq!(
            u.store
                .outbound_since(now_ms() + 60_000)
                .await
                .expect("count"),
            0,
            "{}",
            u.name
        );
    }
}

#[tokio::test]
async fn settings_and_the_replay_lookup_read_what_was_written() {
    for u in backends() {
        let s = &u.store;
        assert_eq!(
            s.setting("inbound").await.expect("read"),
            None,
            "{}",
            u.name
        );
        s.tx.send(Write::Setting {
            key: "inbound".into(),
            value: "{\"a\":1}".into(),
        });
        s.tx.send(Write::Setting {
            key: "inbound".into(),
            value: "{\"a\":2}".into(),
        });
        s.tx.flush().await.expect("flush");
        assert_eq!(
            s.setting("inbound").await.expect("read").as_deref(),
            Some("{\"a\":2}"),
            "{}",
            u.name
        );
        assert_eq!(
            s.setting_blocking("inbound").expect("read").as_deref(),
            Some("{\"a\":2}"),
            "{}",
            u.name
        );
        s.tx.send(new_call("CA9", "inbound", "+15550001111"));
        s.tx.flush().await.expect("flush");
        assert!(s.has_call("CA9").await.expect("lookup"), "{}", u.name);
        assert!(!s.has_call("CA10").await.expect("lookup"), "{}", u.name);
    }
}

#[tokio::test]
async fn retention_prunes_old_calls_with_their_turns_and_keeps_recent_ones() {
    for u in backends() {
        write_a_call(&u.store.tx, "OLD");
        write_a_call(&u.store.tx, "RECENT");
        u.store.tx.flush().await.expect("flush");
        let old = now_ms() - 40 * 86_400_000;
        match (&u.db, u.name) {
            (Some(db), _) => {
                db.query(&format!(
                    "UPDATE calls SET created_at = {old} WHERE call_id = 'OLD'"
                ));
            }
            (None, _) => {
                let c = open_conn(&u._dir.path().join(DB_FILE)).expect("conn");
                c.execute(
                    "UPDATE calls SET created_at = ?1 WHERE call_id = 'OLD'",
                    [old],
                )
                .expect("age");
            }
        }
        let data_dir = u._dir.path().to_path_buf();
        drop(u.store);
        // Reopening prunes at start (retention 30 days).
        let store = match &u.db {
            Some(db) => Store::open_postgres(&db.url, 2, "node-a", &data_dir, 30, 64),
            None => Store::open(&data_dir, 30, 64),
        }
        .expect("reopen");
        store.tx.flush().await.expect("flush");
        // The prune runs as the writer starts: a flush is answered after it.
        assert!(
            store.call("OLD").await.expect("read").is_none(),
            "{}",
            u.name
        );
        assert!(
            store.call("RECENT").await.expect("read").is_some(),
            "{}",
            u.name
        );
        assert!(
            store.turns("OLD").await.expect("read").is_empty(),
            "{}",
            u.name
        );
    }
}

/// Only the calls this instance left open are closed at its start (when it registers in the
/// cluster, `app::cluster::members`); a live peer's stay open.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_restart_closes_its_own_open_calls_and_never_a_peers() {
    let Some(a) = postgres("node-a") else {
        return;
    };
    let db = a.db.as_ref().expect("db");
    let b = Store::open_postgres(&db.url, 2, "node-b", a._dir.path(), 30, 64).expect("node-b");
    a.store.tx.send(new_call("A1", "inbound", "+15550001111"));
    b.tx.send(new_call("B1", "inbound", "+15550001112"));
    a.store.tx.flush().await.expect("flush a");
    b.tx.flush().await.expect("flush b");
    drop(a.store);
    // node-a restarts: its previous incarnation's call is failed; node-b's is untouched.
    let again =
        Store::open_postgres(&db.url, 2, "node-a", a._dir.path(), 30, 64).expect("node-a again");
    let me = super::postgres::members::Me {
        name: "node-a",
        incarnation: "second",
        internal_url: "http://127.0.0.1:1",
        advertise_url: "http://127.0.0.1:1",
        version: "test",
        max_calls: 10,
    };
    let pool = again.pg_pool().expect("a pool");
    let done = super::postgres::members::register(&pool, &me)
        .await
        .expect("register");
    assert_eq!(done.calls.len(), 1);
    let a1 = again.call("A1").await.expect("read").expect("row");
    assert_eq!(a1.status, "failed");
    assert_eq!(
        a1.ended_reason.as_deref(),
        Some("instance node-a stopped before the call ended")
    );
    let b1 = again.call("B1").await.expect("read").expect("row");
    assert_eq!(b1.status, "ringing");
    assert!(b1.ended_at.is_none());
}

/// Three instances opening an empty database at once run the migration once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_starting_together_migrate_once() {
    if !cfg!(feature = "postgres") {
        return;
    }
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let url = db.url.clone();
    let opens: Vec<_> = ["n1", "n2", "n3"]
        .into_iter()
        .map(|name| {
            let (url, path) = (url.clone(), dir.path().to_path_buf());
            let handle = tokio::runtime::Handle::current();
            std::thread::spawn(move || {
                let _guard = handle.enter();
                Store::open_postgres(&url, 1, name, &path, 30, 16).map(drop)
            })
        })
        .collect();
    for o in opens {
        o.join().expect("thread").expect("open");
    }
    assert_eq!(
        db.query("SELECT COUNT(*) FROM _sqlx_migrations WHERE success"),
        MIGRATION_COUNT.to_string()
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM calls"), "0");
}

const MIGRATION_COUNT: usize = 5;

/// A database migrated by a newer patterd is refused with a message that says what to do.
#[tokio::test]
async fn a_newer_database_schema_refuses_to_open() {
    let Some(u) = postgres("node-a") else {
        return;
    };
    let db = u.db.as_ref().expect("db");
    db.query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99, 'from the future', TRUE, '\\x00', 0)",
    );
    drop(u.store);
    match Store::open_postgres(&db.url, 1, "node-a", u._dir.path(), 30, 16) {
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("newer than this patterd") && m.contains("store.url"),
                "{m}"
            );
        }
        Ok(_) => panic!("a newer schema was opened"),
    }
}

/// A store that cannot be reached at start is an error naming `store.url`, with no password.
#[tokio::test]
async fn an_unreachable_database_names_store_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    // Nothing listens on the port the listener just gave back.
    let url = format!("postgres://patterd:hunter2@127.0.0.1:{port}/calls?connect_timeout=2");
    let dir = tempfile::tempdir().expect("tempdir");
    match Store::open_postgres(&url, 1, "node-a", dir.path(), 30, 16) {
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("store.url") && m.contains("PostgreSQL"), "{m}");
            assert!(!m.contains("hunter2"), "the password leaked: {m}");
        }
        Ok(_) => panic!("opened a store nobody serves"),
    }
}

/// PostgreSQL drops the store's connections mid-run (a failover, a restart, an idle timeout):
/// the writer reconnects and retries the batch, nothing written is lost, and reads recover.
#[tokio::test]
async fn a_dropped_database_connection_loses_no_write() {
    let Some(u) = postgres("node-a") else {
        return;
    };
    let db = u.db.as_ref().expect("db");
    u.store
        .tx
        .send(new_call("BEFORE", "inbound", "+15550001111"));
    u.store.tx.flush().await.expect("flush");
    assert!(u.store.call("BEFORE").await.expect("read").is_some());
    let killed = db.query(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert_ne!(killed, "0", "the store had connections to drop");
    write_a_call(&u.store.tx, "AFTER");
    u.store.tx.flush().await.expect("flush after the drop");
    let row = u
        .store
        .call("AFTER")
        .await
        .expect("read after the drop")
        .expect("row");
    assert_eq!(row.status, "completed");
    assert_eq!(u.store.turns("AFTER").await.expect("turns").len(), 3);
    assert_eq!(u.store.events("AFTER").await.expect("events").len(), 3);
    assert_eq!(
        u.store.stats.failed(),
        0,
        "the batch was retried, not given up"
    );
}

mod outbox;
