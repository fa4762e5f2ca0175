//! `GET /metrics`: the daemon's metrics ([`crate::app::Metrics`]: counters and latency
//! histograms) and the gauges of live state (calls, queue depths, draining) in the Prometheus
//! text format.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hyper::Response;

use crate::app::App;
use crate::net::http::{Body, respond};

/// Gauges read from live state when the page is rendered: name, help, value.
pub(crate) fn gauges(app: &App) -> Vec<(&'static str, &'static str, u64)> {
    let sockets_in_use = crate::app::media_socket_limit(&app.config())
        .saturating_sub(app.media_sockets.available_permits());
    vec![
        (
            "patterd_calls_active",
            "Calls live now.",
            app.calls.len() as u64,
        ),
        (
            "patterd_store_queue_depth",
            "Writes waiting for the call store's writer thread.",
            app.store.tx.queue_depth() as u64,
        ),
        (
            "patterd_media_sockets_open",
            "Carrier media sockets open now (each holds a permit).",
            sockets_in_use as u64,
        ),
        (
            "patterd_outbound_calls_live",
            "Outbound calls placed and not yet ended.",
            app.outbound_live() as u64,
        ),
        (
            "patterd_draining",
            "1 while the daemon drains.",
            u64::from(app.is_draining()),
        ),
        (
            "patterd_webhook_deliveries_pending",
            "Webhook deliveries waiting in the outbox (due now or scheduled for a retry).",
            app.outbox.pending.load(Ordering::Relaxed),
        ),
        (
            "patterd_webhook_deliveries_held",
            "call.ended deliveries waiting for the call's summary.",
            app.outbox.held.load(Ordering::Relaxed),
        ),
        (
            "patterd_webhook_dead_letters",
            "Webhook deliveries given up (GET /v1/webhooks/deliveries?state=dead).",
            app.outbox.dead.load(Ordering::Relaxed),
        ),
        (
            "patterd_calls_capacity",
            "The calls this instance takes at most (server.max_calls).",
            app.server.max_calls as u64,
        ),
    ]
}

/// The metrics page.
pub fn render(app: &App) -> Response<Body> {
    let mut s = String::new();
    app.metrics.render(&mut s);
    let dropped = app.store.tx.dropped();
    let name = "patterd_store_writes_dropped_total";
    let _ = writeln!(
        s,
        "# HELP {name} Timeline events not stored because the store's queue was full (disk stalled).\n# TYPE {name} counter\n{name} {dropped}"
    );
    app.store.stats.render(&mut s);
    let providers = app.providers();
    for (name, help, v) in [
        (
            "patterd_tts_fallbacks_total",
            "Sentences a TTS chain gave to its next TTS (connect error, 5xx, 429, no first audio in time).",
            crate::app::Metrics::get(&providers.tts_fallbacks),
        ),
        (
            "patterd_provider_switches_total",
            "Turns a fallback chain handed to its next brain after one failed before its first token.",
            crate::app::Metrics::get(&providers.llm_switches),
        ),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    }
    reloads(&mut s, app);
    for (name, help, v) in gauges(app) {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    #[cfg(feature = "postgres")]
    crate::app::cluster::members::render(app, &mut s);
    respond(200, "text/plain; version=0.0.4", Bytes::from(s))
}

/// Config reloads (SIGHUP) by result: `applied`, or `refused` (the file was invalid or its
/// providers could not be built; the running configuration was kept).
fn reloads(s: &mut String, app: &App) {
    let r = &app.reloads;
    let name = "patterd_config_reloads_total";
    let _ = writeln!(
        s,
        "# HELP {name} Configuration reloads (SIGHUP) by result.\n# TYPE {name} counter"
    );
    for (result, c) in [("applied", &r.applied), ("refused", &r.refused)] {
        let _ = writeln!(
            s,
            "{name}{{result=\"{result}\"}} {}",
            crate::app::Metrics::get(c)
        );
    }
}
