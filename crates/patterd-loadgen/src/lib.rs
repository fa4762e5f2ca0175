//! The load generator behind `patterd-loadgen`: it starts the fake Deepgram,
//! ElevenLabs, Hermes and Twilio REST in its own process with zero added latency, writes a
//! config, spawns the server under test as a separate process (a patterd binary, or any
//! command that serves Twilio webhooks against the fakes), measures its cold start (spawn →
//! `/healthz` 200), then ramps N simulated Twilio callers ([`caller`]) in at a fixed rate and
//! keeps them all talking for a hold period. Per turn it measures end of the caller's speech →
//! first reply frame, and fake Deepgram's `speech_final` sent → first reply frame (the latency
//! the server adds); per utterance, late frames; for the server process, CPU seconds and RSS
//! from `/proc` ([`procfs`]) at idle, at peak and after the calls. The callers run in a few
//! [`shard`] tasks (hundreds of callers each, one timer per shard); the fakes run on their own
//! runtime (threads named `lg-fakes`) so that the load generator's own CPU splits into the
//! callers' and the fakes' share. One run per N; the result is JSON plus a markdown table
//! ([`report`]).

pub mod caller;
pub mod cluster;
pub mod flood;
pub mod http;
mod process;
pub mod procfs;
pub mod report;
pub mod shard;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use caller::{CallCtx, CallPlan, CallResult, SpeechClip};
pub use http::{http_get, http_status};
use patterd_sim::deepgram::{FakeDeepgram, FakeDeepgramConfig};
use patterd_sim::elevenlabs::{FakeElevenLabs, FakeElevenLabsConfig};
use patterd_sim::hermes::FakeHermes;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::rest::FakeTwilioRest;
use process::{spawn_server, spawn_server_with, start_fakes};
use report::{FloodReport, OwnShare, ProviderCounts, Quantiles, RunReport, ServerStats};
use shard::ShardMsg;

pub const ACCOUNT_SID: &str = "AC00000000000000000000000000000b07";
pub const AUTH_TOKEN: &str = "loadgen-auth-token";
pub const PUBLIC_URL: &str = "https://voice.loadgen.test";
pub const OUR_NUMBER: &str = "+15550001234";
pub const DG_KEY: &str = "dg-loadgen-key";
pub const EL_KEY: &str = "el-loadgen-key";
pub const HERMES_KEY: &str = "hermes-loadgen-key";
/// patterd's `[server] api_token` in the generated config (`/metrics` needs it).
pub const API_TOKEN: &str = "loadgen-api-token-0123456789abcdef";
/// What the fake Deepgram "hears" each turn; the fake Hermes echoes it as the reply.
pub const CALLER_SAYS: &str =
    "I would like to book a table for two tomorrow evening. Is that possible?";

/// The server under test.
#[derive(Debug, Clone)]
pub enum Target {
    /// A patterd binary: the load generator writes its config.
    Patterd { bin: PathBuf },
    /// Any other server: run through `sh -c`, told the fakes' URLs through `BENCH_*`
    /// environment variables (see docs/BENCHMARKS.md).
    Command { shell: String },
}

/// One load run's settings.
#[derive(Debug, Clone)]
pub struct Options {
    pub label: String,
    pub target: Target,
    pub calls: usize,
    /// Calls started per second.
    pub rate: f64,
    /// How long all calls stay up after the last one started.
    pub hold: Duration,
    pub speech_ms: u64,
    /// The caller's line noise while it is quiet (dBFS); `None`: the call's tag over digital
    /// silence in every quiet frame (rounds 1–4 of docs/BENCHMARKS.md).
    pub line_noise_dbfs: Option<f32>,
    pub pause: Duration,
    pub barge_in: bool,
    /// Webhook path on the server.
    pub voice_path: String,
    /// Health path polled for the cold start (answers 200 when ready).
    pub health_path: String,
    /// Keep the server's log here (else a temporary directory).
    pub log_dir: Option<PathBuf>,
    /// Pin the server to these CPUs (a `taskset -c` list such as `0`).
    pub server_cpus: Option<String>,
    /// Floods sent while the calls talk (none by default).
    pub flood: flood::FloodPlan,
    /// The floods start this long after the last call started; the figures "before" are
    /// taken from the last call's start to then.
    pub flood_after: Duration,
    /// Caller shards (tasks driving many callers each); 0 picks one per 250 calls, at least
    /// two per core.
    pub shards: usize,
    /// The fakes' one thread wakes at most once per this period ([`batch_wakeups`]); zero
    /// wakes it on every event.
    pub fakes_batch: Duration,
}

