//! This instance's membership of the cluster: it registers at start (before `/readyz` answers
//! 200), renews its lease with a heartbeat every `[cluster] heartbeat_ms`, writes its state as it
//! changes (`draining` at once on SIGTERM, `stopped` at a clean exit, which peers never reap), and
//! fences itself:
//!
//! - a heartbeat that cannot be renewed for `lease − 2 × heartbeat` (timed on this instance's
//!   monotonic clock from the moment the last renewed beat was *sent*, so it always errs early
//!   against the database's clock that peers judge the lease by) stops admission: `/readyz`
//!   answers 503 and new calls are refused as while draining ([`App::is_fenced`]); the next
//!   renewed beat admits again;
//! - a row that reads `lost` (a peer's reaper declared this instance gone and closed its calls)
//!   or that is not this incarnation's any more (another process took the name) ends the
//!   process with a non-zero code: its calls are someone else's business now, and the
//!   orchestrator starts a fresh incarnation.
//!
//! Registering also reaps this name's previous incarnation at once — its open calls failed, its
//! legs hung up, its outbound slots freed — rather than waiting a lease for a peer's reaper
//! (`store::postgres::members::register`). The heartbeat task also reads the instances by state
//! for `patterd_cluster_instances`, so a scrape never touches the database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::Cluster;
use crate::app::App;
use crate::store::postgres::members as sql;

/// The exit code of an instance that finds itself declared lost or replaced.
pub(crate) const EXIT_LOST: i32 = 3;

/// What membership knows of this instance's heartbeat, and shows on `/metrics`.
#[derive(Default)]
pub(crate) struct Stats {
    /// `(when the last renewed heartbeat was sent, since when the renewals have had no gap)`.
    renewals: Mutex<Renewals>,
    /// Instances by state, as the heartbeat task last read them.
    by_state: Mutex<Vec<(String, i64)>>,
    /// Calls closed because their instance was gone (by the reaper here, or at registration).
    pub(crate) reaped_calls: AtomicU64,
}

impl Stats {
    fn renewals(&self) -> std::sync::MutexGuard<'_, Renewals> {
        self.renewals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A heartbeat sent at `sent` was renewed; a renewal more than `gap` after the previous one
    /// starts a new unbroken run.
    fn renewed(&self, sent: Instant, gap: Duration) {
        let mut r = self.renewals();
        let unbroken = r
            .last
            .is_some_and(|last| sent.saturating_duration_since(last) <= gap);
        if !unbroken {
            r.since = Some(sent);
        }
        r.last = Some(sent);
    }

    fn last_renewed(&self) -> Option<Instant> {
        self.renewals().last
    }

    /// Whether this instance's own heartbeat has been renewed without a gap (see [`gap`]) for
    /// at least `lease`, and lately: only then may its reaper judge others' leases. After an
    /// outage of the database every lease has run out, and a reaper that acted at once would
    /// declare lost the peers that had not yet beaten again; waiting one unbroken lease lets
    /// every live peer renew first.
    pub(crate) fn steady_for(&self, lease: Duration, gap: Duration) -> bool {
        let r = self.renewals();
        match (r.last, r.since) {
            (Some(last), Some(since)) => last.elapsed() <= gap && since.elapsed() >= lease,
            _ => false,
        }
    }

