//! The replay guards behind the carriers' port: whether a call id is new (admission's claim)
//! and whether a webhook's nonce or event id was seen before ([`first_seen`]). With a shared
//! PostgreSQL store they are the cluster's (`app::cluster::claim`: the call's row inserted
//! once, `webhook_seen`), so a webhook replayed to any instance is refused; with the SQLite
//! store, one instance, they are this process's: the live-call registry and the call store
//! for call ids, bounded in-memory sets for nonces and event ids (`security::replay`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::info;

use super::App;
use super::metrics::{Metrics, RefusalReason};
use crate::carrier::port::{GuardUnavailable, Pending, Refusal};
use crate::security::replay::SeenSet;
use crate::security::{LOG_FIELD_MAX, truncate_for_log};
use crate::store::NewCall;

/// Keys one in-memory set remembers at most (per scope).
const LOCAL_CAPACITY: usize = 65_536;

/// The one-instance replay memory: a bounded set per scope, made on first use with the time
/// to live its first caller asks for.
#[derive(Default)]
pub(crate) struct LocalSeen {
    sets: Mutex<HashMap<&'static str, Arc<SeenSet>>>,
}

impl LocalSeen {
    fn first_use(&self, scope: &'static str, key: &str, ttl: Duration) -> bool {
        let set = self
            .sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(scope)
            .or_insert_with(|| Arc::new(SeenSet::new(ttl, LOCAL_CAPACITY)))
            .clone();
        set.first_use(key)
    }
}

/// How a call id was found new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This instance inserted the call's row in the shared store: it owns the call (the row
    /// is written; the writer must not queue it again).
    Shared,
    /// One instance: the id is neither live nor stored; the row is queued when the call starts.
    Local,
}

/// Claims `record`'s call id, or refuses a repeat. `what` says in the log what a repeat
/// means for this kind of call (a replayed webhook, a link used twice). A shared store that
/// cannot answer refuses the call busy (fail closed); one instance's store that cannot answer
/// refuses it as a repeat, as it always did.
pub(crate) async fn claim(app: &App, record: &NewCall, what: &str) -> Result<Claim, Refusal> {
    let repeated = || {
        Metrics::inc(&app.metrics.webhooks_replayed);
        app.metrics.webhooks_refused.inc(RefusalReason::Replayed);
        app.log_limited(&format!(
            "call refused: call id {} was already handled ({what})",
            truncate_for_log(&record.call_id, LOG_FIELD_MAX)
        ));
        Refusal::Repeated
    };
    if let Some(shared) = shared_claim(app, record).await {
        return match shared {
            Ok(true) => Ok(Claim::Shared),
            Ok(false) => Err(repeated()),
            Err(e) => {
                Metrics::inc(&app.metrics.calls_rejected_busy);
                app.metrics.webhooks_refused.inc(RefusalReason::StoreDown);
                app.log_limited(&format!(
                    "call refused busy: the call id cannot be claimed in the shared store ({e})"
                ));
                Err(Refusal::Unclaimed)
            }
        };
    }
    match app.store.has_call(&record.call_id).await {
        Ok(false) => Ok(Claim::Local),
        Ok(true) => Err(repeated()),
        Err(e) => {
            // Fail closed: a call we cannot check is not started.
            app.log_limited(&format!(
                "call refused: cannot check the call store for a repeated call id ({e})"
            ));
            Err(Refusal::Repeated)
        }
    }
}

/// A claimed call that could not start (`max_calls` reached after the claim): its shared row
/// is closed, so it does not stay open; a local claim wrote nothing.
pub(crate) async fn unstarted(app: &App, claim: Claim, call_id: &str, reason: &str) {
    if claim == Claim::Shared {
        info!(
            call_id,
            reason, "closing the claimed row of a call that did not start"
        );
        end_shared(app, call_id, reason).await;
    }
}

/// True the first time `key` is seen in `scope` within `ttl` (cluster-wide with a shared
/// store).
pub(crate) fn first_seen(
    app: &App,
    scope: &'static str,
    key: &str,
    ttl: Duration,
) -> Pending<'static, Result<bool, GuardUnavailable>> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = app.cluster.clone() {
        let key = key.to_string();
        return Box::pin(async move {
            cluster
                .first_seen(scope, &key, ttl)
                .await
                .map_err(GuardUnavailable)
        });
    }
    let fresh = app.replay.first_use(scope, key, ttl);
    Box::pin(std::future::ready(Ok(fresh)))
}

/// The shared store's claim, or `None` without one.
async fn shared_claim(app: &App, record: &NewCall) -> Option<Result<bool, String>> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = &app.cluster {
        return Some(cluster.claim_call(record).await);
    }
    let _ = (app, record);
    None
}

async fn end_shared(app: &App, call_id: &str, reason: &str) {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = &app.cluster {
        cluster.end_unstarted(call_id, reason).await;
    }
    let _ = (app, call_id, reason);
}
