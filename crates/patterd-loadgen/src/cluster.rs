//! `--instances N`: the load run against a cluster. It starts a throwaway PostgreSQL database
//! (`patterd_sim::postgres`), N patterd processes sharing it (`[store] backend = "postgres"`,
//! `[cluster] advertise_url = "auto"`, test timings), and the round-robin front of
//! `patterd_sim::front` as the shared `public_url`'s balancer. The callers post their webhooks
//! to the front and open their media sockets where each TwiML answer says (the owner). While
//! the calls talk it measures:
//! - a control action (`POST /v1/calls/{id}/say`) sent to the call's owner and to another
//!   instance (forwarded), alternating, on a few probe calls that are not part of the
//!   conversation figures: the forward's added latency;
//! - the webhook answer (admission with the cluster-wide claim of the call id);
//! - each instance's store commits (its `/metrics`), dropped writes, CPU;
//! - with `kill`: SIGKILL of one instance halfway through the hold, then how long until its
//!   calls read failed in the database and their legs were hung up at the fake carrier.
//!
//! At the end it counts the rows the calls left in the database per call-minute.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::caller::CallResult;
use super::report::{Quantiles, RunReport};
use super::{
    ACCOUNT_SID, API_TOKEN, AUTH_TOKEN, FAKES_THREAD, FakesRuntime, OUR_NUMBER, Options,
    PUBLIC_URL, batch_wakeups, drive_calls, finals_by_call, procfs, shard_count, spawn_server_with,
    start_fakes, summarize,
};
use patterd_sim::front::Front;
use patterd_sim::postgres::TestDatabase;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::xml::parse_twiml;

/// What the cluster run does beyond the calls.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    pub instances: usize,
    /// Probe calls for the action latencies.
    pub probes: usize,
    /// Actions sent in all (half local, half forwarded).
    pub actions: usize,
    /// SIGKILL instance 1 halfway through the hold.
    pub kill: bool,
}

/// A failover: one instance killed mid-run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Failover {
    pub instance: String,
    /// Its open calls when it was killed.
    pub open_calls: usize,
    /// Kill → none of them open in the database any more (reaper).
    pub marked_ms: Option<f64>,
    /// Kill → every one of their legs hung up at the fake carrier's REST API.
    pub hung_up_ms: Option<f64>,
    /// The other instances' calls: turns taken, and turns without a reply.
    pub survivor_turns: usize,
    pub survivor_turns_missing: usize,
}

/// One instance's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InstanceFigures {
    pub name: String,
    pub calls: usize,
    /// Upper bound of the bucket holding the 50th / 99th percentile commit, ms.
    pub commit_p50_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
    pub batches: u64,
    pub writes_dropped: u64,
    pub cpu_pct: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterReport {
    pub instances: usize,
    /// The conversation figures (every call, or with a kill the survivors').
    pub run: RunReport,
    /// Webhook sent → TwiML answer received, through the front.
    pub webhook_ms: Quantiles,
    pub action_local_ms: Quantiles,
    pub action_forwarded_ms: Quantiles,
    /// Actions that did not answer 200, by status.
    pub action_errors: Vec<(u16, usize)>,
    pub per_instance: Vec<InstanceFigures>,
    /// Rows (calls + turns + events) per minute of call, from the database at the end.
    pub rows_per_call_minute: f64,
    pub failover: Option<Failover>,
    /// The same per-instance load (calls / instances at rate / instances) on one instance
    /// with the embedded SQLite store behind the same kind of front, run first: the webhook
    /// answer and conversation figures without the cluster.
    #[serde(default)]
    pub baseline: Option<Baseline>,
}

/// One SQLite instance at the cluster's per-instance load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Baseline {
    pub calls: usize,
    pub run: RunReport,
    pub webhook_ms: Quantiles,
}