/// The thread-name prefix of the fakes' runtime (its CPU is reported apart from the callers').
pub const FAKES_THREAD: &str = "lg-fakes";

/// How many shards drive `calls` callers when `asked` is 0.
pub fn shard_count(asked: usize, calls: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let n = if asked > 0 {
        asked
    } else {
        (2 * cores).max(calls.div_ceil(250))
    };
    n.clamp(1, calls.max(1))
}

/// The fakes' runtime, shut down without blocking when dropped (it may be dropped inside the
/// callers' runtime).
struct FakesRuntime(Option<tokio::runtime::Runtime>);

impl Drop for FakesRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Makes a one-thread runtime handle its events in batches: the task sleeps the thread for
/// `period`, then yields, so the worker polls its I/O driver without blocking, runs every
/// task that became ready meanwhile, and comes back here. The thread then wakes about once
/// per period instead of once per socket event (at 200 calls the fake Deepgram alone woke
/// its thread ≈ 2,700 times a second, each wake-up a context switch costing more than the
/// work it carried). Each event waits at most `period` longer; the fakes' protocol is
/// unchanged, and their timestamps (a `speech_final`'s send time) are taken when they act.
/// Only for a runtime with one worker thread, whose every task may wait `period`.
pub async fn batch_wakeups(period: Duration) {
    loop {
        // Blocking on purpose: this is the only thread of the fakes' runtime, and nothing
        // else is due on it until the events it is batching arrive.
        std::thread::sleep(period);
        tokio::task::yield_now().await;
    }
}

/// CPU seconds of this process so far: (all threads, the fakes' threads).
fn own_cpu() -> Option<(f64, f64)> {
    let all = procfs::cpu_seconds("self")?;
    let fakes = procfs::thread_cpu_seconds("self", FAKES_THREAD).unwrap_or(0.0);
    Some((all, fakes))
}

const MIB: f64 = 1024.0;

/// What every caller of a run shares: webhooks to `http_base`, media to `ws_base` (empty:
/// where each TwiML answer says).
fn call_ctx(opts: &Options, http_base: &str, ws_base: String) -> Arc<CallCtx> {
    Arc::new(CallCtx {
        twilio: SimTwilio::new(http_base, PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN),
        ws_base,
        to: OUR_NUMBER.into(),
        voice_path: opts.voice_path.clone(),
        speech: SpeechClip::tone(opts.speech_ms),
        line_noise: opts
            .line_noise_dbfs
            .map(|db| caller::line_noise(db, 50))
            .unwrap_or_default(),
        pause: opts.pause,
        reply_timeout: Duration::from_secs(10),
        barge_in: opts.barge_in,
    })
}

/// Runs `n` calls (call i starts at `t0 + i · step`, all stop taking turns at `end_at`) on
/// `shards` shard tasks: call i goes to shard i % shards as its slot i / shards. Returns every
/// call's result (connected or not), in no particular order.
pub async fn drive_calls(
    ctx: Arc<CallCtx>,
    n: usize,
    shards: usize,
    t0: Instant,
    step: Duration,
    end_at: Instant,
) -> Result<Vec<CallResult>, String> {
    let shards = shards.clamp(1, n.max(1));
    let mut shard_tx = Vec::with_capacity(shards);
    let mut shard_tasks = Vec::with_capacity(shards);
    for s in 0..shards {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ShardMsg>();
        let expected = n.saturating_sub(s).div_ceil(shards);
        shard_tasks.push(tokio::spawn(shard::run(rx, expected, t0)));
        shard_tx.push(tx);
    }
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let plan = CallPlan {
            idx: i as u32,
            start_at: t0 + step * i as u32,
            end_at,
        };
        let slot = (i / shards) as u32;
        set.spawn(caller::connect_call(
            ctx.clone(),
            plan,
            slot,
            shard_tx[i % shards].clone(),
        ));
    }
    drop(shard_tx);
    while set.join_next().await.is_some() {}
    let mut results = Vec::with_capacity(n);
    for t in shard_tasks {
        results.extend(t.await.map_err(|e| format!("a caller shard failed: {e}"))?);
    }
    Ok(results)
}

