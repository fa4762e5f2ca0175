//! Runtime settings across the cluster: the inbound overrides (`configure_inbound`) written on
//! one instance are in force on every instance within a second. A change is written under the
//! setting's row lock with the next version and announced with `NOTIFY patterd_settings`
//! (`store::postgres::settings`); every instance LISTENs on a connection of its own (sqlx's
//! `PgListener`, which reconnects and re-subscribes by itself) and reads the setting again on
//! each notification and after each reconnect (notifications sent meanwhile are lost), and polls
//! the version every `[cluster] settings_poll_ms` as the fallback. A version is applied only
//! when it is newer than the one in force ([`Cluster::settings_version`]), so a slow read never
//! puts an older value back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx_postgres::{PgListener, PgPool, PgPoolOptions};
use tracing::{debug, info, warn};

use super::Cluster;
use crate::app::App;
use crate::app::inbound::{InboundOverride, Overrides, SETTING_KEY};
use crate::store::StoreError;
use crate::store::postgres::settings as sql;

/// Whether the sync task LISTENs (the daemon always does; tests switch it off to see the poll
/// alone at work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // `Off`: tests (not yet written)
pub(crate) enum Listen {
    On,
    Off,
}

/// Applies `key`'s change to the overrides in the database (under the row lock, merged into what
/// is stored there, so a peer's concurrent change to another number is kept), announces it, and
/// puts the result in force here. Returns every override.
pub(crate) async fn change_inbound(
    app: &App,
    cluster: &Cluster,
    key: &str,
    change: &InboundOverride,
) -> Result<Overrides, StoreError> {
    let (value, version) = sql::change(&cluster.pool, SETTING_KEY, "{}", |stored| {
        let mut all: Overrides = serde_json::from_str(stored)?;
        let merged = all.get(key).cloned().unwrap_or_default().merged(change);
        all.insert(key.to_string(), merged);
        serde_json::to_string(&all)
    })
    .await
    .map_err(|e| match e {
        sql::ChangeError::Db(e) => StoreError::Remote(e.to_string()),
        sql::ChangeError::Merge(e) => StoreError::Remote(format!(
            "the stored inbound overrides (setting `{SETTING_KEY}`) cannot be read: {e}; \
             fix or delete that row of the settings table"
        )),
    })?;
    apply(app, cluster, &value, version);
    Ok(app
        .inbound
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone())
}

/// Puts `value` (the overrides as stored) in force when `version` is newer than the one in
/// force. Returns whether it did.
pub(crate) fn apply(app: &App, cluster: &Cluster, value: &str, version: i64) -> bool {
    let parsed: Overrides = match serde_json::from_str(value) {
        Ok(p) => p,
        Err(e) => {
            warn!(version, error = %e, "the stored inbound overrides cannot be read; keeping the ones in force");
            return false;
        }
    };
    let mut all = app.inbound.write().unwrap_or_else(|e| e.into_inner());
    if version <= cluster.settings_version.load(Ordering::Acquire) {
        return false;
    }
    *all = parsed;
    cluster.settings_version.store(version, Ordering::Release);
    info!(version, "inbound overrides in force");
    true
}

/// Reads the overrides' version and applies a newer one. Returns whether it changed anything.
async fn resync(app: &App, cluster: &Cluster) -> bool {
    match sql::read(&cluster.pool, SETTING_KEY).await {
        Ok(Some((value, version))) => apply(app, cluster, &value, version),
        Ok(None) => false,
        Err(e) => {
            debug!(error = %e, "could not read the settings' versions; retrying at the next poll");
            false
        }
    }
}

/// Starts the settings sync of `app` (a no-op without a cluster); it ends when `app` is dropped.
pub(crate) fn start(app: &Arc<App>, listen: Listen) {
    let Some(cluster) = app.cluster.clone() else {
        return;
    };
    let weak = Arc::downgrade(app);
    tokio::spawn(run(weak, cluster, listen));
}

/// A pool of one connection for the listener, beside the read pool (so LISTEN never takes a
/// reader's connection).
fn listener_pool(cluster: &Cluster) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(cluster.pool.connect_options().as_ref().clone())
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx_core::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(sql::CHANNEL).await?;
    Ok(listener)
}

async fn run(weak: Weak<App>, cluster: Arc<Cluster>, listen: Listen) {
    let pool = (listen == Listen::On).then(|| listener_pool(&cluster));
    let mut listener: Option<PgListener> = None;
    // (Re)subscribe at once at start, then at most once per poll.
    let mut may_subscribe = true;
    let mut warned = false;
    let every = cluster.timing.settings_poll.max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if let (Some(pool), None, true) = (&pool, &listener, may_subscribe) {
            may_subscribe = false;
            match subscribe(pool).await {
                Ok(l) => {
                    debug!(channel = sql::CHANNEL, "listening for settings changes");
                    listener = Some(l);
                    warned = false;
                }
                Err(e) if !warned => {
                    warned = true;
                    warn!(error = %e, poll_ms = every.as_millis() as u64, "cannot LISTEN for settings changes; polling meanwhile");
                }
                Err(e) => debug!(error = %e, "cannot LISTEN for settings changes yet"),
            }
        }
        let woke = match &mut listener {
            Some(l) => tokio::select! {
                n = l.try_recv() => Some(n),
                _ = tick.tick() => None,
            },
            None => {
                tick.tick().await;
                may_subscribe = true;
                None
            }
        };
        match woke {
            // A change of another setting: nothing of ours moved.
            Some(Ok(Some(n))) if n.payload() != SETTING_KEY => continue,
            Some(Ok(Some(_))) => {}
            // The connection was lost and made again: what was sent meanwhile is read below.
            Some(Ok(None)) => debug!("the settings listener reconnected; resyncing"),
            Some(Err(e)) => {
                warn!(error = %e, "the settings listener failed; polling until it is back");
                listener = None;
            }
            None => {}
        }
        let Some(app) = weak.upgrade() else { return };
        resync(&app, &cluster).await;
    }
}
