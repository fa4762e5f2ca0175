//! The call store under the writes of many live calls, SQLite and PostgreSQL side by side in one
//! run: `CALLS` calls (default 1,000) write for `SECS` seconds (default 30) through the store's
//! queue as call actors do, on a modelled pattern per call and 10 s exchange — one caller turn,
//! eight timeline events, the agent's turn written three times as its heard text grows, one
//! reply latency — that is 78 writes per call-minute, plus the call's row, answer, end and cost.
//! Every 100 ms a flush measures how long a write takes to be committed (queue, linger, commit).
//! Reports per backend: writes per second, batches and rows per batch, commit time quantiles
//! (bucket bounds of `patterd_store_commit_seconds`), write→committed p50/p99, writes dropped,
//! and this process's CPU (a PostgreSQL server's own CPU is in its processes, not counted here).
//! PostgreSQL comes from `patterd_sim::postgres` (`PATTERD_TEST_DATABASE_URL`, or a throwaway
//! server of the machine's binaries, fsync off — say so when quoting). Run with
//! `cargo bench --bench store` (`CALLS=N SECS=S` to change the load). A last row splits the same
//! calls over `WRITERS` stores (default 3) on the one PostgreSQL database, writing at once, as the
//! instances of a cluster do; its commit figures are the worst writer's.

use std::time::{Duration, Instant};

use patterd::call::{CallEvent, EndReason, EventKind, Speaker, TranscriptEntry};
use patterd::store::{NewCall, Store, Write};
use patterd_sim::postgres::TestDatabase;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15 (11 and 12 after the name), in clock ticks.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn entry(speaker: Speaker, text: &str, heard: &str, start_ms: u64) -> TranscriptEntry {
    TranscriptEntry {
        speaker,
        text: text.into(),
        heard_text: heard.into(),
        interrupted: false,
        start_ms,
        end_ms: start_ms + 1500,
    }
}

const EVENTS: [EventKind; 8] = [
    EventKind::SpeechStart,
    EventKind::SpeechEnd,
    EventKind::FinalizeSent,
    EventKind::TurnEnd,
    EventKind::LlmRequest,
    EventKind::TtsFirstByte,
    EventKind::MarkPlayed,
    EventKind::Heard,
];

struct Figures {
    writes: u64,
    secs: f64,
    batches: u64,
    rows: u64,
    commit_p50: Option<f64>,
    commit_p99: Option<f64>,
    durable: Vec<Duration>,
    dropped: u64,
    cpu: f64,
}

/// One exchange of call `i` at second `t` (every 10 s of its life).
fn exchange(store: &Store, id: &str, t: u64) -> u64 {
    let tx = &store.tx;
    let ms = t * 1000;
    let seq = (t / 10) as usize * 2;
    tx.turn(
        id,
        seq + 1,
        &entry(Speaker::Caller, "I'd like to book a table", "", ms),
    );
    for (k, kind) in EVENTS.iter().enumerate() {
        tx.event(
            id,
            &CallEvent {
                t_ms: ms + k as u64 * 100,
                kind: *kind,
                detail: "voiced_ms=640 p=0.93".into(),
            },
        );
    }
    let reply = "Of course, for how many people and at what time?";
    for heard in [&reply[..9], &reply[..32], reply] {
        tx.turn(id, seq + 2, &entry(Speaker::Agent, reply, heard, ms + 2000));
    }
    tx.send(Write::ReplyLatency {
        call_id: id.to_string(),
        latency_us: 640_000,
    });
    13
}

async fn run(store: Store, prefix: &str, calls: u64, secs: u64) -> Figures {
    let ids: Vec<String> = (0..calls).map(|i| format!("CA{prefix}{i:08}")).collect();
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut writes = 0u64;
    for id in &ids {
        store.tx.send(Write::Call(NewCall {
            call_id: id.clone(),
            carrier: "twilio".into(),
            carrier_account: "twilio".into(),
            direction: "inbound",
            from: "+15550001111".into(),
            to: "+15550002222".into(),
            agent: "bench".into(),
            status: "ringing".into(),
        }));
        store.tx.answered(id);
        writes += 2;
    }
    // Each call's exchanges start at its own offset within the 10 s cycle, so the load is even.
    let mut durable = Vec::new();
    let tick = Duration::from_millis(100);
    let ticks = secs * 10;
    for n in 0..ticks {
        let due = start + tick * n as u32;
        tokio::time::sleep_until(due.into()).await;
        let slot = n % 100;
        for (i, id) in ids.iter().enumerate() {
            if i as u64 % 100 == slot {
                writes += exchange(&store, id, n / 10);
            }
        }
        let asked = Instant::now();
        if store.tx.flush().await.is_ok() {
            durable.push(asked.elapsed());
        }
    }
    for id in &ids {
        store.tx.ended(id, &EndReason::CallerHungUp);
        writes += 1;
    }
    let _ = store.tx.flush().await;
    let elapsed = start.elapsed().as_secs_f64();
    Figures {
        writes,
        secs: elapsed,
        batches: store.stats.batches(),
        rows: store.stats.rows(),
        commit_p50: store.stats.commit_quantile(0.5),
        commit_p99: store.stats.commit_quantile(0.99),
        durable,
        dropped: store.tx.dropped(),
        cpu: cpu_seconds() - cpu0,
    }
}