/// One load run at `opts.calls` concurrent calls.
pub async fn run(opts: &Options) -> Result<RunReport, String> {
    patterd::util::init_tls();
    let loadavg_start = procfs::loadavg();
    let fakes_rt = FakesRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            // One thread: no wake-ups between workers, and [`batch_wakeups`] can batch.
            .worker_threads(1)
            .thread_name(FAKES_THREAD)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the fakes' runtime: {e}"))?,
    ));
    let fakes = match &fakes_rt.0 {
        Some(rt) => {
            if !opts.fakes_batch.is_zero() {
                rt.spawn(batch_wakeups(opts.fakes_batch));
            }
            rt.spawn(start_fakes()).await.map_err(|e| e.to_string())?
        }
        None => return Err("no runtime for the fakes".into()),
    }
    .map_err(|e| e.to_string())?;
    let server = spawn_server(opts, &fakes)?;
    let pid = server.child.id().to_string();
    // Let it settle, then read the idle figures.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = procfs::mem(&pid).unwrap_or_default();
    let cpu0 = procfs::cpu_seconds(&pid).unwrap_or(0.0);
    let own_cpu0 = procfs::cpu_seconds("self").unwrap_or(0.0);
    let fakes_cpu0 = procfs::thread_cpu_seconds("self", FAKES_THREAD).unwrap_or(0.0);

    let ctx = call_ctx(
        opts,
        &format!("http://{}", server.addr),
        format!("ws://{}", server.addr),
    );
    let t0 = Instant::now() + Duration::from_millis(50);
    let n = opts.calls.max(1);
    let step = Duration::from_secs_f64(1.0 / opts.rate.max(0.1));
    let ramp_end = t0 + step * (n as u32 - 1);
    let end_at = ramp_end + opts.hold;
    let shards = shard_count(opts.shards, n);
    let calls = tokio::spawn(drive_calls(ctx, n, shards, t0, step, end_at));

    // Sample the server while the calls run: peak RSS, CPU over the steady window (every
    // call up, from 2 s after the last started until 0.5 s before they stop).
    let steady_from = ramp_end + Duration::from_secs(2).min(opts.hold / 3);
    let steady_to = end_at - Duration::from_millis(500).min(opts.hold / 3);
    let sampler = {
        let pid = pid.clone();
        tokio::spawn(async move {
            let mut peak = 0u64;
            let mut steady_cpu = (None, None);
            let mut own_steady = (None, None);
            let mut steady_rss = Vec::new();
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                let now = tick.tick().await;
                if let Some(m) = procfs::mem(&pid) {
                    peak = peak.max(m.rss_kib);
                    samples.push((now, m.rss_kib));
                    if now >= steady_from && now <= steady_to {
                        steady_rss.push(m.rss_kib);
                    }
                }
                if now >= steady_from && steady_cpu.0.is_none() {
                    steady_cpu.0 = procfs::cpu_seconds(&pid).map(|c| (c, now));
                    own_steady.0 = own_cpu();
                }
                if now >= steady_to && steady_cpu.1.is_none() {
                    steady_cpu.1 = procfs::cpu_seconds(&pid).map(|c| (c, now));
                    own_steady.1 = own_cpu();
                    return (peak, steady_cpu, own_steady, steady_rss, samples);
                }
            }
        })
    };
    let flood_start = ramp_end + opts.flood_after;
    let flooder = opts.flood.any().then(|| {
        let (addr, plan) = (server.addr, opts.flood.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(flood_start).await;
            let stats = flood::run(addr, plan).await;
            (stats, Instant::now())
        })
    });
    let results = calls
        .await
        .map_err(|e| format!("the callers failed: {e}"))??;
    let (peak_kib, steady_cpu, own_steady, steady_rss, samples) =
        sampler.await.map_err(|e| e.to_string())?;
    let flooded = match flooder {
        Some(f) => Some(f.await.map_err(|e| e.to_string())?),
        None => None,
    };
    let cpu_calls_done = procfs::cpu_seconds(&pid).unwrap_or(0.0);
    let own_cpu1 = procfs::cpu_seconds("self").unwrap_or(0.0);
    let fakes_cpu1 = procfs::thread_cpu_seconds("self", FAKES_THREAD).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = procfs::mem(&pid).unwrap_or_default();
    let health_after = http_status(server.addr, &opts.health_path);
    let own = http_get(server.addr, "/metrics")
        .map(|m| OwnShare::from_metrics(&m))
        .unwrap_or_default();

    let finals = finals_by_call(&fakes.dg, &results);
    let mut report = summarize(opts, &results, &finals);
    report.patterd_own = own;
    let dg = fakes.dg.record();
    report.stt_heard_ms = Quantiles::of(
        dg.connections
            .iter()
            .flat_map(|c| c.finals_speech_ms.iter().map(|&m| m as f64))
            .collect(),
    );
    report.provider_requests = ProviderCounts {
        stt_sessions: dg.connections.len(),
        stt_rejected: dg
            .rejected
            .iter()
            .take(3)
            .map(|r| format!("{} {}", r.0, r.1))
            .collect(),
        llm_requests: fakes.hermes.record().requests.len(),
        tts_requests: fakes.el.record().requests.len(),
    };
    let (steady_s, steady_cpu_s) = match steady_cpu {
        (Some((c0, t0)), Some((c1, t1))) => ((t1 - t0).as_secs_f64(), c1 - c0),
        _ => (0.0, 0.0),
    };
    let (own_steady_s, fakes_steady_s) = match own_steady {
        (Some(a), Some(b)) => (b.0 - a.0, b.1 - a.1),
        _ => (0.0, 0.0),
    };
    let steady_rss_kib = if steady_rss.is_empty() {
        peak_kib
    } else {
        steady_rss.iter().sum::<u64>() / steady_rss.len() as u64
    };
    let pct = |cpu: f64| {
        if steady_s > 0.0 {
            100.0 * cpu / steady_s
        } else {
            0.0
        }
    };
    report.server = ServerStats {
        cold_start_ms: server.cold_start.as_secs_f64() * 1000.0,
        idle_rss_mib: idle.rss_kib as f64 / MIB,
        steady_rss_mib: steady_rss_kib as f64 / MIB,
        peak_rss_mib: peak_kib.max(after.hwm_kib) as f64 / MIB,
        after_rss_mib: after.rss_kib as f64 / MIB,
        rss_per_call_kib: steady_rss_kib.saturating_sub(idle.rss_kib) as f64 / n as f64,
        cpu_s_total: cpu_calls_done - cpu0,
        steady_window_s: steady_s,
        cpu_pct_steady: pct(steady_cpu_s),
        cpu_pct_per_call: pct(steady_cpu_s) / n as f64,
        healthy_after: health_after == Some(200),
    };
    if let Some((floods, flood_end)) = flooded {
        // "During" ends when the floods do or when the calls stop, whichever is first.
        let flood_end = flood_end.min(end_at);
        let peak_in = |from: Instant, to: Instant| {
            samples
                .iter()
                .filter(|(t, _)| *t >= from && *t <= to)
                .map(|&(_, k)| k)
                .max()
                .unwrap_or(0) as f64
                / MIB
        };
        let late_in = |from: Instant, to: Instant| {
            results
                .iter()
                .flat_map(|c| c.late_at.iter())
                .filter(|&&t| t >= from && t < to)
                .count() as u64
        };
        let (added_before, _) = added_in(&results, &finals, ramp_end, flood_start);
        let (added_during, missing_during) = added_in(&results, &finals, flood_start, flood_end);
        report.flood = Some(FloodReport {
            started_after_ramp_s: opts.flood_after.as_secs_f64(),
            duration_s: (flood_end - flood_start).as_secs_f64(),
            before_window_s: (flood_start - ramp_end).as_secs_f64(),
            late_gaps_before: late_in(ramp_end, flood_start),
            late_gaps_during: late_in(flood_start, flood_end),
            added_before_ms: Quantiles::of(added_before),
            added_during_ms: Quantiles::of(added_during),
            turns_missing_during: missing_during,
            peak_rss_before_mib: peak_in(ramp_end, flood_start),
            peak_rss_during_mib: peak_in(flood_start, flood_end),
            floods,
        });
    }
    report.loadgen_cpu_s = own_cpu1 - own_cpu0;
    report.loadavg_start = loadavg_start;
    report.loadgen_cpu_pct_steady = pct(own_steady_s);
    report.loadgen_fakes_cpu_s = fakes_cpu1 - fakes_cpu0;
    report.loadgen_fakes_cpu_pct_steady = pct(fakes_steady_s);
    report.loadgen_callers_cpu_pct_steady = pct(own_steady_s - fakes_steady_s);
    report.loadgen_shards = shards;
    drop(server);
    drop(fakes);
    drop(fakes_rt);
    Ok(report)
}

