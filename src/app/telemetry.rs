//! The trace exporter (`[telemetry]`, off unless `otlp_endpoint` is set): the bounded queue
//! calls hand their finished spans to ([`SpanSink`]: `try_send`, a full queue drops the span and
//! counts it in `patterd_otel_spans_dropped_total{reason="queue_full"}`) and the one task that
//! sends them to the collector over OTLP/HTTP with protobuf bodies (`opentelemetry-otlp`, on
//! the daemon's own reqwest client): a batch of up to [`MAX_BATCH`] spans whenever that many
//! wait, at every `export_interval_ms`, as soon as a call's root span ends, and at exit. One
//! export at a time, each bounded by `export_timeout_ms`; a batch the collector did not take
//! (refused, down, too slow) is dropped and counted (`reason="export_failed"`), never retried
//! past that, so a dead collector costs the calls nothing. Exported spans are counted in
//! `patterd_otel_spans_exported_total`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanId;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio::sync::{Notify, mpsc, oneshot};

use super::Metrics;
use super::metrics::SpanDrop;
use crate::call::trace::{CallTracing, SpanSink};
use crate::config::schema::TelemetryConfig;
use crate::util::TaskGuard;

/// Spans sent in one export request at most.
pub(crate) const MAX_BATCH: usize = 512;

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "[telemetry] otlp_endpoint = {endpoint:?}: {message}; give the collector's OTLP/HTTP \
         URL, e.g. http://127.0.0.1:4318"
    )]
    Endpoint { endpoint: String, message: String },
    #[error("[telemetry]: cannot build the HTTP client for the collector: {0}")]
    Client(String),
}

/// Where spans are POSTed: `<endpoint>/v1/traces`, unless the URL names a path of its own.
pub(crate) fn traces_url(endpoint: &str) -> Result<String, TelemetryError> {
    let endpoint = endpoint.trim();
    let bad = |message: String| TelemetryError::Endpoint {
        endpoint: endpoint.to_string(),
        message,
    };
    let mut url = url::Url::parse(endpoint).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad("not an absolute http(s) URL".into()));
    }
    if url.path().is_empty() || url.path() == "/" {
        url.set_path("/v1/traces");
    }
    Ok(url.to_string())
}

