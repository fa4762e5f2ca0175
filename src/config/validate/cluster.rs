//! The checks of `[cluster]`: the instance name, the URLs and credential that only a cluster
//! (the PostgreSQL store) uses, and timings under which one slow heartbeat cannot make peers
//! declare an instance lost.

use super::Check;
use crate::config::Config;

/// `[cluster]`: a well-formed name; the other keys only with the PostgreSQL store, well-formed
/// URLs, a credential peers can send, and a lease that outlives a few missed heartbeats.
pub(super) fn check(c: &mut Check, config: &Config) {
    use crate::config::schema::StoreBackend;
    let cl = &config.cluster;
    if let Some(name) = &cl.instance_name {
        let ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'));
        if !ok {
            c.fail(
                &["cluster", "instance_name"],
                format!(
                    "[cluster] instance_name = {name:?}: use 1-63 letters, digits, '-', '_' or '.' \
                     (e.g. the pod or host name)"
                ),
            );
        }
    }
    let postgres = config.store.backend == StoreBackend::Postgres;
    for (key, value) in [
        ("advertise_url", &cl.advertise_url),
        ("internal_url", &cl.internal_url),
    ] {
        let Some(value) = value else { continue };
        if !postgres {
            c.fail(
                &["cluster", key],
                format!(
                    "[cluster] {key} only applies to instances sharing a PostgreSQL store; \
                     set [store] backend = \"postgres\" or remove it"
                ),
            );
        } else if !(key == "advertise_url" && value == "auto") {
            c.url(
                &["cluster", key],
                value,
                &["http", "https"],
                "https://voice.example.com/i/patterd-0",
            );
        }
    }
    if postgres {
        let token = cl.token.as_ref().unwrap_or(&config.server.api_token);
        if token.expose().is_empty() && !config.server.api_is_local() {
            c.fail(
                &["cluster", "token"],
                "instances sharing a PostgreSQL store forward actions to each other with a \
                 credential: set [server] api_token, or [cluster] token = \"${PATTERD_CLUSTER_TOKEN}\""
                    .to_string(),
            );
        }
    }
    for (key, value) in [
        ("heartbeat_ms", cl.heartbeat_ms),
        ("reaper_ms", cl.reaper_ms),
        ("forward_timeout_ms", cl.forward_timeout_ms),
        ("settings_poll_ms", cl.settings_poll_ms),
    ] {
        if value < 50 {
            c.fail(
                &["cluster", key],
                format!("[cluster] {key} = {value}: use at least 50 (milliseconds)"),
            );
        }
    }
    if cl.lease_ms < cl.heartbeat_ms.saturating_mul(3) {
        c.fail(
            &["cluster", "lease_ms"],
            format!(
                "[cluster] lease_ms = {} must be at least 3 × heartbeat_ms ({}), so one slow \
                 heartbeat does not make peers declare this instance lost",
                cl.lease_ms,
                cl.heartbeat_ms.saturating_mul(3)
            ),
        );
    }
}
