//! The outbound caps across the cluster (`[outbound] max_concurrent`, `max_per_day` with the
//! PostgreSQL store): each reservation is an `outbound_slots` row granted under the caps' row
//! lock (`store::postgres::caps`), so N instances together hold exactly the cap. What this
//! module decides is the slot's life around that statement:
//!
//! - **reserve** before the carrier is dialled; a database error refuses the call (fail closed:
//!   nobody can tell whether the cap still has room), with an error that says so;
//! - **bind** the slot to the call id the carrier returned, before the call's row is queued, so
//!   the day's count (slots of today + today's calls no slot covers) never counts a call twice;
//! - **release** when the call ends, or at once when the dial failed — after the store has
//!   committed what was queued, so the call's row is there to count toward the day when its
//!   slot goes (a release never happens from `Drop` itself: it is spawned);
//! - **sweep** every lease: slots whose call has ended (a release that was lost), and this
//!   instance's own slots that this process does not hold (a previous run's, a failed release),
//!   once they are older than [`ORPHAN_GRACE`]. A lost instance's slots are the reaper's
//!   (`store::postgres::caps::release_instance`); until then they count (fail closed).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tracing::{debug, warn};

use super::Cluster;
use crate::app::App;
use crate::app::dialer::CapError;
use crate::store::now_ms;
use crate::store::postgres::caps as sql;

/// How old a slot of this instance that this process does not hold must be before the sweep
/// deletes it (a reservation in flight is held within milliseconds of its insert).
pub(crate) const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// The slots this process holds: reservations in flight and bound to live calls.
#[derive(Default)]
pub(crate) struct HeldSlots(Mutex<BTreeSet<i64>>);

impl HeldSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<i64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, slot: i64) {
        self.lock().insert(slot);
    }

    fn remove(&self, slot: i64) {
        self.lock().remove(&slot);
    }

    /// How many slots this process holds.
    #[allow(dead_code)] // tests (not yet written)
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn snapshot(&self) -> Vec<i64> {
        self.lock().iter().copied().collect()
    }
}

/// Reserves a slot under the caps for a call from `from`; see the module docs.
pub(crate) async fn reserve(app: &App, cluster: &Cluster, from: &str) -> Result<i64, CapError> {
    let limits = app.config().outbound.clone();
    let now = now_ms();
    let ask = sql::Ask {
        instance: &cluster.name,
        from,
        max_concurrent: i64::try_from(limits.max_concurrent).unwrap_or(i64::MAX),
        max_per_day: i64::from(limits.max_per_day),
        day_start: crate::app::dialer::day_start(now),
        now,
    };
    let granted = sql::reserve(&cluster.pool, &ask).await.map_err(|e| {
        warn!(error = %e, "the outbound caps could not be checked; refusing the call");
        CapError::Unavailable(e.to_string())
    })?;
    match granted.slot {
        Some(slot) => {
            app.outbound_caps.slots.insert(slot);
            debug!(
                slot,
                live = granted.live,
                today = granted.today,
                "outbound slot reserved"
            );
            Ok(slot)
        }
        None if granted.live >= ask.max_concurrent => Err(CapError::Concurrent {
            live: usize::try_from(granted.live).unwrap_or(usize::MAX),
        }),
        None => Err(CapError::Daily {
            today: u64::try_from(granted.today).unwrap_or(0),
        }),
    }
}

/// Binds `slot` to `call_id`; a failure is logged and otherwise harmless (the slot still
/// counts, the call's row may count beside it until the slot goes: fail closed).
pub(crate) async fn bind(cluster: &Cluster, slot: i64, call_id: &str) {
    if let Err(e) = sql::bind(&cluster.pool, slot, call_id).await {
        warn!(slot, call_id, error = %e, "could not bind the outbound slot to its call; it is freed when the call ends");
    }
}

/// Releases `slot` in a task of its own: when `call_id`'s call has finished if `after_call`,
/// and (when the slot has a call) once the store committed what was queued. Without a runtime
/// (a process tearing down) the slot is left to the sweep.
pub(crate) fn release_later(app: &Arc<App>, slot: i64, call_id: Option<String>, after_call: bool) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        app.outbound_caps.slots.remove(slot);
        return;
    };
    let Some(cluster) = app.cluster.clone() else {
        return;
    };
    let app = app.clone();
    rt.spawn(async move {
        if let Some(id) = &call_id {
            if after_call {
                app.calls.wait_finished(id).await;
            }
            // The call's row must be committed before its slot stops counting it for the day.
            if let Err(e) = app.store.tx.flush().await {
                warn!(slot, call_id = %id, error = %e, "the store did not commit the call; its outbound slot is left to the sweep");
                app.outbound_caps.slots.remove(slot);
                return;
            }
        }
        if let Err(e) = sql::release(&cluster.pool, slot).await {
            warn!(slot, error = %e, "could not free an outbound slot; the sweep frees it");
        }
        app.outbound_caps.slots.remove(slot);
    });
}

/// Runs the sweep every `timing.lease` while `app` lives.
pub(crate) fn start_sweep(app: &Arc<App>) {
    let Some(cluster) = app.cluster.clone() else {
        return;
    };
    let weak: Weak<App> = Arc::downgrade(app);
    let every = cluster.timing.lease.max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(app) = weak.upgrade() else { return };
            sweep_once(&app, &cluster).await;
        }
    });
}

/// One sweep; see the module docs. Returns how many slots it deleted.
pub(crate) async fn sweep_once(app: &App, cluster: &Cluster) -> u64 {
    let held = app.outbound_caps.slots.snapshot();
    let older_than = now_ms() - ORPHAN_GRACE.as_millis() as i64;
    match sql::sweep(&cluster.pool, &cluster.name, &held, older_than).await {
        Ok(0) => 0,
        Ok(n) => {
            debug!(slots = n, "swept outbound slots of ended calls");
            n
        }
        Err(e) => {
            warn!(error = %e, "the outbound slot sweep failed; it runs again at the next lease");
            0
        }
    }
}
