//! `FakeHermes`: a Hermes Agent API server (its OpenAI-compatible API) for the brain leg.
//! `GET /health` answers without auth; `POST /v1/chat/completions` needs `Authorization: Bearer
//! <key>` (401 with Hermes' OpenAI-style error otherwise), records each request's headers and
//! JSON body, and answers from a queue of scripted [`HermesReply`]s — an echo of the last user
//! message when the queue is empty. Streams follow Hermes' streaming format: a role chunk at
//! once, content chunks, `event: hermes.tool.progress` events and `: keepalive` comments where scripted, a
//! finish chunk, the usage chunk (`"choices": []`, only when the request asked for
//! `stream_options.include_usage`, as OpenAI sends it), then `data: [DONE]`. Scripts can also finish with an error (the
//! error text in the finish chunk's `error` and `hermes` objects), send an in-stream `error`
//! object, cut the stream, or answer an HTTP error. The fake notices a client that disconnects
//! before the reply ended (cancellation) and records it. For the OpenAI-compatible leg it also
//! streams scripted `delta.tool_calls` (arguments split across chunks,
//! `finish_reason:"tool_calls"`) and, as the real API does, refuses (400) a follow-up whose
//! `role: tool` messages do not answer a preceding assistant message's `tool_calls`.
//! [`FakeHermes::stop`] and [`FakeHermes::start_again`] play a restart on the same port.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::http::{self, Body, Recorder, Tasks};

/// The prompt tokens the fake reports for every request (completion tokens: one per content
/// chunk).
pub const PROMPT_TOKENS: u64 = 10;

/// One step of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum HermesStep {
    /// One `delta.content` chunk.
    Text(String),
    Delay(Duration),
    /// `event: hermes.tool.progress` with status `running`.
    ToolStarted {
        tool: String,
        label: String,
    },
    /// `event: hermes.tool.progress` with status `completed`.
    ToolCompleted {
        tool: String,
    },
    /// A `: keepalive` comment.
    KeepAlive,
    /// Any other named event (clients must ignore it).
    NamedEvent {
        event: String,
        data: String,
    },
    /// Final chunk with `finish_reason:"error"`, the text in `error` and `hermes`, then
    /// `[DONE]`. Ends the reply.
    FinishError(String),
    /// A `data:` object with a top-level `error`, then the stream closes. Ends the reply.
    StreamError(String),
    /// Close the stream without a finish chunk. Ends the reply.
    Cut,
    /// One tool call streamed as `delta.tool_calls` fragments exactly as OpenAI
    /// streams them: a first fragment with `index`, `id`, `type:"function"`, `function.name` and
    /// `arguments:""`, then the arguments split into `parts` pieces (at arbitrary character
    /// boundaries) carrying only `index` and `function.arguments`. A reply with tool calls
    /// finishes with `finish_reason:"tool_calls"`.
    ToolCall {
        index: u32,
        id: String,
        name: String,
        arguments: String,
        parts: usize,
    },
}

/// How the fake answers one request.
#[derive(Debug, Clone, PartialEq)]
pub enum HermesReply {
    /// A stream: role chunk, these steps, then (unless a step ended it) finish `stop`,
    /// usage and `[DONE]`.
    Stream(Vec<HermesStep>),
    /// A non-2xx answer with Hermes' error envelope (429 and 503 carry `Retry-After: 2`).
    Http { status: u16, message: String },
}

impl HermesReply {
    /// `text` streamed in chunks of about two words.
    pub fn text(text: &str) -> Self {
        Self::Stream(text_steps(text, Duration::ZERO))
    }

    /// `text` streamed in chunks with `delay` before each chunk.
    pub fn text_paced(text: &str, delay: Duration) -> Self {
        Self::Stream(text_steps(text, delay))
    }

    /// A reply that only calls `name` with `arguments` (JSON text, streamed in 3 pieces).
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> Self {
        Self::Stream(vec![HermesStep::ToolCall {
            index: 0,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            parts: 3,
        }])
    }

    pub fn http(status: u16, message: &str) -> Self {
        Self::Http {
            status,
            message: message.into(),
        }
    }
}