/// Cold start `runs` times: spawns the server (with `opts.health_path`, e.g. `/readyz`) against
/// one set of fakes, measures spawn → first 200, stops it; the figures in ms, in run order.
pub async fn cold_starts(opts: &Options, runs: usize) -> Result<Vec<f64>, String> {
    patterd::util::init_tls();
    let fakes = start_fakes().await.map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let server = spawn_server(opts, &fakes)?;
        out.push(server.cold_start.as_secs_f64() * 1000.0);
        // Dropping it stops it (SIGTERM, then waits).
        tokio::task::block_in_place(|| drop(server));
    }
    Ok(out)
}

/// `speech_final` send times per call, from the tags in each connection's first audio.
///
/// A server that decodes the caller's μ-law before the STT (Patter sends 16 kHz linear PCM)
/// destroys the tags; its sessions are matched to the remaining calls in order instead (the
/// n-th session opened ↔ the n-th media stream started). Calls start `1 / rate` apart, so
/// this holds while the server opens its STT sessions in the order the calls arrive; a
/// mismatch shows up as turns whose `speech_final` is not inside their reply window
/// (`turns_unmatched`).
fn finals_by_call(dg: &FakeDeepgram, results: &[CallResult]) -> HashMap<u32, Vec<Instant>> {
    let mut map: HashMap<u32, Vec<Instant>> = HashMap::new();
    let mut untagged = Vec::new();
    for c in dg.record().connections {
        let tagged = c.param("encoding") == Some("mulaw");
        match caller::read_tag(&c.first_audio).filter(|_| tagged) {
            Some(idx) => map.entry(idx).or_default().extend(c.finals_at),
            // A session that never carried audio (e.g. a pre-call warm-up) is no call's.
            None if c.audio_frames == 0 && c.finals_at.is_empty() => {}
            None => untagged.push(c),
        }
    }
    if !untagged.is_empty() {
        untagged.sort_by_key(|c| c.opened_at);
        let mut calls: Vec<_> = results
            .iter()
            .filter(|r| !map.contains_key(&r.idx))
            .filter_map(|r| r.started_at.map(|t| (t, r.idx)))
            .collect();
        calls.sort();
        for (c, (_, idx)) in untagged.into_iter().zip(calls) {
            map.entry(idx).or_default().extend(c.finals_at);
        }
    }
    for v in map.values_mut() {
        v.sort();
    }
    map
}