/// Upper bound (ms) of the histogram bucket of `name` in `metrics` holding quantile `q`.
fn bucket_quantile(metrics: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, u64)> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, n) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, n.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let want = (q * total as f64).ceil().max(1.0) as u64;
    buckets
        .iter()
        .find(|(_, n)| *n >= want)
        .map(|(le, _)| le * 1000.0)
}

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// The `[store]` and `[cluster]` tables of instance `i`.
fn cluster_config(db: &TestDatabase, i: usize) -> String {
    format!(
        "\n[store]\nbackend = \"postgres\"\nurl = \"{}\"\npool = 4\n\n[cluster]\n\
         instance_name = \"p{i}\"\nadvertise_url = \"auto\"\nheartbeat_ms = 200\n\
         lease_ms = 1000\nreaper_ms = 200\n",
        db.url
    )
}

/// Sends `say` on `call` to `addr`; its latency, or the status it answered.
async fn say(client: &reqwest::Client, addr: SocketAddr, call: &str) -> Result<Duration, u16> {
    let t = Instant::now();
    let r = client
        .post(format!("http://{addr}/v1/calls/{call}/say"))
        .bearer_auth(API_TOKEN)
        .json(&serde_json::json!({"text": "One moment."}))
        .send()
        .await
        .map_err(|_| 0u16)?;
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    if status == 200 {
        Ok(t.elapsed())
    } else {
        Err(status)
    }
}

/// Probe calls through the front, held open with silence; `(call id, owner index, call)`.
async fn open_probes(
    front: &Front,
    addrs: &[SocketAddr],
    n: usize,
) -> Vec<(String, usize, SimCall)> {
    let twilio = SimTwilio::new(&front.url(), PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN);
    let mut out = Vec::new();
    for k in 0..n {
        let from = format!("+1556{k:07}");
        let Ok((sid, resp)) = twilio
            .incoming_call("/twilio/voice", &from, OUR_NUMBER)
            .await
        else {
            continue;
        };
        let Ok(answer) = parse_twiml(&resp.body) else {
            continue;
        };
        let Some(host) = answer
            .stream_url
            .as_deref()
            .and_then(|u| u.split_once("://"))
            .map(|(_, r)| r.split('/').next().unwrap_or(r).to_string())
        else {
            continue;
        };
        let Some(owner) = addrs.iter().position(|a| a.to_string() == host) else {
            continue;
        };
        let cfg = SimCallConfig::new(&format!("ws://{host}"), ACCOUNT_SID, &sid);
        if let Ok(call) = SimCall::from_answer(&answer, cfg).await {
            out.push((sid, owner, call));
        }
    }
    out
}