/// Splits `text` into content steps of about two words each, `delay` before each.
pub fn text_steps(text: &str, delay: Duration) -> Vec<HermesStep> {
    let mut steps = Vec::new();
    let mut piece = String::new();
    let mut words = 0;
    for (i, part) in text.split_inclusive(' ').enumerate() {
        piece.push_str(part);
        words += 1;
        if words == 2 || i == text.split_inclusive(' ').count() - 1 {
            if !delay.is_zero() {
                steps.push(HermesStep::Delay(delay));
            }
            steps.push(HermesStep::Text(std::mem::take(&mut piece)));
            words = 0;
        }
    }
    steps
}

/// One chat-completions request.
#[derive(Debug, Clone, Default)]
pub struct HermesRequest {
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// The HTTP status answered.
    pub status: u16,
    /// The whole reply was handed to the connection.
    pub completed: bool,
    /// The client went away before the reply ended.
    pub disconnected: bool,
}

impl HermesRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The W3C `traceparent` the request carried (patterd sends it when `[telemetry]` is on).
    pub fn traceparent(&self) -> Option<&str> {
        self.header("traceparent")
    }

    /// The names of the request's `tools`.
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The request's `role: tool` messages as (tool_call_id, content) pairs.
    pub fn tool_messages(&self) -> Vec<(String, String)> {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
                    .map(|m| {
                        let f =
                            |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                        (f("tool_call_id"), f("content"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The request's `messages` as (role, content) pairs.
    pub fn messages(&self) -> Vec<(String, String)> {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|m| {
                        let f =
                            |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                        (f("role"), f("content"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default)]
pub struct HermesRecord {
    pub requests: Vec<HermesRequest>,
    /// Requests refused for a bad or missing key.
    pub unauthorized: usize,
    pub health_checks: usize,
}

struct Shared {
    api_key: String,
    queue: Mutex<VecDeque<HermesReply>>,
    record: Recorder<HermesRecord>,
    tasks: Tasks,
}

/// A running fake; dropping it stops the server.
pub struct FakeHermes(http::Server<Shared>);

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

impl FakeHermes {
    pub async fn start(api_key: &str) -> std::io::Result<Self> {
        let shared = Shared {
            api_key: api_key.into(),
            queue: Mutex::new(VecDeque::new()),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.0.addr)
    }

    /// Queues the answer to a later request (first in, first used).
    pub fn push(&self, reply: HermesReply) {
        if let Ok(mut q) = self.0.shared.queue.lock() {
            q.push_back(reply);
        }
    }

    pub fn record(&self) -> HermesRecord {
        self.0.shared.record.snapshot()
    }

    /// Hermes goes down (a restart or a crash): connections are refused and any reply being
    /// streamed is cut, until [`FakeHermes::start_again`].
    pub fn stop(&self) {
        self.0.stop();
    }

    /// Hermes is back on the same port, with its queue and record as they were.
    pub async fn start_again(&self) -> std::io::Result<()> {
        self.0.resume().await
    }

    /// Waits (up to 10 s, then panics) until `pred` holds; returns that record.
    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&HermesRecord) -> bool,
    ) -> HermesRecord {
        self.0.shared.record.wait_until(what, pred).await
    }

    /// [`FakeHermes::wait_until`] up to `limit`.
    pub async fn wait_until_within(
        &self,
        what: &str,
        limit: std::time::Duration,
        pred: impl FnMut(&HermesRecord) -> bool,
    ) -> HermesRecord {
        self.0
            .shared
            .record
            .wait_until_within(what, limit, pred)
            .await
    }
}

fn error_body(message: &str, kind: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    let path = req.uri().path().to_string();
    if let Some(resp) = gate(&s, &req, &path) {
        return resp;
    }
    let rq = HermesRequest {
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    let session_id = rq.header("x-hermes-session-id").map(str::to_string);
    let session_key = rq.header("x-hermes-session-key").map(str::to_string);
    let body = match http::read_body(req, 10 << 20).await {
        Ok(b) => b,
        Err(_) => {
            return http::json(
                413,
                &error_body(
                    "Request body too large",
                    "invalid_request_error",
                    "body_too_large",
                ),
            );
        }
    };
    let (rq, reply) = match parse_request(&s, rq, &body) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    let (rq, steps) = match reply_steps(&s, rq, reply) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    stream_reply(&s, rq, steps, session_id.as_deref(), session_key.as_deref())
}

/// Everything answered before a completion's body is read: health, the key, session
/// headers without a key, the model list and unknown routes. `None`: a completion request.
fn gate(s: &Shared, req: &Request<Incoming>, path: &str) -> Option<hyper::Response<Body>> {
    if req.method() == hyper::Method::GET && (path == "/health" || path == "/v1/health") {
        s.record.modify(|r| r.health_checks += 1);
        return Some(http::json(
            200,
            &json!({"status": "ok", "platform": "hermes-agent", "version": "0.19.0"}),
        ));
    }
    // An empty key is a Hermes without API_SERVER_KEY: every request is let in, but the
    // session headers are refused with 403.
    let keyless = s.api_key.is_empty();
    let authorized = keyless
        || req
            .headers()
            .get("authorization")
            .is_some_and(|v| v.as_bytes() == format!("Bearer {}", s.api_key).as_bytes());
    if !authorized {
        s.record.modify(|r| r.unauthorized += 1);
        return Some(http::json(
            401,
            &error_body(
                "Invalid API key",
                "invalid_request_error",
                "invalid_api_key",
            ),
        ));
    }
    if keyless
        && (req.headers().contains_key("x-hermes-session-id")
            || req.headers().contains_key("x-hermes-session-key"))
    {
        return Some(http::json(
            403,
            &error_body(
                "Session headers require an API key to be configured",
                "invalid_request_error",
                "forbidden",
            ),
        ));
    }
    if req.method() == hyper::Method::GET && path == "/v1/models" {
        return Some(http::json(
            200,
            &json!({"object": "list", "data": [{
                "id": "hermes-agent", "object": "model", "created": 1_760_000_000,
                "owned_by": "hermes",
            }]}),
        ));
    }
    if req.method() != hyper::Method::POST || path != "/v1/chat/completions" {
        return Some(http::json(
            404,
            &error_body("Not found", "invalid_request_error", "not_found"),
        ));
    }
    None
}

/// The completion request's JSON, messages and tool messages checked (a refusal is
/// recorded with status 400); the queued reply, or an echo of the last message.
fn parse_request(
    s: &Shared,
    mut rq: HermesRequest,
    body: &[u8],
) -> Result<(HermesRequest, HermesReply), Box<hyper::Response<Body>>> {
    // A request read but refused (400): recorded as such, answered with the error.
    let refuse = |mut rq: HermesRequest, message: &str, code: &str| {
        rq.status = 400;
        s.record.modify(|r| r.requests.push(rq));
        http::json(400, &error_body(message, "invalid_request_error", code))
    };
    rq.body = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(_) => {
            return Err(Box::new(refuse(
                rq,
                "Invalid JSON in request body",
                "invalid_json",
            )));
        }
    };
    let messages = rq.messages();
    if messages.is_empty() {
        return Err(Box::new(refuse(
            rq,
            "Missing or invalid 'messages' field",
            "invalid_messages",
        )));
    }
    if let Some(problem) = tool_message_problem(&rq.body) {
        return Err(Box::new(refuse(rq, &problem, "invalid_tool_message")));
    }
    let reply = s
        .queue
        .lock()
        .ok()
        .and_then(|mut q| q.pop_front())
        .unwrap_or_else(|| {
            let last = messages.last().map(|m| m.1.clone()).unwrap_or_default();
            HermesReply::text(&format!("You said: {last}"))
        });
    Ok((rq, reply))
}

/// The steps to stream; an HTTP-error reply, or a stream to a request that did not ask to
/// stream, is answered (and recorded) here.
fn reply_steps(
    s: &Shared,
    mut rq: HermesRequest,
    reply: HermesReply,
) -> Result<(HermesRequest, Vec<HermesStep>), Box<hyper::Response<Body>>> {
    let stream = matches!(rq.body.get("stream"), Some(Value::Bool(true)))
        || matches!(
            rq.body.get("stream").and_then(Value::as_str),
            Some("true" | "1" | "yes" | "on")
        );
    match reply {
        HermesReply::Http { status, message } => {
            rq.status = status;
            rq.completed = true;
            s.record.modify(|r| r.requests.push(rq));
            let mut resp = http::json(
                status,
                &error_body(&message, "server_error", "server_error"),
            );
            // Rate limits and overload come with a retry hint, as real servers send them.
            if status == 429 || status == 503 {
                resp.headers_mut().insert(
                    hyper::header::RETRY_AFTER,
                    hyper::header::HeaderValue::from_static("2"),
                );
            }
            Err(Box::new(resp))
        }
        HermesReply::Stream(_) if !stream => {
            rq.status = 400;
            s.record.modify(|r| r.requests.push(rq));
            Err(Box::new(http::json(
                400,
                &error_body(
                    "this fake only streams",
                    "invalid_request_error",
                    "stream_required",
                ),
            )))
        }
        HermesReply::Stream(steps) => Ok((rq, steps)),
    }
}

/// Records the request (200) and streams `steps` from a task; the session headers are echoed.
fn stream_reply(
    s: &Arc<Shared>,
    mut rq: HermesRequest,
    steps: Vec<HermesStep>,
    session_id: Option<&str>,
    session_key: Option<&str>,
) -> hyper::Response<Body> {
    rq.status = 200;
    let mut idx = 0;
    s.record.modify(|r| {
        idx = r.requests.len();
        r.requests.push(rq);
    });
    let mut headers = vec![
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("x-accel-buffering", "no"),
    ];
    if let Some(id) = session_id {
        headers.push(("x-hermes-session-id", id));
    }
    if let Some(k) = session_key {
        headers.push(("x-hermes-session-key", k));
    }
    let (resp, tx) = http::streaming(200, &headers);
    let model = rq_model(s, idx);
    let include_usage = {
        let mut asked = false;
        s.record.modify(|r| {
            asked = r.requests[idx].body["stream_options"]["include_usage"] == Value::Bool(true);
        });
        asked
    };
    let s2 = s.clone();
    s.tasks.spawn(async move {
        let ok = play(&tx, &model, steps, include_usage).await;
        s2.record.modify(|r| {
            if ok {
                r.requests[idx].completed = true;
            } else {
                r.requests[idx].disconnected = true;
            }
        });
    });
    resp
}

/// As the real API: every `role: tool` message answers a `tool_calls` entry of an earlier
/// assistant message, each call is answered, and `tools` entries are functions with a name.
fn tool_message_problem(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                if !open.is_empty() {
                    return Some(format!("tool calls {open:?} have no tool message"));
                }
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let id = c.get("id").and_then(Value::as_str)?;
                    if c.pointer("/function/name")
                        .and_then(Value::as_str)
                        .is_none()
                        || c.pointer("/function/arguments")
                            .and_then(Value::as_str)
                            .is_none()
                    {
                        return Some(
                            "a tool call needs function.name and function.arguments".into(),
                        );
                    }
                    open.push(id.to_string());
                }
            }
            Some("tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let Some(i) = open.iter().position(|o| o == id) else {
                    return Some(format!(
                        "messages with role 'tool' must be a response to a preceding message with 'tool_calls' (id {id:?})"
                    ));
                };
                open.remove(i);
            }
            _ => {
                if !open.is_empty() {
                    return Some(format!("tool calls {open:?} have no tool message"));
                }
            }
        }
    }
    for t in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if t.get("type").and_then(Value::as_str) != Some("function")
            || t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_none()
        {
            return Some("each tool needs type 'function' and function.name".into());
        }
    }
    None
}