/// Added latency (`speech_final` → first reply frame) of the turns whose caller speech ended
/// in `[from, to)`, and how many of those turns went unanswered.
fn added_in(
    results: &[CallResult],
    finals: &HashMap<u32, Vec<Instant>>,
    from: Instant,
    to: Instant,
) -> (Vec<f64>, usize) {
    let mut added = Vec::new();
    let mut missing = 0;
    for c in results {
        for t in c
            .turns
            .iter()
            .filter(|t| t.speech_end >= from && t.speech_end < to)
        {
            let Some(first) = t.first_frame else {
                missing += 1;
                continue;
            };
            let f = finals.get(&c.idx).and_then(|v| {
                v.iter()
                    .find(|&&f| f >= t.speech_end && f <= first)
                    .copied()
            });
            if let Some(f) = f {
                added.push(ms(first.saturating_duration_since(f)));
            }
        }
    }
    (added, missing)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summarize(
    opts: &Options,
    results: &[CallResult],
    finals: &HashMap<u32, Vec<Instant>>,
) -> RunReport {
    let mut e2e = Vec::new();
    let mut added = Vec::new();
    let mut greeting = Vec::new();
    let mut clear = Vec::new();
    let mut onset_clear = Vec::new();
    let mut errors: HashMap<String, usize> = HashMap::new();
    let mut r = RunReport {
        label: opts.label.clone(),
        calls: opts.calls,
        rate: opts.rate,
        hold_s: opts.hold.as_secs_f64(),
        ..Default::default()
    };
    for c in results {
        match &c.error {
            Some(e) if c.turns.is_empty() => {
                r.failed_calls += 1;
                *errors.entry(e.clone()).or_default() += 1;
            }
            Some(e) => {
                r.completed_calls += 1;
                *errors.entry(e.clone()).or_default() += 1;
            }
            None => r.completed_calls += 1,
        }
        if let Some(g) = c.greeting {
            greeting.push(ms(g));
        }
        r.frames_sent += c.frames_sent;
        r.frames_received += c.frames_received;
        r.malformed_messages += c.malformed;
        r.late_gaps += c.late_gaps;
        r.late_gaps_early += c.late_early;
        r.underruns += c.underruns;
        r.max_gap_ms = r.max_gap_ms.max(ms(c.max_gap));
        r.loadgen_lag_ticks += c.own_lag_ticks;
        r.loadgen_max_lag_ms = r.loadgen_max_lag_ms.max(ms(c.own_max_lag));
        let call_finals = finals.get(&c.idx);
        for t in &c.turns {
            r.turns += 1;
            if t.barge_in {
                r.barge_ins += 1;
                if let Some(at) = t.clear_at {
                    clear.push(ms(at.saturating_duration_since(t.speech_end)));
                }
                if let (Some(onset), Some(at)) = (t.onset, t.onset_clear) {
                    onset_clear.push(ms(at.saturating_duration_since(onset)));
                }
            }
            let Some(first) = t.first_frame else {
                r.turns_missing += 1;
                continue;
            };
            r.turns_answered += 1;
            e2e.push(ms(first.saturating_duration_since(t.speech_end)));
            let f = call_finals.and_then(|v| {
                v.iter()
                    .find(|&&f| f >= t.speech_end && f <= first)
                    .copied()
            });
            match f {
                Some(f) => added.push(ms(first.saturating_duration_since(f))),
                None => r.turns_unmatched += 1,
            }
        }
    }
    r.e2e_ms = Quantiles::of(e2e);
    r.added_ms = Quantiles::of(added);
    r.greeting_ms = Quantiles::of(greeting);
    r.barge_in_clear_ms = Quantiles::of(clear);
    r.barge_in_onset_clear_ms = Quantiles::of(onset_clear);
    let mut errs: Vec<_> = errors.into_iter().collect();
    errs.sort_by_key(|e| std::cmp::Reverse(e.1));
    r.errors = errs.into_iter().take(5).collect();
    r
}