/// Opens a fresh store of one backend.
type Opener<'a> = Box<dyn Fn() -> Store + 'a>;

fn show(v: Option<f64>) -> String {
    match v {
        Some(s) if s.is_finite() => format!("≤ {:.1} ms", s * 1000.0),
        Some(_) => "> 10 s".into(),
        None => "-".into(),
    }
}

fn main() {
    let calls = env_or("CALLS", 1000);
    let secs = env_or("SECS", 30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "store bench: {calls} calls writing for {secs} s (78 writes per call-minute, modelled)\n"
    );
    println!(
        "| backend | writes/s | batches | rows/batch | commit p50 | commit p99 | write→committed p50 | p99 | dropped | CPU of this process |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDatabase::create();
    let mut backends: Vec<(&str, Opener<'_>)> = vec![(
        "sqlite",
        Box::new(|| Store::open(&dir.path().join("sqlite"), 0, 4096).expect("sqlite")),
    )];
    if let Some(db) = &db {
        let url = db.url.clone();
        let path = dir.path().join("pg");
        backends.push((
            "postgres",
            Box::new(move || {
                Store::open_postgres(&url, 4, "bench", &path, 0, 4096).expect("postgres")
            }),
        ));
    }
    for (name, open) in backends {
        let f = rt.block_on(async { run(open(), "", calls, secs).await });
        print_row(name, f);
    }
    let writers = env_or("WRITERS", 3).max(1);
    if let Some(db) = &db {
        // The PostgreSQL store opens its pool on the runtime it will run on.
        let _runtime = rt.enter();
        let stores: Vec<Store> = (0..writers)
            .map(|w| {
                let path = dir.path().join(format!("pg-writer-{w}"));
                Store::open_postgres(&db.url, 4, &format!("bench-{w}"), &path, 0, 4096)
                    .expect("postgres")
            })
            .collect();
        let per = calls / writers;
        let all = rt.block_on(async {
            let runs = stores.into_iter().enumerate().map(|(w, store)| {
                tokio::spawn(async move { run(store, &format!("W{w}"), per, secs).await })
            });
            let mut out = Vec::new();
            for r in runs.collect::<Vec<_>>() {
                out.push(r.await.expect("writer task"));
            }
            out
        });
        let worst = |pick: fn(&Figures) -> Option<f64>| {
            all.iter()
                .filter_map(pick)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let merged = Figures {
            writes: all.iter().map(|f| f.writes).sum(),
            secs: all.iter().map(|f| f.secs).fold(0.0, f64::max),
            batches: all.iter().map(|f| f.batches).sum(),
            rows: all.iter().map(|f| f.rows).sum(),
            commit_p50: worst(|f| f.commit_p50),
            commit_p99: worst(|f| f.commit_p99),
            durable: all.iter().flat_map(|f| f.durable.iter().copied()).collect(),
            dropped: all.iter().map(|f| f.dropped).sum(),
            cpu: all.iter().map(|f| f.cpu).fold(0.0, f64::max),
        };
        print_row(
            &format!("postgres, {writers} writers × {per} calls (a cluster)"),
            merged,
        );
    }
}

fn print_row(name: &str, mut f: Figures) {
    f.durable.sort();
    let q = |p: f64| {
        f.durable
            .get(((f.durable.len() as f64 * p) as usize).min(f.durable.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "| {name} | {:.0} | {} | {:.1} | {} | {} | {:.1} ms | {:.1} ms | {} | {:.2} s ({:.1} % of a core) |",
        f.writes as f64 / f.secs,
        f.batches,
        f.rows as f64 / f.batches.max(1) as f64,
        show(f.commit_p50),
        show(f.commit_p99),
        q(0.5).as_secs_f64() * 1000.0,
        q(0.99).as_secs_f64() * 1000.0,
        f.dropped,
        f.cpu,
        100.0 * f.cpu / f.secs
    );
}