/// The actions: `plan.actions` in all, alternating owner / another instance, spread over
/// the probe calls.
async fn measure_actions(
    probes: &[(String, usize, SimCall)],
    addrs: &[SocketAddr],
    actions: usize,
) -> (Vec<f64>, Vec<f64>, Vec<(u16, usize)>) {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default();
    let (mut local, mut forwarded) = (Vec::new(), Vec::new());
    let mut errors: std::collections::BTreeMap<u16, usize> = Default::default();
    if probes.is_empty() || addrs.len() < 2 {
        return (local, forwarded, Vec::new());
    }
    for k in 0..actions {
        let (sid, owner, _) = &probes[k % probes.len()];
        let forward = k % 2 == 1;
        let target = if forward {
            addrs[(owner + 1 + k / 2 % (addrs.len() - 1)) % addrs.len()]
        } else {
            addrs[*owner]
        };
        match say(&client, target, sid).await {
            Ok(d) if forward => forwarded.push(d.as_secs_f64() * 1000.0),
            Ok(d) => local.push(d.as_secs_f64() * 1000.0),
            Err(status) => *errors.entry(status).or_default() += 1,
        }
        // One action per probe call per 50 ms: a `say` queues speech on the call.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (local, forwarded, errors.into_iter().collect())
}

/// `n` calls at `rate` per second through `front`, held `opts.hold` after the last started;
/// media where each answer says (`ws_base` empty) or to `ws_base`.
async fn drive(
    opts: &Options,
    front: &Front,
    ws_base: String,
    n: usize,
    rate: f64,
) -> Result<Vec<CallResult>, String> {
    let ctx = super::call_ctx(opts, &front.url(), ws_base);
    let t0 = Instant::now() + Duration::from_millis(50);
    let step = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let end_at = t0 + step * (n.max(1) as u32 - 1) + opts.hold;
    drive_calls(ctx, n, shard_count(opts.shards, n), t0, step, end_at).await
}

/// The baseline: one patterd on its own SQLite store behind a one-backend front, carrying
/// what each cluster instance will carry.
async fn run_baseline(
    opts: &Options,
    fakes: &super::process::Fakes,
    instances: usize,
) -> Result<Baseline, String> {
    let n = opts.calls.max(1).div_ceil(instances.max(1));
    let server = spawn_server_with(opts, fakes, "", "-sqlite")?;
    let front = Front::start(vec![server.addr])
        .await
        .map_err(|e| format!("front: {e}"))?;
    if !front.wait_ready(1, Duration::from_secs(30)).await {
        return Err("the baseline instance did not become ready".into());
    }
    let results = drive(
        opts,
        &front,
        format!("ws://{}", server.addr),
        n,
        opts.rate / instances.max(1) as f64,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let finals = finals_by_call(&fakes.dg, &results);
    let webhook = results
        .iter()
        .filter_map(|r| r.webhook)
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    drop(front);
    drop(server);
    Ok(Baseline {
        calls: n,
        run: summarize(opts, &results, &finals),
        webhook_ms: Quantiles::of(webhook),
    })
}

/// One run of `opts.calls` calls against `plan.instances` instances.
pub async fn run_cluster(opts: &Options, plan: &ClusterPlan) -> Result<ClusterReport, String> {
    patterd::util::init_tls();
    let db = TestDatabase::create().ok_or("the cluster run needs PostgreSQL (see above)")?;
    let fakes_rt = FakesRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(FAKES_THREAD)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the fakes' runtime: {e}"))?,
    ));
    let rt = fakes_rt.0.as_ref().ok_or("no runtime for the fakes")?;
    if !opts.fakes_batch.is_zero() {
        rt.spawn(batch_wakeups(opts.fakes_batch));
    }
    let fakes = rt
        .spawn(start_fakes())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let baseline = Some(run_baseline(opts, &fakes, plan.instances).await?);
    let mut servers = Vec::new();
    for i in 0..plan.instances {
        servers.push(spawn_server_with(
            opts,
            &fakes,
            &cluster_config(&db, i),
            &format!("-p{i}"),
        )?);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let pids: Vec<String> = servers.iter().map(|s| s.child.id().to_string()).collect();
    let front = Front::start(addrs.clone())
        .await
        .map_err(|e| format!("front: {e}"))?;
    if !front
        .wait_ready(plan.instances, Duration::from_secs(30))
        .await
    {
        return Err("not every instance became ready behind the front".into());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = opts.calls.max(1);
    let ramp_end = Instant::now()
        + Duration::from_millis(50)
        + Duration::from_secs_f64(1.0 / opts.rate.max(0.1)) * (n as u32 - 1);
    let calls = {
        let (opts, front_url) = (opts.clone(), front.url());
        tokio::spawn(async move {
            let ctx = super::call_ctx(&opts, &front_url, String::new());
            let t0 = Instant::now() + Duration::from_millis(50);
            let step = Duration::from_secs_f64(1.0 / opts.rate.max(0.1));
            let end_at = t0 + step * (n as u32 - 1) + opts.hold;
            drive_calls(ctx, n, shard_count(opts.shards, n), t0, step, end_at).await
        })
    };

    tokio::time::sleep_until(ramp_end + Duration::from_secs(1)).await;
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|p| procfs::cpu_seconds(p).unwrap_or(0.0))
        .collect();
    let cpu_t0 = Instant::now();
    let probes = open_probes(&front, &addrs, plan.probes).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (local, forwarded, action_errors) = measure_actions(&probes, &addrs, plan.actions).await;
    let cpu1: Vec<f64> = pids
        .iter()
        .map(|p| procfs::cpu_seconds(p).unwrap_or(0.0))
        .collect();
    let cpu_s = cpu_t0.elapsed().as_secs_f64();

    let mut failover = None;
    if plan.kill && plan.instances > 1 {
        tokio::time::sleep_until((ramp_end + opts.hold / 2).max(Instant::now())).await;
        let open: Vec<String> = db
            .query("SELECT call_id FROM calls WHERE owner_id = 'p1' AND ended_at IS NULL")
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect();
        let victim = &mut servers[1];
        let _ = victim.child.kill();
        let _ = victim.child.wait();
        let killed_at = Instant::now();
        let (mut marked, mut hung) = (None, None);
        while killed_at.elapsed() < Duration::from_secs(30) && (marked.is_none() || hung.is_none())
        {
            if marked.is_none()
                && db
                    .query("SELECT count(*) FROM calls WHERE owner_id = 'p1' AND ended_at IS NULL")
                    .trim()
                    == "0"
            {
                marked = Some(killed_at.elapsed());
            }
            if hung.is_none() {
                let h = fakes.rest.hung_up();
                if open.iter().all(|c| h.contains(c)) {
                    hung = Some(killed_at.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        failover = Some(Failover {
            instance: "p1".into(),
            open_calls: open.len(),
            marked_ms: ms(marked),
            hung_up_ms: ms(hung),
            ..Default::default()
        });
    }

    let results = calls
        .await
        .map_err(|e| format!("the callers failed: {e}"))??;
    drop(probes);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let finals = finals_by_call(&fakes.dg, &results);
    let killed = plan.kill.then(|| addrs[1].to_string());
    let kept: Vec<CallResult> = results
        .iter()
        .filter(|r| killed.is_none() || r.media_host != killed)
        .cloned()
        .collect();
    let run = summarize(opts, &kept, &finals);
    if let Some(f) = failover.as_mut() {
        f.survivor_turns = run.turns;
        f.survivor_turns_missing = run.turns_missing;
    }
    let mut per_instance = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let metrics = super::http_get(*addr, "/metrics").unwrap_or_default();
        let name = "patterd_store_commit_seconds";
        per_instance.push(InstanceFigures {
            name: format!("p{i}"),
            calls: results
                .iter()
                .filter(|r| r.media_host.as_deref() == Some(&addr.to_string()))
                .count(),
            commit_p50_ms: bucket_quantile(&metrics, name, 0.5),
            commit_p99_ms: bucket_quantile(&metrics, name, 0.99),
            batches: counter(&metrics, "patterd_store_commit_seconds_count"),
            writes_dropped: counter(&metrics, "patterd_store_writes_dropped_total"),
            cpu_pct: if cpu_s > 0.0 {
                100.0 * (cpu1[i] - cpu0[i]) / cpu_s
            } else {
                0.0
            },
        });
    }
    let rows: f64 = db
        .query(
            "SELECT (SELECT count(*) FROM calls) + (SELECT count(*) FROM turns) \
             + (SELECT count(*) FROM events)",
        )
        .trim()
        .parse()
        .unwrap_or(0.0);
    let minutes: f64 = db
        .query("SELECT COALESCE(sum(duration_ms), 0) / 60000.0 FROM calls")
        .trim()
        .parse()
        .unwrap_or(0.0);
    let webhook = results
        .iter()
        .filter_map(|r| r.webhook)
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    drop(front);
    drop(servers);
    drop(fakes);
    drop(fakes_rt);
    Ok(ClusterReport {
        instances: plan.instances,
        run,
        webhook_ms: Quantiles::of(webhook),
        action_local_ms: Quantiles::of(local),
        action_forwarded_ms: Quantiles::of(forwarded),
        action_errors,
        per_instance,
        rows_per_call_minute: if minutes > 0.0 { rows / minutes } else { 0.0 },
        failover,
        baseline,
    })
}

/// The cluster report as markdown.
pub fn markdown(r: &ClusterReport) -> String {
    let q = |q: &Quantiles| format!("{:.2} / {:.2}", q.p50, q.p99);
    let mut out = format!(
        "**{} instances, {} calls** (turns answered {} of {}, reply p50/p99 {:.0} / {:.0} ms, \
         late gaps {})\n\n| figure | p50 / p99 ms |\n|---|---|\n",
        r.instances,
        r.run.calls,
        r.run.turns_answered,
        r.run.turns,
        r.run.e2e_ms.p50,
        r.run.e2e_ms.p99,
        r.run.late_gaps
    );
    out += &format!(
        "| webhook answer (through the front) | {} |\n",
        q(&r.webhook_ms)
    );
    if let Some(b) = &r.baseline {
        out += &format!(
            "| webhook answer, one SQLite instance with {} calls (the same per-instance load) | {} |\n",
            b.calls,
            q(&b.webhook_ms)
        );
        out += &format!(
            "| added by the cluster (claim on PostgreSQL) | {:.2} / {:.2} |\n",
            r.webhook_ms.p50 - b.webhook_ms.p50,
            r.webhook_ms.p99 - b.webhook_ms.p99
        );
    }
    out += &format!("| `say` sent to the owner | {} |\n", q(&r.action_local_ms));
    out += &format!(
        "| `say` sent to another instance (forwarded) | {} |\n",
        q(&r.action_forwarded_ms)
    );
    out += &format!(
        "| added by the forward | {:.2} / {:.2} |\n\n",
        r.action_forwarded_ms.p50 - r.action_local_ms.p50,
        r.action_forwarded_ms.p99 - r.action_local_ms.p99
    );
    if !r.action_errors.is_empty() {
        out += &format!("Actions not answered 200: {:?}\n\n", r.action_errors);
    }
    out += "| instance | calls | commit p50 / p99 (bucket) ms | batches | writes dropped | CPU % (while probing) |\n|---|---|---|---|---|---|\n";
    for i in &r.per_instance {
        let b = |v: Option<f64>| v.map_or("–".into(), |v| format!("≤ {v:.0}"));
        out += &format!(
            "| {} | {} | {} / {} | {} | {} | {:.0} |\n",
            i.name,
            i.calls,
            b(i.commit_p50_ms),
            b(i.commit_p99_ms),
            i.batches,
            i.writes_dropped,
            i.cpu_pct
        );
    }
    out += &format!("\nRows per call-minute: {:.0}\n", r.rows_per_call_minute);
    if let Some(b) = &r.baseline {
        out += &format!(
            "\nBaseline (one SQLite instance, {} calls): turns answered {} of {}, reply p50/p99 \
             {:.0} / {:.0} ms, late gaps {}.\n",
            b.calls,
            b.run.turns_answered,
            b.run.turns,
            b.run.e2e_ms.p50,
            b.run.e2e_ms.p99,
            b.run.late_gaps
        );
    }
    if let Some(f) = &r.failover {
        let ms = |v: Option<f64>| v.map_or("not within 30 s".into(), |v| format!("{v:.0} ms"));
        out += &format!(
            "\nFailover: {} killed with {} open calls; marked failed after {}, legs hung up \
             after {}; the other instances' calls took {} turns, {} without a reply.\n",
            f.instance,
            f.open_calls,
            ms(f.marked_ms),
            ms(f.hung_up_ms),
            f.survivor_turns,
            f.survivor_turns_missing
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_quantiles_come_from_the_cumulative_counts() {
        let m = "x_bucket{le=\"0.001\"} 50\nx_bucket{le=\"0.005\"} 98\n\
                 x_bucket{le=\"0.01\"} 100\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
        assert_eq!(bucket_quantile(m, "x", 0.5), Some(1.0));
        assert_eq!(bucket_quantile(m, "x", 0.99), Some(10.0));
        assert_eq!(bucket_quantile("", "x", 0.5), None);
        assert_eq!(counter(m, "x_count"), 100);
    }
}
