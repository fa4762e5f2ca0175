//! `FakeCollector`: an OpenTelemetry collector's OTLP/HTTP trace receiver. It takes only
//! `POST /v1/traces` (404 elsewhere, 405 for another method) with `Content-Type:
//! application/x-protobuf` (415 otherwise, JSON included: the exporter under test speaks
//! protobuf), an uncompressed body of at most 4 MiB (413; a `Content-Encoding` is refused
//! with 415), decodes it as the official `ExportTraceServiceRequest` (`opentelemetry-proto`'s
//! types generated from the OTLP `.proto` files; 400 when it does not decode) and answers 200
//! with an empty `ExportTraceServiceResponse` in protobuf, as the collector does. Every span
//! is recorded flattened, with its resource's `service.name`, so tests can check the span tree
//! and parent links. It can be scripted to refuse (an HTTP status) or to hang, and
//! [`FakeCollector::stop`] closes the port (a collector that is down) until
//! [`FakeCollector::start_again`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

use super::http::{self, Body, Recorder, Tasks};

/// The largest request body taken.
pub const MAX_BODY: usize = 4 << 20;

/// One span as received, ids in lower-case hex (`parent` empty for a root span).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Attributes as (key, value rendered as text).
    pub attributes: Vec<(String, String)>,
    /// Span event names, in order.
    pub events: Vec<String>,
    /// The status code (0 unset, 1 ok, 2 error).
    pub status: i32,
    /// The resource's `service.name`.
    pub service: String,
    /// The instrumentation scope's name.
    pub scope: String,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `traceparent` a request made inside this span would carry (sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

#[derive(Debug, Clone, Default)]
pub struct CollectorRecord {
    pub spans: Vec<ReceivedSpan>,
    /// Export requests decoded and answered 200.
    pub exports: usize,
    /// Requests refused (bad method, path, type, body, or a scripted refusal).
    pub refused: usize,
}

impl CollectorRecord {
    pub fn named(&self, name: &str) -> Vec<&ReceivedSpan> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The spans whose parent is `span_id`, by start time.
    pub fn children(&self, span_id: &str) -> Vec<&ReceivedSpan> {
        let mut c: Vec<&ReceivedSpan> = self.spans.iter().filter(|s| s.parent == span_id).collect();
        c.sort_by_key(|s| (s.start_ns, s.end_ns));
        c
    }
}

/// How the fake answers exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CollectorMode {
    /// Decode, record, answer 200.
    #[default]
    Accept,
    /// Answer this status without recording (a collector refusing or overloaded).
    Refuse(u16),
    /// Read the request and never answer.
    Hang,
}

struct Shared {
    mode: Mutex<CollectorMode>,
    record: Recorder<CollectorRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

/// A running fake collector; dropping it stops the server.
pub struct FakeCollector(http::Server<Shared>);

impl FakeCollector {
    pub async fn start() -> std::io::Result<Self> {
        let shared = Shared {
            mode: Mutex::new(CollectorMode::Accept),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT`, the `[telemetry] otlp_endpoint` to configure.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.0.addr)
    }

    pub fn set_mode(&self, mode: CollectorMode) {
        *self.0.shared.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    /// The collector goes away: its port refuses connections.
    pub fn stop(&self) {
        self.0.stop();
    }

    /// The collector is back on the same port (after [`FakeCollector::stop`]).
    pub async fn start_again(&self) -> std::io::Result<()> {
        self.0.resume().await
    }

    pub fn record(&self) -> CollectorRecord {
        self.0.shared.record.snapshot()
    }

    /// Waits (up to 10 s, then panics) until `pred` holds; returns that record.
    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&CollectorRecord) -> bool,
    ) -> CollectorRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

fn refuse(s: &Shared, status: u16, message: &'static str) -> hyper::Response<Body> {
    s.record.modify(|r| r.refused += 1);
    http::plain(status, message)
}

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    if req.uri().path() != "/v1/traces" {
        return refuse(&s, 404, "not found");
    }
    if req.method() != hyper::Method::POST {
        return refuse(&s, 405, "POST only");
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    let protobuf = header("content-type")
        .is_some_and(|v| v.split(';').next().map(str::trim) == Some("application/x-protobuf"));
    if !protobuf {
        return refuse(&s, 415, "Content-Type must be application/x-protobuf");
    }
    if header("content-encoding").is_some_and(|v| v != "identity") {
        return refuse(&s, 415, "compressed bodies are not taken here");
    }
    let mode = *s.mode.lock().unwrap_or_else(|e| e.into_inner());
    let body = match http::read_body(req, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return refuse(&s, 413, "too large"),
    };
    match mode {
        CollectorMode::Accept => {}
        CollectorMode::Refuse(status) => return refuse(&s, status, "refused (scripted)"),
        CollectorMode::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return refuse(&s, 504, "hung");
        }
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return refuse(&s, 400, "not an ExportTraceServiceRequest");
    };
    let spans = flatten(request);
    s.record.modify(|r| {
        r.exports += 1;
        r.spans.extend(spans);
    });
    http::full(
        200,
        "application/x-protobuf",
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource
            .iter()
            .find(|(k, _)| k == "service.name")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        for ss in rs.scope_spans {
            let scope = ss
                .scope
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            for span in ss.spans {
                out.push(ReceivedSpan {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent: hex::encode(&span.parent_span_id),
                    name: span.name,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    attributes: attributes(&span.attributes),
                    events: span.events.into_iter().map(|e| e.name).collect(),
                    status: span.status.map_or(0, |s| s.code),
                    service: service.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    out
}
