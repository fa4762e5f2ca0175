//! `GET /v1/cluster` (operator): the instances sharing this store, each with its state,
//! version, URLs, capacity, live calls and heartbeat age (`store::postgres::roster`), and the
//! cluster's live calls in all; and the cluster-wide `live_calls` that `GET /v1/metrics`
//! adds in a cluster. On the SQLite store there is one instance and no cluster: `clustered`
//! is false and the list is empty.

use std::sync::Arc;

use serde_json::{Value, json};

use super::ApiError;
use crate::app::App;

/// The body of `GET /v1/cluster`.
pub(crate) async fn view(app: &Arc<App>) -> Result<Value, ApiError> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = app.cluster.as_ref() {
        let members = members(app, cluster).await?;
        let live_calls = live_sum(app, &cluster.name, &members);
        return Ok(json!({
            "clustered": true,
            "instance": cluster.name,
            "live_calls": live_calls,
            "instances": members,
        }));
    }
    Ok(json!({
        "clustered": false,
        "live_calls": app.calls.len(),
        "instances": [],
    }))
}

/// What `GET /v1/metrics` adds in a cluster: `{"live_calls": …, "instances_live": …}`;
/// `None` on the SQLite store.
pub(crate) async fn metrics(app: &Arc<App>) -> Result<Option<Value>, ApiError> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = app.cluster.as_ref() {
        let members = members(app, cluster).await?;
        return Ok(Some(json!({
            "live_calls": live_sum(app, &cluster.name, &members),
            "instances_live": members.iter().filter(|m| m.live).count(),
        })));
    }
    let _ = app;
    Ok(None)
}

#[cfg(feature = "postgres")]
async fn members(
    app: &App,
    cluster: &crate::app::cluster::Cluster,
) -> Result<Vec<crate::store::postgres::roster::Member>, ApiError> {
    let lease_ms = u64::try_from(cluster.timing.lease.as_millis()).unwrap_or(u64::MAX);
    crate::store::postgres::roster::members(&cluster.pool, lease_ms)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "the cluster's instances could not be read");
            let _ = app;
            let mut err = ApiError::new(
                503,
                super::ErrorCode::StoreError,
                "the cluster's instances could not be read (the store did not answer); retry \
                 in a few seconds",
            );
            err.retry_after_s = Some(2);
            err
        })
}

/// The live calls of every live instance as of its last heartbeat, this one's as of now.
#[cfg(feature = "postgres")]
fn live_sum(app: &App, me: &str, members: &[crate::store::postgres::roster::Member]) -> i64 {
    let here = i64::try_from(app.calls.len()).unwrap_or(i64::MAX);
    members
        .iter()
        .filter(|m| m.live && m.name != me)
        .map(|m| m.live_calls)
        .sum::<i64>()
        + here
}
