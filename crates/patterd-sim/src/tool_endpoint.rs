//! `FakeToolEndpoint`: an HTTP endpoint of the kind patterd calls on a tool's behalf — a
//! consult back-office agent (`POST {request, call_id, caller, callee}` → JSON reply) or a
//! webhook tool (`POST {tool, arguments, call_id, caller, callee, attempt}` → JSON). It accepts
//! only `POST` with a JSON body (`Content-Type: application/json`, 415 otherwise), records each
//! request's headers and body, and answers from a queue of scripted [`ToolReply`]s (a default
//! reply when the queue is empty). A reply may be delayed; a client that gives up is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::http::{self, Body, Recorder, Tasks};

/// How the fake answers one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    pub status: u16,
    pub body: Value,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl ToolReply {
    pub fn json(body: Value) -> Self {
        Self {
            status: 200,
            body,
            delay: Duration::ZERO,
        }
    }

    pub fn status(status: u16) -> Self {
        Self {
            status,
            body: json!({"error": "scripted failure"}),
            delay: Duration::ZERO,
        }
    }

    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

/// One request received.
#[derive(Debug, Clone, Default)]
pub struct ToolRequest {
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl ToolRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, Default)]
pub struct ToolRecord {
    pub requests: Vec<ToolRequest>,
}

struct Shared {
    queue: Mutex<VecDeque<ToolReply>>,
    default: ToolReply,
    record: Recorder<ToolRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

/// A running fake; dropping it stops the server.
pub struct FakeToolEndpoint(http::Server<Shared>);

impl FakeToolEndpoint {
    /// Starts the fake; `default` answers when no scripted reply is queued.
    pub async fn start(default: ToolReply) -> std::io::Result<Self> {
        let shared = Shared {
            queue: Mutex::new(VecDeque::new()),
            default,
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT/tool`.
    pub fn url(&self) -> String {
        format!("http://{}/tool", self.0.addr)
    }

    pub fn push(&self, reply: ToolReply) {
        if let Ok(mut q) = self.0.shared.queue.lock() {
            q.push_back(reply);
        }
    }

    pub fn record(&self) -> ToolRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&ToolRecord) -> bool,
    ) -> ToolRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    if req.method() != hyper::Method::POST {
        return http::json(405, &json!({"error": "POST only"}));
    }
    let json_body = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return http::json(
            415,
            &json!({"error": "Content-Type must be application/json"}),
        );
    }
    let headers = http::header_pairs(&req);
    let body = match http::read_body(req, 1 << 20).await {
        Ok(b) => b,
        Err(_) => return http::json(413, &json!({"error": "too large"})),
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return http::json(400, &json!({"error": "invalid JSON"}));
    };
    s.record
        .modify(|r| r.requests.push(ToolRequest { headers, body }));
    let reply = s
        .queue
        .lock()
        .ok()
        .and_then(|mut q| q.pop_front())
        .unwrap_or_else(|| s.default.clone());
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    http::json(reply.status, &reply.body)
}