    /// Seconds since the last renewed heartbeat was sent (0 before the first).
    pub(crate) fn heartbeat_age(&self) -> f64 {
        self.last_renewed()
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0)
    }

    pub(crate) fn by_state(&self) -> Vec<(String, i64)> {
        self.by_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn count_reaped(&self, n: usize) {
        self.reaped_calls.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The renewals of this instance's heartbeat ([`Stats::renewed`]).
#[derive(Default)]
struct Renewals {
    last: Option<Instant>,
    since: Option<Instant>,
}

/// The longest time between two renewals of one unbroken run: the fence's delay. A database
/// outage shorter than that cannot have run out a live peer's lease (its last beat before and
/// its first after add at most two heartbeats), so only a longer one makes the reaper wait.
pub(crate) fn gap(cluster: &Cluster) -> Duration {
    fence_after(cluster)
}

/// Why this instance could not register.
#[derive(Debug, thiserror::Error)]
#[error("cannot register this instance ({name}) in the cluster's database (store.url): {source}")]
pub(crate) struct RegisterError {
    name: String,
    #[source]
    source: sqlx_core::Error,
}

/// Registers this instance (see the module docs); nothing without a cluster. Must complete
/// before the listener serves. The previous incarnation's legs are hung up in the background.
pub(crate) async fn register(app: &Arc<App>) -> Result<(), RegisterError> {
    let Some(cluster) = app.cluster.clone() else {
        return Ok(());
    };
    let me = sql::Me {
        name: &cluster.name,
        incarnation: &cluster.incarnation,
        internal_url: &cluster.internal_url,
        advertise_url: &cluster.advertise_url,
        version: env!("CARGO_PKG_VERSION"),
        max_calls: i64::try_from(app.server.max_calls).unwrap_or(i64::MAX),
    };
    let sent = Instant::now();
    let done = sql::register(&cluster.pool, &me)
        .await
        .map_err(|source| RegisterError {
            name: cluster.name.clone(),
            source,
        })?;
    cluster.members.renewed(sent, gap(&cluster));
    if done.previous_live.is_some() || !done.calls.is_empty() || done.slots > 0 {
        warn!(
            instance = %cluster.name,
            previous_state = done.previous_live.as_deref().unwrap_or("-"),
            calls = done.calls.len(),
            slots = done.slots,
            "closed what this instance's previous run left open (its calls failed, legs hung up, slots freed)"
        );
    }
    cluster.members.count_reaped(done.calls.len());
    super::reaper::hang_up_legs(app, done.calls);
    info!(instance = %cluster.name, incarnation = %cluster.incarnation, "registered in the cluster");
    Ok(())
}

/// The state this instance writes in its row now.
fn state_of(app: &App) -> &'static str {
    if app.is_draining() {
        "draining"
    } else {
        "ready"
    }
}

/// How long after the last renewed beat this instance stops admitting.
fn fence_after(cluster: &Cluster) -> Duration {
    let t = cluster.timing;
    t.lease.saturating_sub(t.heartbeat.saturating_mul(2))
}

/// Starts the heartbeat of `app` (a no-op without a cluster): a beat every `timing.heartbeat`,
/// and one at once when the drain begins. It ends when `app` is dropped or its row is stopped.
pub(crate) fn start(app: &Arc<App>) {
    let Some(cluster) = app.cluster.clone() else {
        return;
    };
    let weak: Weak<App> = Arc::downgrade(app);
    let mut drain = app.draining.subscribe();
    tokio::spawn(async move {
        let mut tick =
            tokio::time::interval(cluster.timing.heartbeat.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = drain.changed() => if changed.is_err() { return },
            }
            let Some(app) = weak.upgrade() else { return };
            if beat(&app, &cluster).await == Beat::Stopped {
                return;
            }
        }
    });
}

#[derive(Debug, PartialEq, Eq)]
enum Beat {
    Renewed,
    Failed,
    Stopped,
}

/// One heartbeat, and what follows from its answer (fence, unfence, exit).
async fn beat(app: &App, cluster: &Cluster) -> Beat {
    let state = state_of(app);
    let sent = Instant::now();
    let fence_at = cluster.members.last_renewed().unwrap_or(sent) + fence_after(cluster);
    // A beat may take until the fence is due (a slow database is not yet a lost one).
    let wait = fence_at
        .saturating_duration_since(sent)
        .max(cluster.timing.heartbeat);
    let live = i64::try_from(app.calls.len()).unwrap_or(i64::MAX);
    let answer = tokio::time::timeout(
        wait,
        sql::heartbeat(
            &cluster.pool,
            &cluster.name,
            &cluster.incarnation,
            live,
            state,
        ),
    )
    .await;
    let mut failure = String::new();
    let outcome = match answer {
        Ok(Ok(Some(s))) if s == "lost" => exit_lost(
            cluster,
            "a peer declared this instance lost (its heartbeat was not renewed within the lease) \
             and closed its calls",
        ),
        Ok(Ok(None)) => exit_lost(
            cluster,
            "this instance's row belongs to another incarnation (another process started with \
             the same instance_name)",
        ),
        Ok(Ok(Some(s))) if s == "stopped" => Beat::Stopped,
        Ok(Ok(Some(_))) => {
            cluster.members.renewed(sent, gap(cluster));
            if app.set_fenced(false) {
                info!(instance = %cluster.name, "heartbeat renewed again: admitting new calls");
            }
            Beat::Renewed
        }
        Ok(Err(e)) => {
            debug!(error = %e, "heartbeat failed");
            failure = e.to_string();
            Beat::Failed
        }
        Err(_) => {
            debug!(waited_ms = wait.as_millis() as u64, "heartbeat timed out");
            failure = format!("no answer within {} ms", wait.as_millis());
            Beat::Failed
        }
    };
    if outcome == Beat::Failed && Instant::now() >= fence_at && !app.set_fenced(true) {
        error!(
            instance = %cluster.name,
            fence_after_ms = fence_after(cluster).as_millis() as u64,
            error = %failure,
            "the heartbeat could not be renewed in time: not ready, refusing new calls until it is"
        );
    }
    if outcome == Beat::Renewed {
        match sql::count_by_state(&cluster.pool).await {
            Ok(counts) => {
                *cluster
                    .members
                    .by_state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = counts
            }
            Err(e) => debug!(error = %e, "cannot count the instances by state"),
        }
    }
    outcome
}

