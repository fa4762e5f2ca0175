//! `patterd-loadgen`: runs the load benchmark (see `patterd_loadgen` and
//! docs/BENCHMARKS.md). For each N in `--calls` it starts fresh fakes and a fresh server
//! process, ramps N simulated Twilio calls, and prints a markdown table; `--json` writes every
//! run's full report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use patterd_loadgen::{Options, Target, report};

/// Load generator: N concurrent simulated Twilio calls against a server on 127.0.0.1 with
/// zero-latency fake providers.
#[derive(Parser, Debug)]
#[command(name = "patterd-loadgen", version)]
struct Args {
    /// The patterd binary to benchmark.
    #[arg(long, default_value = "target/release/patterd")]
    server: PathBuf,
    /// Benchmark another server instead: a shell command that serves Twilio webhooks on
    /// $BENCH_PORT against the fakes named in $BENCH_* variables.
    #[arg(long)]
    server_cmd: Option<String>,
    /// Name of the server in the report.
    #[arg(long, default_value = "patterd")]
    label: String,
    /// Concurrent calls, one run per value (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    calls: Vec<usize>,
    /// Calls started per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds all calls stay up after the last one started.
    #[arg(long, default_value_t = 10.0)]
    hold_s: f64,
    /// Length of the caller's speech clip per turn, ms.
    #[arg(long, default_value_t = 1000)]
    speech_ms: u64,
    /// The caller's line noise while it does not speak, dBFS (steady white noise); 0 or
    /// above sends the call's tag over digital silence in every quiet frame instead (the
    /// method of rounds 1–4 in docs/BENCHMARKS.md).
    #[arg(long, default_value_t = -65.0, allow_hyphen_values = true)]
    line_noise_dbfs: f32,
    /// Silence between a reply and the caller's next turn, ms.
    #[arg(long, default_value_t = 500)]
    pause_ms: u64,
    /// On each call's second turn, speak again 300 ms into the reply.
    #[arg(long)]
    barge_in: bool,
    /// Twilio voice webhook path on the server.
    #[arg(long, default_value = "/twilio/voice")]
    voice_path: String,
    /// Health path polled for the cold start.
    #[arg(long, default_value = "/healthz")]
    health_path: String,
    /// Stop the sweep after a run in which this share of calls failed or turns went
    /// unanswered (the server is past its limit).
    #[arg(long, default_value_t = 0.5)]
    stop_at_failure: f64,
    /// Write all runs' reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the markdown table here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Keep the server logs in this directory.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Pin the server to these CPUs (`taskset -c` list, e.g. `0`); pin the load generator
    /// itself with `taskset -c 1 patterd-loadgen ...`.
    #[arg(long)]
    server_cpus: Option<String>,
    /// Flood: this many forged Twilio voice webhooks (bad signature, 64 in flight) while the
    /// calls talk; each should get 403.
    #[arg(long, default_value_t = 0)]
    flood_webhooks: usize,
    /// Flood: this many idle unauthenticated media WebSockets (upgrade, then silence), all
    /// at once; each should be refused or closed at the start deadline.
    #[arg(long, default_value_t = 0)]
    flood_idle_ws: usize,
    /// Flood: this many media WebSockets sending oversized or fragmented frames (100 KiB,
    /// 2 MiB, 20 × 8 KiB fragments in turn, 90 in flight); each should be closed.
    #[arg(long, default_value_t = 0)]
    flood_oversized: usize,
    /// Flood: this many slowloris connections (half drip headers, half a body, a byte a
    /// second), all at once; each should time out.
    #[arg(long, default_value_t = 0)]
    flood_slowloris: usize,
    /// Start the floods this many seconds after the last call started (the "before" window);
    /// the floods run one after another; make --hold-s long enough for them (each flood
    /// connection lasts at most 20 s).
    #[arg(long, default_value_t = 8.0)]
    flood_after_s: f64,
    /// Caller shards: tasks that drive many callers each from one 2 ms timer (0: one per
    /// 250 calls, at least two per core).
    #[arg(long, default_value_t = 0)]
    shards: usize,
    /// The fakes run on one thread that handles its socket events in batches, waking at
    /// most once per this many ms (0: on every event). Each event waits at most this long.
    #[arg(long, default_value_t = 2)]
    fakes_batch_ms: u64,
    /// Only measure the cold start: spawn the server this many times (health path
    /// `/readyz` unless --health-path is given), print min / median / p90 / max of spawn →
    /// first 200, write them to --json, and exit.
    #[arg(long, default_value_t = 0)]
    cold_start_runs: usize,
    /// Run against a cluster of this many patterd instances on a throwaway PostgreSQL behind
    /// a round-robin front (see `patterd_loadgen::cluster`); 1: the single server.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// With --instances: SIGKILL one instance halfway through the hold (failover figures).
    #[arg(long)]
    kill_one: bool,
    /// With --instances: probe calls and `say` actions (half to the owner, half forwarded).
    #[arg(long, default_value_t = 6)]
    probes: usize,
    #[arg(long, default_value_t = 400)]
    actions: usize,
    /// Only print the markdown table of runs saved earlier with --json (several files' runs
    /// merged into one JSON array), then exit.
    #[arg(long)]
    markdown_from: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.markdown_from {
        let runs = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                serde_json::from_slice::<Vec<report::RunReport>>(&b).map_err(|e| e.to_string())
            });
        return match runs {
            Ok(runs) => {
                print!("{}", report::markdown(&runs));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {path:?}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let nofile = patterd_loadgen::procfs::raise_nofile();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("lg-callers")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let target = match &args.server_cmd {
        Some(shell) => Target::Command {
            shell: shell.clone(),
        },
        None => Target::Patterd {
            bin: args.server.clone(),
        },
    };
    eprintln!(
        "patterd-loadgen: {} against {:?}, calls {:?}, open-file limit {nofile}",
        args.label, target, args.calls
    );
    if args.cold_start_runs > 0 {
        return cold_start(&rt, &args, target);
    }
    if args.instances > 1 {
        return cluster_runs(&rt, &args, target);
    }
    let mut runs = Vec::new();
    let mut floods = String::new();
    for &n in &args.calls {
        let opts = options(&args, target.clone(), n, args.health_path.clone());
        eprintln!("patterd-loadgen: {} calls ...", n);
        match rt.block_on(patterd_loadgen::run(&opts)) {
            Ok(r) => {
                eprint!("{}", report::markdown(std::slice::from_ref(&r)));
                if let Some(f) = &r.flood {
                    floods.push_str(&report::flood_markdown(f));
                }
                let bad = r.failed_calls + r.turns_missing;
                let total = (r.completed_calls + r.failed_calls).max(1) + r.turns;
                runs.push(r);
                if bad as f64 / total as f64 >= args.stop_at_failure {
                    eprintln!("patterd-loadgen: stopping the sweep: the server is past its limit");
                    break;
                }
            }
            Err(e) => {
                eprintln!("patterd-loadgen: run with {n} calls failed: {e}");
                break;
            }
        }
    }
    let mut table = report::markdown(&runs);
    if !floods.is_empty() {
        table.push('\n');
        table.push_str(&floods);
    }
    println!("{table}");
    if let Some(path) = &args.markdown
        && let Err(e) = std::fs::write(path, &table)
    {
        eprintln!("error: {path:?}: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&runs).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if runs.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--instances N`: one cluster run per `--calls` value.
fn cluster_runs(rt: &tokio::runtime::Runtime, args: &Args, target: Target) -> ExitCode {
    let plan = patterd_loadgen::cluster::ClusterPlan {
        instances: args.instances,
        probes: args.probes,
        actions: args.actions,
        kill: args.kill_one,
    };
    let mut reports = Vec::new();
    let mut text = String::new();
    for &n in &args.calls {
        let opts = options(args, target.clone(), n, args.health_path.clone());
        eprintln!(
            "patterd-loadgen: {n} calls on {} instances ...",
            plan.instances
        );
        match rt.block_on(patterd_loadgen::cluster::run_cluster(&opts, &plan)) {
            Ok(r) => {
                text.push_str(&patterd_loadgen::cluster::markdown(&r));
                text.push('\n');
                reports.push(r);
            }
            Err(e) => {
                eprintln!("patterd-loadgen: cluster run with {n} calls failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{text}");
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&reports).unwrap_or_default();
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("error: {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// `--cold-start-runs`: spawn → first health 200, several times.
fn cold_start(rt: &tokio::runtime::Runtime, args: &Args, target: Target) -> ExitCode {
    let health_path = if args.health_path == "/healthz" {
        "/readyz".to_string()
    } else {
        args.health_path.clone()
    };
    let opts = options(args, target, 0, health_path);
    let ms = match rt.block_on(patterd_loadgen::cold_starts(&opts, args.cold_start_runs)) {
        Ok(ms) => ms,
        Err(e) => {
            eprintln!("patterd-loadgen: cold start failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let q = report::Quantiles::of(ms.clone());
    let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "cold start ({} → {}), {} runs: min {min:.1} ms, median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        args.label, opts.health_path, q.n, q.p50, q.p90, q.max
    );
    if let Some(path) = &args.json {
        let v = serde_json::json!({
            "label": args.label, "health_path": opts.health_path, "runs": q.n,
            "min_ms": min, "p50_ms": q.p50, "p90_ms": q.p90, "max_ms": q.max, "all_ms": ms,
        });
        if let Err(e) = std::fs::write(path, v.to_string()) {
            eprintln!("error: {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// One run's options from the command line.
fn options(args: &Args, target: Target, calls: usize, health_path: String) -> Options {
    Options {
        label: args.label.clone(),
        target,
        calls,
        rate: args.rate,
        hold: Duration::from_secs_f64(args.hold_s),
        speech_ms: args.speech_ms,
        line_noise_dbfs: (args.line_noise_dbfs < 0.0).then_some(args.line_noise_dbfs),
        pause: Duration::from_millis(args.pause_ms),
        barge_in: args.barge_in,
        voice_path: args.voice_path.clone(),
        health_path,
        log_dir: args.log_dir.clone(),
        server_cpus: args.server_cpus.clone(),
        flood: patterd_loadgen::flood::FloodPlan {
            webhooks: args.flood_webhooks,
            idle_ws: args.flood_idle_ws,
            oversized: args.flood_oversized,
            slowloris: args.flood_slowloris,
        },
        flood_after: Duration::from_secs_f64(args.flood_after_s),
        shards: args.shards,
        fakes_batch: Duration::from_millis(args.fakes_batch_ms),
    }
}