/// The queue calls hand their spans to.
struct Queue {
    tx: mpsc::Sender<SpanData>,
    /// Woken when a call's root span is queued: its trace goes out without waiting.
    soon: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl SpanSink for Queue {
    fn send(&self, span: SpanData) {
        let root = span.parent_span_id == SpanId::INVALID;
        match self.tx.try_send(span) {
            Ok(()) if root => self.soon.notify_one(),
            Ok(()) => {}
            Err(_) => self.metrics.otel_spans_dropped.inc(SpanDrop::QueueFull),
        }
    }
}

/// The daemon's trace exporter: the queue and its export task.
pub struct Telemetry {
    queue: Arc<Queue>,
    flushes: mpsc::Sender<oneshot::Sender<()>>,
    /// What the task takes when it starts (it starts on the first runtime that asks).
    parts: Mutex<Option<Parts>>,
    task: Mutex<Option<TaskGuard>>,
}

/// What the export task owns.
struct Parts {
    spans: mpsc::Receiver<SpanData>,
    flushes: mpsc::Receiver<oneshot::Sender<()>>,
    exporter: opentelemetry_otlp::SpanExporter,
    interval: Duration,
    timeout: Duration,
}

impl Telemetry {
    /// The exporter `cfg` asks for (`None` when `[telemetry]` is off), reporting as
    /// `instance`. Its task starts at once inside a tokio runtime, else at [`Telemetry::start`].
    pub fn new(
        cfg: &TelemetryConfig,
        instance: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Option<Arc<Self>>, TelemetryError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let url = traces_url(&cfg.otlp_endpoint)?;
        let timeout = Duration::from_millis(cfg.export_timeout_ms.max(1));
        crate::util::init_tls();
        // No redirects: the collector's headers (an API key) must not follow one elsewhere.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .timeout(timeout)
            .build()
            .map_err(|e| TelemetryError::Client(e.to_string()))?;
        let headers: HashMap<String, String> = cfg
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(url.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(timeout)
            .with_headers(headers)
            .build()
            .map_err(|e| TelemetryError::Endpoint {
                endpoint: url,
                message: e.to_string(),
            })?;
        exporter.set_resource(
            &Resource::builder()
                .with_service_name(cfg.service_name.clone())
                .with_attributes([
                    KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                    KeyValue::new("service.instance.id", instance.to_string()),
                ])
                .build(),
        );
        let (tx, spans) = mpsc::channel(cfg.max_queued_spans.max(1));
        let (flush_tx, flushes) = mpsc::channel(4);
        let telemetry = Arc::new(Self {
            queue: Arc::new(Queue {
                tx,
                soon: Arc::new(Notify::new()),
                metrics,
            }),
            flushes: flush_tx,
            parts: Mutex::new(Some(Parts {
                spans,
                flushes,
                exporter,
                interval: Duration::from_millis(cfg.export_interval_ms.max(1)),
                timeout,
            })),
            task: Mutex::new(None),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            telemetry.start();
        }
        Ok(Some(telemetry))
    }

    /// Starts the export task (once; later calls do nothing). Needs a tokio runtime.
    pub fn start(&self) {
        let Some(parts) = self.parts.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let queue = self.queue.clone();
        let task = tokio::spawn(export_loop(parts, queue));
        *self.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(TaskGuard::new(task));
    }

    /// Call `call_id`'s tracing: its trace, whose spans go to this exporter.
    pub(crate) fn for_call(&self, call_id: &str) -> CallTracing {
        CallTracing::new(self.queue.clone(), call_id)
    }

    /// Sends what is queued and waits for it, at most `within` (at exit).
    pub async fn flush(&self, within: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.flushes.try_send(tx).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(within, rx).await, Ok(Ok(())))
    }
}

/// The export task: batches from the queue to the collector, one request at a time.
async fn export_loop(mut parts: Parts, queue: Arc<Queue>) {
    let mut tick = tokio::time::interval(parts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch: Vec<SpanData> = Vec::with_capacity(MAX_BATCH);
    let mut failing = false;
    loop {
        let mut flushed = None;
        tokio::select! {
            n = parts.spans.recv_many(&mut batch, MAX_BATCH) => {
                if n == 0 {
                    return;
                }
                if batch.len() < MAX_BATCH {
                    continue;
                }
            }
            _ = queue.soon.notified() => {}
            _ = tick.tick() => {}
            Some(reply) = parts.flushes.recv() => flushed = Some(reply),
        }
        // Everything queued now goes, in batches.
        loop {
            while batch.len() < MAX_BATCH {
                match parts.spans.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
            export(&parts, spans, &queue.metrics, &mut failing).await;
        }
        if let Some(reply) = flushed {
            let _ = reply.send(());
        }
    }
}

/// Sends one batch; a batch the collector did not take is dropped and counted.
async fn export(parts: &Parts, spans: Vec<SpanData>, metrics: &Metrics, failing: &mut bool) {
    let n = spans.len() as u64;
    // The exporter's own deadline covers its retries; this one covers everything else.
    let limit = parts.timeout + Duration::from_secs(1);
    let why = match tokio::time::timeout(limit, parts.exporter.export(spans)).await {
        Ok(Ok(())) => {
            metrics
                .otel_spans_exported
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            if std::mem::take(failing) {
                tracing::info!("the trace collector takes spans again");
            }
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} ms", limit.as_millis()),
    };
    metrics.otel_spans_dropped.add(SpanDrop::ExportFailed, n);
    if !std::mem::replace(failing, true) {
        tracing::warn!(
            spans = n,
            error = %why,
            "the trace collector did not take a batch of spans; they are dropped \
             (counted in patterd_otel_spans_dropped_total) until it does"
        );
    } else {
        tracing::debug!(spans = n, error = %why, "trace export failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_to_a_bare_endpoint_only() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").expect("url"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url(" https://otel.example.com/ ").expect("url"),
            "https://otel.example.com/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example.com/ingest/v1/traces").expect("url"),
            "https://otel.example.com/ingest/v1/traces"
        );
        for bad in ["", "127.0.0.1:4318", "ftp://collector/", "http://"] {
            assert!(traces_url(bad).is_err(), "{bad:?}");
        }
    }

    fn span(root: bool) -> SpanData {
        let parent = if root {
            SpanId::INVALID
        } else {
            SpanId::from_bytes([1; 8])
        };
        SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "s".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_root_span_wakes_the_exporter() {
        let metrics = Arc::new(Metrics::default());
        let (tx, mut rx) = mpsc::channel(2);
        let queue = Queue {
            tx,
            soon: Arc::new(Notify::new()),
            metrics: metrics.clone(),
        };
        for _ in 0..5 {
            queue.send(span(false));
        }
        assert_eq!(metrics.otel_spans_dropped.get(SpanDrop::QueueFull), 3);
        assert!(rx.try_recv().is_ok());
        queue.send(span(true));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        // The root span stored a wake-up: `notified` resolves at once.
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), queue.soon.notified())
                .await
                .expect("woken")
        });
        assert_eq!(metrics.otel_spans_dropped.get(SpanDrop::QueueFull), 3);
    }

    #[test]
    fn off_without_an_endpoint_and_a_bad_endpoint_is_an_error() {
        let metrics = Arc::new(Metrics::default());
        let off = TelemetryConfig::default();
        assert!(
            Telemetry::new(&off, "a", metrics.clone())
                .expect("off")
                .is_none()
        );
        let bad = TelemetryConfig {
            otlp_endpoint: "collector:4318".into(),
            ..TelemetryConfig::default()
        };
        let err = Telemetry::new(&bad, "a", metrics).err().expect("refused");
        assert!(err.to_string().contains("otlp_endpoint"), "{err}");
    }
}
