//! `GET /metrics`: the daemon's counters ([`crate::app::Metrics`]) and gauges in the
//! Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use hyper::Response;

use crate::app::{App, Metrics};
use crate::net::http::{Body, respond};

/// The metrics page.
pub fn render(app: &App) -> Response<Body> {
    let m: &Metrics = &app.metrics;
    let mut s = String::new();
    let mut put = |name: &str, help: &str, kind: &str, v: u64| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    };
    let g = |c: &AtomicU64| Metrics::get(c);
    put(
        "patterd_calls_active",
        "Calls live now.",
        "gauge",
        app.calls.len() as u64,
    );
    put(
        "patterd_calls_accepted_total",
        "Calls answered.",
        "counter",
        g(&m.calls_accepted),
    );
    put(
        "patterd_calls_rejected_unknown_number_total",
        "Calls to a number not in [[numbers]].",
        "counter",
        g(&m.calls_rejected_unknown_number),
    );
    put(
        "patterd_calls_rejected_caller_total",
        "Calls from a caller outside allowed_callers.",
        "counter",
        g(&m.calls_rejected_caller),
    );
    put(
        "patterd_calls_rejected_busy_total",
        "Calls refused at max_calls or while draining.",
        "counter",
        g(&m.calls_rejected_busy),
    );
    put(
        "patterd_webhooks_forbidden_total",
        "Webhooks with a bad or missing signature.",
        "counter",
        g(&m.webhooks_forbidden),
    );
    put(
        "patterd_webhooks_replayed_total",
        "Webhooks for a call id already handled (replayed), refused.",
        "counter",
        g(&m.webhooks_replayed),
    );
    put(
        "patterd_media_rejected_total",
        "Media sockets refused (bad token, unknown call, too many sockets).",
        "counter",
        g(&m.media_rejected),
    );
    put(
        "patterd_media_frames_bad_total",
        "Malformed media frames received.",
        "counter",
        g(&m.media_frames_bad),
    );
    put(
        "patterd_store_writes_dropped_total",
        "Timeline events not stored because the store's queue was full (disk stalled).",
        "counter",
        app.store.tx.dropped(),
    );
    put(
        "patterd_draining",
        "1 while the daemon drains.",
        "gauge",
        u64::from(app.is_draining()),
    );
    respond(200, "text/plain; version=0.0.4", Bytes::from(s))
}
