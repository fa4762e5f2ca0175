//! The cluster's reaper: one instance at a time declares lost the instances whose lease ran out
//! (on the database's clock), closes their open calls as failed, frees their outbound slots and
//! then hangs their carrier legs up over the carrier's REST API — a caller whose instance
//! vanished without closing the media socket (a node lost) is not left on a silent line, and a
//! partitioned instance's media ends at the carrier for real (the carrier is the fence).
//!
//! Every instance runs this task, but only while its own heartbeat has been renewed without a
//! gap for a lease (after an outage of the database, every live peer beats again before anyone
//! is judged); the one whose dedicated connection holds the session advisory
//! lock `store::postgres::members::REAPER_LOCK` acts, every `[cluster] reaper_ms`, on that same
//! connection (so it acts only while it holds the lock). When that connection dies the server
//! releases the lock and another instance's next try takes it. So that a leader whose node
//! vanished without closing its socket does not hold the lock for as long as TCP takes to
//! notice, its session is given an `idle_session_timeout` (PostgreSQL ≥ 14; ignored before):
//! a leader that stops issuing statements is disconnected by the server itself.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx_core::connection::Connection as _;
use sqlx_core::query::query;
use sqlx_postgres::{PgConnection, Postgres};
use tracing::{debug, info, warn};

use super::Cluster;
use crate::app::App;
use crate::store::postgres::members::{self as sql, ReapedCall};

/// Hang-ups sent at once to the carriers.
const HANG_UP_CONCURRENCY: usize = 16;
/// The longest wait for one hang-up.
const HANG_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the reaper task of `app` (a no-op without a cluster); it ends when `app` is dropped.
pub(crate) fn start(app: &Arc<App>) {
    let Some(cluster) = app.cluster.clone() else {
        return;
    };
    let weak = Arc::downgrade(app);
    tokio::spawn(run(weak, cluster));
}

async fn run(weak: Weak<App>, cluster: Arc<Cluster>) {
    let every = cluster.timing.reaper.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<PgConnection> = None;
    let mut leading = false;
    loop {
        tick.tick().await;
        let Some(app) = weak.upgrade() else { return };
        // Only a steadily beating instance judges others' leases (`members::Stats::steady_for`);
        // a leader that is not gives the lock up for a peer that is.
        if !cluster
            .members
            .steady_for(cluster.timing.lease, super::members::gap(&cluster))
        {
            if leading {
                info!(instance = %cluster.name, "giving up the reaper's lead: this instance's heartbeat is not steady");
                conn = None;
                leading = false;
            }
            continue;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match connect(&cluster).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    debug!(error = %e, "the reaper cannot connect; trying again");
                    continue;
                }
            },
        };
        if !leading {
            match sql::try_lead(c).await {
                Ok(true) => {
                    leading = true;
                    info!(instance = %cluster.name, "this instance is the cluster's reaper");
                }
                Ok(false) => continue,
                Err(e) => {
                    debug!(error = %e, "the reaper's lock could not be tried; reconnecting");
                    conn = None;
                    continue;
                }
            }
        }
        match sql::reap(c, &cluster.name, cluster.timing.lease).await {
            Ok(r) if r.lost.is_empty() => {}
            Ok(r) => {
                warn!(
                    instances = ?r.lost,
                    calls = r.calls.len(),
                    slots = r.slots,
                    "declared instances lost (lease ran out): their calls failed, slots freed; hanging their legs up"
                );
                cluster.members.count_reaped(r.calls.len());
                hang_up_legs(&app, r.calls);
            }
            Err(e) => {
                warn!(error = %e, "the reaper's pass failed; giving up the lead and reconnecting");
                conn = None;
                leading = false;
            }
        }
    }
}

/// The reaper's own connection (not the pool's: the lock lives as long as this session).
async fn connect(cluster: &Cluster) -> Result<PgConnection, sqlx_core::Error> {
    let options = cluster.pool.connect_options().as_ref().clone();
    let mut conn = PgConnection::connect_with(&options).await?;
    let t = cluster.timing;
    let idle = t.lease.saturating_mul(2).max(t.reaper.saturating_mul(3));
    let set = format!("SET idle_session_timeout = {}", idle.as_millis());
    if let Err(e) = query::<Postgres>(sqlx_core::sql_str::AssertSqlSafe(set))
        .execute(&mut conn)
        .await
    {
        debug!(error = %e, "idle_session_timeout not set on the reaper's connection");
    }
    Ok(conn)
}

/// Hangs up the carrier legs of `calls` (closed because their instance is gone) in the
/// background, a few at a time; logs the counts (never a number).
pub(crate) fn hang_up_legs(app: &Arc<App>, calls: Vec<ReapedCall>) {
    if calls.is_empty() {
        return;
    }
    let app = app.clone();
    tokio::spawn(async move {
        let limit = Arc::new(tokio::sync::Semaphore::new(HANG_UP_CONCURRENCY));
        let mut tasks = tokio::task::JoinSet::new();
        let mut no_carrier = 0usize;
        for call in calls {
            let Some(carrier) = app.carriers.for_account(&call.account).cloned() else {
                no_carrier += 1;
                continue;
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                break;
            };
            tasks.spawn(async move {
                let _permit = permit;
                let done = tokio::time::timeout(
                    HANG_UP_TIMEOUT,
                    carrier.hang_up(&call.account, &call.leg_id),
                )
                .await;
                match done {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        debug!(call_id = %call.call_id, error = %e, "hanging up a reaped call's leg failed");
                        false
                    }
                    Err(_) => {
                        debug!(call_id = %call.call_id, "hanging up a reaped call's leg timed out");
                        false
                    }
                }
            });
        }
        let (mut ok, mut failed) = (0usize, 0usize);
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(true) => ok += 1,
                _ => failed += 1,
            }
        }
        if failed > 0 || no_carrier > 0 {
            warn!(
                hung_up = ok,
                failed, no_carrier, "hung up the legs of reaped calls (some could not be)"
            );
        } else {
            info!(hung_up = ok, "hung up the legs of reaped calls");
        }
    });
}
