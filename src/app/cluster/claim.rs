//! This instance's side of the cluster-wide replay guards: claiming a call id as its owner,
//! closing a claim whose call could not start, the replay guard's `webhook_seen` keys (pruned
//! here at most hourly, a day after they were seen), all on the shared store's pool with a
//! bounded wait — a store that does not answer is a failure, never a hang. The SQL is
//! `store::postgres::claim`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tracing::{info, warn};

use super::Cluster;
use crate::store::postgres::claim as sql;
use crate::store::{NewCall, now_ms};

/// Longest a claim or a replay check waits for the store before it counts as failed.
pub(crate) const GUARD_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a replay guard key is kept at most (the longest window in use: Plivo's nonces).
const SEEN_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How often old replay guard keys are deleted.
const PRUNE_EVERY_MS: i64 = 3_600_000;

/// When this process last started deleting old replay guard keys (epoch ms; 0: never).
static LAST_PRUNE: AtomicI64 = AtomicI64::new(0);

/// A store statement that failed or did not answer in time.
async fn bounded<T>(
    what: &str,
    f: impl Future<Output = Result<T, sqlx_core::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(GUARD_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!(
            "{what}: no answer within {} s",
            GUARD_TIMEOUT.as_secs()
        )),
    }
}

impl Cluster {
    /// Claims `call`'s id for this instance (its row, owned by this instance's name): true
    /// when this instance is now the call's owner, false when another claim came first.
    pub(crate) async fn claim_call(&self, call: &NewCall) -> Result<bool, String> {
        bounded(
            "claiming the call id",
            sql::claim_call(&self.pool, call, &self.name, now_ms()),
        )
        .await
    }

    /// Closes the row this instance claimed for `call_id`, whose call did not start.
    pub(crate) async fn end_unstarted(&self, call_id: &str, reason: &str) {
        let done = bounded(
            "closing an unstarted call",
            sql::end_unstarted(&self.pool, call_id, &self.name, reason, now_ms()),
        )
        .await;
        if let Err(e) = done {
            warn!(call_id, error = %e, "a claimed call that did not start stays open in the store");
        }
    }

    /// True the first time `key` is seen in `scope` within `ttl`, cluster-wide.
    pub(crate) async fn first_seen(
        &self,
        scope: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, String> {
        self.prune_seen_now_and_then();
        bounded(
            "the replay guard",
            sql::first_seen(&self.pool, scope, key, ttl.as_secs_f64()),
        )
        .await
    }

    /// Deletes replay guard keys older than a day, in the background, at most hourly.
    fn prune_seen_now_and_then(&self) {
        let now = now_ms();
        let last = LAST_PRUNE.load(Ordering::Relaxed);
        if now - last < PRUNE_EVERY_MS
            || LAST_PRUNE
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let pool = self.pool.clone();
        tokio::spawn(async move {
            match sql::prune_seen(&pool, SEEN_KEPT.as_secs_f64()).await {
                Ok(0) => {}
                Ok(n) => info!(keys = n, "pruned old webhook replay keys"),
                Err(e) => warn!(error = %e, "pruning old webhook replay keys failed"),
            }
        });
    }
}
