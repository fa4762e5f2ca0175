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
    let g = |c: &AtomicU64| Metrics::get(c);
    let rows: [(&str, &str, &str, u64); 13] = [
        (
            "patterd_calls_active",
            "Calls live now.",
            "gauge",
            app.calls.len() as u64,
        ),
        (
            "patterd_calls_accepted_total",
            "Calls answered.",
            "counter",
            g(&m.calls_accepted),
        ),
        (
            "patterd_calls_rejected_unknown_number_total",
            "Calls to a number not in [[numbers]].",
            "counter",
            g(&m.calls_rejected_unknown_number),
        ),
        (
            "patterd_calls_rejected_caller_total",
            "Calls from a caller outside allowed_callers.",
            "counter",
            g(&m.calls_rejected_caller),
        ),
        (
            "patterd_calls_rejected_busy_total",
            "Calls refused at max_calls or while draining.",
            "counter",
            g(&m.calls_rejected_busy),
        ),
        (
            "patterd_webhooks_forbidden_total",
            "Webhooks with a bad or missing signature.",
            "counter",
            g(&m.webhooks_forbidden),
        ),
        (
            "patterd_webhooks_replayed_total",
            "Webhooks for a call id already handled (replayed), refused.",
            "counter",
            g(&m.webhooks_replayed),
        ),
        (
            "patterd_media_rejected_total",
            "Media sockets refused (bad token, unknown call, too many sockets).",
            "counter",
            g(&m.media_rejected),
        ),
        (
            "patterd_media_frames_bad_total",
            "Malformed media frames received.",
            "counter",
            g(&m.media_frames_bad),
        ),
        (
            "patterd_tts_fallbacks_total",
            "Sentences a TTS chain gave to its next TTS (connect error, 5xx, 429, no first audio in time).",
            "counter",
            Metrics::get(&app.providers().tts_fallbacks),
        ),
        (
            "patterd_store_writes_dropped_total",
            "Timeline events not stored because the store's queue was full (disk stalled).",
            "counter",
            app.store.tx.dropped(),
        ),
        (
            "patterd_provider_switches_total",
            "Turns a fallback chain handed to its next brain after one failed before its first token.",
            "counter",
            Metrics::get(&app.providers().llm_switches),
        ),
        (
            "patterd_draining",
            "1 while the daemon drains.",
            "gauge",
            u64::from(app.is_draining()),
        ),
    ];
    let mut s = String::new();
    for (name, help, kind, v) in rows {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
    reloads(&mut s, app);
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
        let _ = writeln!(s, "{name}{{result=\"{result}\"}} {}", Metrics::get(c));
    }
}