/// Ends the process: this instance is out of the cluster and must not act for its calls.
fn exit_lost(cluster: &Cluster, why: &str) -> ! {
    error!(instance = %cluster.name, incarnation = %cluster.incarnation, "{why}; exiting so a fresh incarnation can start");
    // A plain exit, not a drain: this instance's calls were already closed (or belong to the
    // other incarnation) and their legs hung up by a peer, so nothing here may act on them
    // again — not the drain's hang-ups, not the store's writes. std::process::exit runs no
    // destructors, which is what is wanted.
    std::process::exit(EXIT_LOST)
}

/// Marks this instance `stopped` at a clean exit (peers never reap a stopped instance). Call it
/// after the store has flushed the calls' ends.
pub(crate) async fn stop(app: &App) {
    let Some(cluster) = &app.cluster else { return };
    write(app, cluster, "stopped").await;
}

async fn write(app: &App, cluster: &Cluster, state: &str) {
    let live = i64::try_from(app.calls.len()).unwrap_or(i64::MAX);
    let write = sql::heartbeat(
        &cluster.pool,
        &cluster.name,
        &cluster.incarnation,
        live,
        state,
    );
    match tokio::time::timeout(Duration::from_secs(3), write).await {
        Ok(Ok(Some(s))) => info!(instance = %cluster.name, state = %s, "cluster state written"),
        Ok(Ok(None)) => {
            warn!(instance = %cluster.name, "cannot write this instance's state: its row is another incarnation's")
        }
        Ok(Err(e)) => {
            warn!(instance = %cluster.name, state, error = %e, "cannot write this instance's state")
        }
        Err(_) => {
            warn!(instance = %cluster.name, state, "cannot write this instance's state: no answer within 3 s")
        }
    }
}

/// The cluster's lines of `/metrics` (none without a cluster): instances by state (as the
/// heartbeat task last read them), this instance's heartbeat age and the calls reaped here.
pub(crate) fn render(app: &App, s: &mut String) {
    use std::fmt::Write as _;
    let Some(cluster) = &app.cluster else { return };
    let m = &cluster.members;
    let name = "patterd_cluster_instances";
    let _ = writeln!(
        s,
        "# HELP {name} Instances in the cluster's table by state.\n# TYPE {name} gauge"
    );
    for (state, n) in m.by_state() {
        let _ = writeln!(s, "{name}{{state=\"{state}\"}} {n}");
    }
    let name = "patterd_cluster_heartbeat_age_seconds";
    let _ = writeln!(
        s,
        "# HELP {name} Seconds since this instance's last renewed heartbeat was sent.\n# TYPE {name} gauge\n{name} {:.3}",
        m.heartbeat_age()
    );
    let name = "patterd_cluster_reaped_calls_total";
    let _ = writeln!(
        s,
        "# HELP {name} Calls this instance closed because their instance was gone (reaper, or its own previous run).\n# TYPE {name} counter\n{name} {}",
        m.reaped_calls.load(Ordering::Relaxed)
    );
}
