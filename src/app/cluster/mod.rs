//! The cluster: this instance among N sharing one PostgreSQL store (`[store] backend =
//! "postgres"`). It owns this instance's identity in the cluster (its name, a random
//! incarnation drawn at start, the three URLs of `docs/scale-out.md`: the shared `public_url`,
//! its own `advertise_url` for the media sockets and callbacks of the calls it owns, and the
//! `internal_url` peers forward to), the timings of `[cluster]`, and the database pool its
//! statements run on. Membership (heartbeat, lease, reaper), forwarding to a call's owner, the
//! shared caps and replay guards build on it. With the SQLite store there is no `Cluster`: one
//! instance, everything local, as before.

#[cfg(feature = "postgres")]
pub(crate) mod caps;
#[cfg(feature = "postgres")]
mod claim;
#[cfg(feature = "postgres")]
pub(crate) mod forward;
#[cfg(feature = "postgres")]
pub(crate) mod handoff;
#[cfg(feature = "postgres")]
pub(crate) mod members;
#[cfg(feature = "postgres")]
pub(crate) mod owners;
#[cfg(feature = "postgres")]
pub(crate) mod reaper;
#[cfg(feature = "postgres")]
pub(crate) mod settings;

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::Config;
use crate::config::schema::StoreBackend;
use crate::util::secret::Secret;

/// `[cluster]` timings, as durations.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat: Duration,
    pub lease: Duration,
    pub reaper: Duration,
    pub forward_timeout: Duration,
    pub settings_poll: Duration,
}

impl Timing {
    pub(crate) fn of(config: &crate::config::schema::ClusterConfig) -> Self {
        let ms = Duration::from_millis;
        Self {
            heartbeat: ms(config.heartbeat_ms),
            lease: ms(config.lease_ms),
            reaper: ms(config.reaper_ms),
            forward_timeout: ms(config.forward_timeout_ms),
            settings_poll: ms(config.settings_poll_ms),
        }
    }
}

/// This instance in the cluster.
#[cfg(feature = "postgres")]
pub struct Cluster {
    /// `[cluster] instance_name` (the owner recorded for each call this instance admits).
    pub name: String,
    /// Drawn at each process start: tells this run from the previous one of the same name.
    pub incarnation: String,
    /// Where carriers reach this instance for its calls' media and callbacks.
    pub advertise_url: String,
    /// Where peers reach this instance.
    pub internal_url: String,
    /// The credential forwarded requests carry (`[cluster] token`, else `server.api_token`).
    pub token: Secret,
    pub timing: Timing,
    /// The store's pool.
    pub pool: sqlx_postgres::PgPool,
    /// The version of the inbound overrides in force here (`settings`).
    pub(crate) settings_version: std::sync::atomic::AtomicI64,
    /// Membership's figures for `/metrics` (`members`).
    pub(crate) members: members::Stats,
    /// The HTTP client for requests forwarded to a call's owner.
    pub(crate) peers: forward::Peers,
    /// The owners of calls recently forwarded to (`owners`): later forwards skip the lookup.
    pub(crate) owners: owners::OwnerCache,
}

#[cfg(feature = "postgres")]
impl Cluster {
    /// The cluster for `config`, when its store is PostgreSQL (`pool` from the opened store).
    pub(crate) fn new(config: &Config, pool: sqlx_postgres::PgPool) -> Self {
        let c = &config.cluster;
        let name = c.instance_name();
        let token = c
            .token
            .clone()
            .unwrap_or_else(|| config.server.api_token.clone());
        let timing = Timing::of(c);
        Self {
            peers: forward::Peers::new(&name, token.clone(), timing.forward_timeout),
            name,
            incarnation: crate::util::instance_id().to_string(),
            advertise_url: c
                .advertise_url
                .clone()
                .unwrap_or_else(|| config.server.public_url.clone()),
            internal_url: c
                .internal_url
                .clone()
                .unwrap_or_else(|| format!("http://{}", config.server.listen)),
            token,
            timing,
            pool,
            settings_version: Default::default(),
            members: Default::default(),
            owners: Default::default(),
        }
    }
}

/// Fills in the `[cluster]` URLs that depend on the bound listener, before the `App` is built:
/// `advertise_url = "auto"` becomes `http://<bound address>`, and a missing `internal_url`
/// becomes `http://<bound address>` (with an unspecified address such as `0.0.0.0`, the host
/// name and the bound port). Only with the PostgreSQL store; the SQLite store has no cluster.
pub(crate) fn resolve_urls(config: &mut Config, bound: SocketAddr) {
    if config.store.backend != StoreBackend::Postgres {
        return;
    }
    let here = if bound.ip().is_unspecified() {
        format!("http://{}:{}", crate::util::host_name(), bound.port())
    } else {
        format!("http://{bound}")
    };
    let c = &mut config.cluster;
    if c.advertise_url.as_deref() == Some("auto") {
        c.advertise_url = Some(here.clone());
    }
    if c.internal_url.is_none() {
        c.internal_url = Some(here);
    }
}

/// Registers this instance in the cluster (`members::register`: before the listener serves, so
/// `/readyz` never answers 200 for an unregistered instance); nothing without a cluster.
pub(crate) async fn join(app: &std::sync::Arc<crate::app::App>) -> Result<(), String> {
    #[cfg(feature = "postgres")]
    return members::register(app).await.map_err(|e| e.to_string());
    #[cfg(not(feature = "postgres"))]
    {
        let _ = app;
        Ok(())
    }
}

/// Marks this instance `stopped` at a clean exit (`members::stop`); nothing without a cluster.
pub(crate) async fn leave(app: &crate::app::App) {
    #[cfg(feature = "postgres")]
    members::stop(app).await;
    #[cfg(not(feature = "postgres"))]
    let _ = app;
}

/// Starts what keeps this instance in step with its peers (the heartbeat, the reaper, the
/// outbound slots' sweep, the settings sync); nothing without a cluster. The tasks end when
/// `app` is dropped.
pub(crate) fn start_sync(app: &std::sync::Arc<crate::app::App>) {
    #[cfg(feature = "postgres")]
    if app.cluster.is_some() {
        members::start(app);
        reaper::start(app);
        caps::start_sweep(app);
        settings::start(app, settings::Listen::On);
    }
    #[cfg(not(feature = "postgres"))]
    let _ = app;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_and_default_urls_follow_the_bound_address_only_on_postgres() {
        let mut config = Config::default();
        config.store.backend = StoreBackend::Postgres;
        config.cluster.advertise_url = Some("auto".into());
        resolve_urls(&mut config, "127.0.0.1:4321".parse().unwrap());
        assert_eq!(
            config.cluster.advertise_url.as_deref(),
            Some("http://127.0.0.1:4321")
        );
        assert_eq!(
            config.cluster.internal_url.as_deref(),
            Some("http://127.0.0.1:4321")
        );
        let mut sqlite = Config::default();
        sqlite.cluster.advertise_url = Some("auto".into());
        resolve_urls(&mut sqlite, "127.0.0.1:4321".parse().unwrap());
        assert_eq!(sqlite.cluster.advertise_url.as_deref(), Some("auto"));
        assert_eq!(sqlite.cluster.internal_url, None);
    }
}