fn rq_model(s: &Shared, idx: usize) -> String {
    // Reads one request in place: cloning the whole record per request would make a long
    // load run quadratic.
    let mut model = String::new();
    s.record.modify(|r| {
        model = r.requests[idx]
            .body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("hermes-agent")
            .to_string();
    });
    model
}

/// Streams the reply; false when the client went away first.
async fn play(
    tx: &mpsc::Sender<Bytes>,
    model: &str,
    steps: Vec<HermesStep>,
    include_usage: bool,
) -> bool {
    let id = "chatcmpl-fake0001";
    let chunk = |delta: Value, finish: Value, extra: Option<(&str, Value)>| {
        let mut c = json!({
            "id": id, "object": "chat.completion.chunk", "created": 1_760_000_000u64, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some((k, v)) = extra {
            c[k] = v;
        }
        format!("data: {c}\n\n")
    };
    let send = |s: String| async move {
        tokio::select! {
            r = tx.send(Bytes::from(s)) => r.is_ok(),
            _ = tx.closed() => false,
        }
    };
    if !send(chunk(json!({"role": "assistant"}), Value::Null, None)).await {
        return false;
    }
    let mut content_chunks = 0u64;
    let mut called_tools = false;
    for step in steps {
        let ok = match step {
            HermesStep::Text(t) => {
                content_chunks += 1;
                send(chunk(json!({"content": t}), Value::Null, None)).await
            }
            HermesStep::Delay(d) => tokio::select! {
                _ = tokio::time::sleep(d) => true,
                _ = tx.closed() => false,
            },
            HermesStep::ToolStarted { tool, label } => {
                let d = json!({"tool": tool, "emoji": "🔧", "label": label, "toolCallId": "call_1", "status": "running"});
                send(format!("event: hermes.tool.progress\ndata: {d}\n\n")).await
            }
            HermesStep::ToolCompleted { tool } => {
                let d = json!({"tool": tool, "toolCallId": "call_1", "status": "completed"});
                send(format!("event: hermes.tool.progress\ndata: {d}\n\n")).await
            }
            HermesStep::KeepAlive => send(": keepalive\n\n".into()).await,
            HermesStep::NamedEvent { event, data } => {
                send(format!("event: {event}\ndata: {data}\n\n")).await
            }
            HermesStep::FinishError(msg) => {
                let mut c = json!({
                    "id": id, "object": "chat.completion.chunk", "created": 1_760_000_000u64, "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": content_chunks, "total_tokens": 10 + content_chunks},
                });
                c["error"] = json!({"message": msg, "type": "agent_error"});
                c["hermes"] = json!({"completed": false, "partial": false, "failed": true, "error": msg, "error_code": "agent_failed"});
                return send(format!("data: {c}\n\n")).await
                    && send("data: [DONE]\n\n".into()).await;
            }
            HermesStep::StreamError(msg) => {
                let e = error_body(&msg, "server_error", "server_error");
                return send(format!("data: {e}\n\n")).await;
            }
            HermesStep::Cut => return true,
            HermesStep::ToolCall {
                index,
                id,
                name,
                arguments,
                parts,
            } => {
                called_tools = true;
                let first = json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]});
                let mut ok = send(chunk(first, Value::Null, None)).await;
                let chars: Vec<char> = arguments.chars().collect();
                let size = chars.len().div_ceil(parts.max(1)).max(1);
                for piece in chars.chunks(size) {
                    let piece: String = piece.iter().collect();
                    let d =
                        json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]});
                    ok = ok && send(chunk(d, Value::Null, None)).await;
                }
                ok
            }
        };
        if !ok {
            return false;
        }
    }
    let finish = if called_tools { "tool_calls" } else { "stop" };
    if !send(chunk(json!({}), json!(finish), None)).await {
        return false;
    }
    if include_usage {
        // With `include_usage`: one more chunk, `choices` empty, the only one whose `usage` is not null.
        let usage = json!({
            "id": id, "object": "chat.completion.chunk", "created": 1_760_000_000u64, "model": model,
            "choices": [],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": content_chunks,
                      "total_tokens": PROMPT_TOKENS + content_chunks},
        });
        if !send(format!("data: {usage}\n\n")).await {
            return false;
        }
    }
    send("data: [DONE]\n\n".into()).await
}
