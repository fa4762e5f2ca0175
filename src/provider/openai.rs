//! The brain: a streamed OpenAI Chat Completions client that also speaks the
//! Hermes Agent dialect. For kind `openai_compatible` every turn carries the
//! system prompt and the whole history. For kind `hermes` the server keeps the transcript per
//! `X-Hermes-Session-Id` (`patter-call-<call id>`), so a turn carries only the system prompt
//! (ephemeral in Hermes, resent each turn) and the newest user message, plus an optional
//! `X-Hermes-Session-Key` memory scope (fixed, or per caller: [`caller_key`], an HMAC of the
//! caller's E.164 number under `session_key_secret`; none for a caller that is not a number,
//! or without the secret). A brain with `send_call_token` (default for `hermes`) also gets
//! `X-Patterd-Call-Token`: the call's own API token, which reads and acts on this call only.
//! The stream is decoded by [`super::sse`]: `: keepalive` comments are skipped, named
//! `hermes.tool.progress` events become [`LlmEvent::ToolProgress`], other named events are
//! ignored; `delta.content` becomes [`LlmEvent::Delta`] with inline `<think>…</think>` removed,
//! never `reasoning_content`; whitespace at the start of a text segment (Hermes emits `\n\n`
//! after a tool round) is dropped. `finish_reason:"error"`, an `error` object or a failed
//! `hermes` object end the turn with [`LlmEvent::Error`] and their text is never a delta; a
//! failure a retry may fix (no connection, a broken stream, 429/502/503 with `Retry-After`)
//! ends it with [`LlmEvent::Unavailable`] ([`LlmError::unavailable`]) — the call, not this
//! client, decides whether and when to ask again.
//! Deadlines: connect, first token (a delta or tool progress) and the whole turn.
//!
//! Tool calling (kind `openai_compatible` only — Hermes runs its own tools
//! and is sent none): the turn's [`Tools`] go out as `tools`; streamed `delta.tool_calls` are
//! accumulated by index; when the response ends with calls, each is run through the turn's
//! [`super::ToolRunner`] (reported as [`LlmEvent::ToolCall`] / [`LlmEvent::ToolResult`], with
//! a runner's announcement or fallback line as [`LlmEvent::Say`]), the assistant message with
//! its `tool_calls` and one `role: tool` message per call are appended, and the request is sent
//! again — at most `max_rounds` times per caller turn; the request after the last round offers
//! no tools, so the model has to answer in words. Deadlines apply per request; a tool's own
//! time is bounded by the tool.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::{LlmError, SetupError};
use super::sse::{SseEvent, SseParser};
use super::tools::ToolCallAccumulator;
use super::{ChatTurn, LlmEvent, LlmProvider, LlmStream, Role, TokenUsage, ToolCall, Tools};
use crate::config::schema::{LlmConfig, LlmKind, SessionKeyFrom};
use crate::util::TaskGuard;
use crate::util::traceparent::{TRACEPARENT, TraceParent};

/// The request header the brain gets the call's own API token in (scope `call`).
pub const CALL_TOKEN_HEADER: &str = "X-Patterd-Call-Token";

/// Longest error body read from a failed response.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// A chat-completions brain (OpenAI-compatible, Hermes, or OpenClaw treated as compatible).
pub struct OpenAiChat {
    cfg: LlmConfig,
    client: reqwest::Client,
    url: String,
}

impl OpenAiChat {
    pub fn new(cfg: &LlmConfig) -> Result<Self, SetupError> {
        crate::util::init_tls();
        // No redirects: the vendor key travels in a custom header, which a redirect to
        // another host would carry along.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(cfg.connect_timeout_s.max(1)))
            .build()
            .map_err(SetupError::Client)?;
        let url = format!("{}/chat/completions", cfg.base_url.trim_end_matches('/'));
        Ok(Self {
            cfg: cfg.clone(),
            client,
            url,
        })
    }

    fn is_hermes(&self) -> bool {
        self.cfg.kind == LlmKind::Hermes
    }

    /// The turn's tools if this brain is offered any (never Hermes; never an empty list).
    fn offered_tools(&self, turn: &ChatTurn) -> Option<Tools> {
        if self.is_hermes() {
            return None;
        }
        turn.tools
            .clone()
            .filter(|t| t.0.max_rounds() > 0 && !t.0.specs().is_empty())
    }

    /// The request headers and body for one turn.
    pub(crate) fn build_request(&self, turn: &ChatTurn) -> (Vec<(String, String)>, Value) {
        let mut headers = vec![
            (
                "Authorization".to_string(),
                format!("Bearer {}", self.cfg.api_key.expose()),
            ),
            ("Accept".to_string(), "text/event-stream".to_string()),
        ];
        if self.cfg.sends_call_token()
            && let Some(t) = &turn.call_token
        {
            headers.push((CALL_TOKEN_HEADER.to_string(), t.expose().to_string()));
        }
        if let Some(tp) = &turn.trace {
            headers.push((TRACEPARENT.to_string(), tp.header_value()));
        }
        let mut messages: Vec<Value> = Vec::new();
        if !turn.system_prompt.trim().is_empty() {
            messages.push(json!({"role": Role::System, "content": turn.system_prompt}));
        }
        let mut body = json!({
            "model": self.cfg.model,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if self.is_hermes() {
            let session = session_id(&turn.call_id);
            headers.push(("X-Hermes-Session-Id".into(), session.clone()));
            let key = match (&self.cfg.session_key, self.cfg.session_key_from) {
                (Some(k), _) if !k.trim().is_empty() => Some(k.clone()),
                (_, Some(SessionKeyFrom::CallerHash)) => turn
                    .caller
                    .as_deref()
                    .and_then(|c| caller_key(self.cfg.session_key_secret.expose(), c)),
                _ => None,
            };
            if let Some(k) = key {
                headers.push(("X-Hermes-Session-Key".into(), k));
            }
            body["user"] = Value::String(session);
            let last = turn
                .history
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .or(turn.history.last());
            messages.extend(last.map(|m| json!(m)));
        } else {
            messages.extend(turn.history.iter().map(|m| json!(m)));
            messages = super::history::bound(messages, turn.history_limits);
        }
        body["messages"] = Value::Array(messages);
        if let Some(t) = self.cfg.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = self.cfg.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if let Some(tools) = self.offered_tools(turn) {
            let specs: Vec<Value> = tools.0.specs().iter().map(|t| t.to_json()).collect();
            body["tools"] = Value::Array(specs);
        }
        (headers, body)
    }
}

/// The chunk's `usage` object (a `choices: []` chunk after the finish when
/// `include_usage` is asked; some servers put it on the finish chunk or on every chunk).
fn usage_of(v: &Value) -> Option<TokenUsage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(TokenUsage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
    })
}

/// `patter-call-<call id>`, restricted to Hermes' safe charset `[A-Za-z0-9._-]`, ≤ 256 chars.
pub fn session_id(call_id: &str) -> String {
    let mut s = String::from("patter-call-");
    s.extend(call_id.chars().map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '-'
        }
    }));
    s = s.replace("..", "-.");
    s.truncate(256);
    s
}

/// Domain separation of the caller memory key from other uses of the same secret.
const CALLER_KEY_LABEL: &str = "patterd caller memory v1\n";

/// The Hermes memory scope of `caller`: `patter-caller-<first 16 hex chars of
/// HMAC-SHA256(secret, label + E.164)>`. `None` without a secret (a bare hash of a number is
/// computable by anyone who knows the number) and for a caller that is not an E.164 number
/// (`browser`, `anonymous`, a SIP URI, a withheld-number placeholder: many callers share each).
pub fn caller_key(secret: &str, caller: &str) -> Option<String> {
    if secret.trim().is_empty() {
        return None;
    }
    let number = crate::util::phone::known_number(caller)?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{CALLER_KEY_LABEL}{number}").as_bytes());
    let h = hex::encode(tag.as_ref());
    Some(format!("patter-caller-{}", &h[..16]))
}

impl LlmProvider for OpenAiChat {
    fn keeps_history(&self) -> bool {
        self.is_hermes()
    }

    fn stream(&self, turn: ChatTurn) -> LlmStream {
        let (tx, rx) = mpsc::channel(64);
        let (headers, body) = self.build_request(&turn);
        let tools = self.offered_tools(&turn);
        let trace = turn.trace;
        let client = self.client.clone();
        let url = self.url.clone();
        let first = Duration::from_secs(self.cfg.first_token_timeout_s.max(1));
        let total = Duration::from_secs(self.cfg.effective_timeout_s().max(1));
        let task = tokio::spawn(async move {
            let request = |body: &Value| {
                headers
                    .iter()
                    .fold(client.post(&url).json(body), |r, (k, v)| r.header(k, v))
            };
            let last = match rounds(request, body, tools, trace, first, total, &tx).await {
                Ok(()) => LlmEvent::Done,
                Err(e) => {
                    tracing::warn!(error = %e, unavailable = e.unavailable(), "chat turn failed");
                    e.event()
                }
            };
            let _ = tx.send(last).await;
        });
        LlmStream {
            events: rx,
            guard: TaskGuard::new(task),
        }
    }
}

/// One caller turn: requests and tool rounds until the model answers without tool calls. Each
/// tool call gets a span of its own under the turn's (`trace`), which the tool sends on.
async fn rounds(
    request: impl Fn(&Value) -> reqwest::RequestBuilder,
    mut body: Value,
    tools: Option<Tools>,
    trace: Option<TraceParent>,
    first: Duration,
    total: Duration,
    tx: &mpsc::Sender<LlmEvent>,
) -> Result<(), LlmError> {
    let max = tools.as_ref().map_or(0, |t| t.0.max_rounds());
    let mut done_rounds = 0u32;
    loop {
        let offer = tools.is_some() && done_rounds < max;
        if !offer && let Some(o) = body.as_object_mut() {
            o.remove("tools");
        }
        let end = match tokio::time::timeout(total, run(request(&body), first, tx)).await {
            Ok(r) => r?,
            Err(_) => return Err(LlmError::NoCompleteReply(total)),
        };
        if end.calls.is_empty() {
            return Ok(());
        }
        let Some(t) = tools.as_ref().filter(|_| offer) else {
            tracing::warn!(
                calls = end.calls.len(),
                rounds = done_rounds,
                "the model called tools it was not offered (or past max_tool_rounds); ignored"
            );
            return Ok(());
        };
        done_rounds += 1;
        let content = if end.text.is_empty() {
            Value::Null
        } else {
            Value::String(end.text)
        };
        let mut appended = vec![json!({
            "role": "assistant",
            "content": content,
            "tool_calls": end.calls.iter().map(ToolCall::to_json).collect::<Vec<_>>(),
        })];
        for mut call in end.calls {
            call.trace = trace.as_ref().map(TraceParent::child);
            if let Some(line) = t.0.announce(&call.name) {
                send(tx, LlmEvent::Say(line)).await?;
            }
            send(tx, LlmEvent::ToolCall(call.clone())).await?;
            let out = t.0.run(call.clone()).await;
            if let Some(line) = out.say.clone() {
                send(tx, LlmEvent::Say(line)).await?;
            }
            send(
                tx,
                LlmEvent::ToolResult {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    ok: out.ok,
                    content: out.content.clone(),
                },
            )
            .await?;
            appended.push(json!({"role": "tool", "tool_call_id": call.id, "content": out.content}));
        }
        if let Some(m) = body.get_mut("messages").and_then(Value::as_array_mut) {
            m.extend(appended);
        }
    }
}

/// How one streamed response ended: its raw text and the tool calls it made.
#[derive(Debug, Default)]
struct RoundEnd {
    text: String,
    calls: Vec<ToolCall>,
}

/// Runs one request, sending deltas and tool progress; `Ok` means a complete response.
async fn run(
    req: reqwest::RequestBuilder,
    first_token: Duration,
    tx: &mpsc::Sender<LlmEvent>,
) -> Result<RoundEnd, LlmError> {
    let first_deadline = Instant::now() + first_token;
    let mut resp = tokio::time::timeout_at(first_deadline, req.send())
        .await
        .map_err(|_| LlmError::NoFirstToken(first_token))?
        .map_err(LlmError::Request)?;
    let status = resp.status();
    if !status.is_success() {
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| super::error::parse_retry_after(v, std::time::SystemTime::now()));
        let mut body = Vec::new();
        while body.len() < MAX_ERROR_BODY {
            match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
                Ok(Ok(Some(c))) => body.extend_from_slice(&c),
                _ => break,
            }
        }
        return Err(LlmError::Http {
            status: status.as_u16(),
            message: error_text(&body),
            retry_after,
        });
    }
    let mut parser = SseParser::new();
    let mut state = TurnState::default();
    loop {
        let next = if state.got_first {
            resp.chunk().await
        } else {
            match tokio::time::timeout_at(first_deadline, resp.chunk()).await {
                Ok(r) => r,
                Err(_) => return Err(LlmError::NoFirstToken(first_token)),
            }
        };
        let chunk = next.map_err(LlmError::Stream)?;
        let events = match &chunk {
            Some(c) => parser.push(c),
            None => parser.finish().into_iter().collect(),
        };
        if parser.overflowed() {
            return Err(LlmError::Oversized);
        }
        for ev in events {
            if state.handle(ev, tx).await? {
                return Ok(state.end());
            }
        }
        if chunk.is_none() {
            return if state.finished {
                Ok(state.end())
            } else {
                Err(LlmError::Truncated)
            };
        }
    }
}

#[derive(Default)]
struct TurnState {
    got_first: bool,
    finished: bool,
    /// No text spoken yet in this segment (start of reply, or after a tool round).
    segment_start: bool,
    think: ThinkFilter,
    started: bool,
    /// The response's raw content (for the assistant message of a tool round).
    text: String,
    calls: ToolCallAccumulator,
}

impl TurnState {
    fn end(&mut self) -> RoundEnd {
        RoundEnd {
            text: std::mem::take(&mut self.text),
            calls: std::mem::take(&mut self.calls).finish(),
        }
    }

    /// Handles one SSE event; `Ok(true)` ends the turn successfully.
    async fn handle(
        &mut self,
        ev: SseEvent,
        tx: &mpsc::Sender<LlmEvent>,
    ) -> Result<bool, LlmError> {
        if !self.started {
            self.started = true;
            self.segment_start = true;
        }
        match ev.event.as_deref() {
            None | Some("message") | Some("") => {}
            Some("hermes.tool.progress") => {
                let v: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
                let status = v.get("status").and_then(Value::as_str).unwrap_or("running");
                self.got_first = true;
                self.segment_start = true;
                if status != "completed" {
                    let label = ["label", "tool", "name"]
                        .iter()
                        .find_map(|k| v.get(*k).and_then(Value::as_str))
                        .unwrap_or("working")
                        .to_string();
                    send(tx, LlmEvent::ToolProgress(label)).await?;
                }
                return Ok(false);
            }
            Some(other) => {
                tracing::debug!(event = other, "ignoring unknown SSE event");
                return Ok(false);
            }
        }
        if ev.is_done() {
            if !self.finished {
                // `[DONE]` without a finish_reason: accepted (some local servers), flush.
                self.finished = true;
            }
            self.flush(tx).await?;
            return Ok(true);
        }
        let v: Value = match serde_json::from_str(&ev.data) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "ignoring a data line that is not JSON");
                return Ok(false);
            }
        };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(LlmError::Reported(error_message(err)));
        }
        if let Some(u) = usage_of(&v) {
            send(tx, LlmEvent::Usage(u)).await?;
        }
        if let Some(h) = v.get("hermes")
            && h.get("failed").and_then(Value::as_bool) == Some(true)
        {
            let msg = h.get("error").map(error_message).unwrap_or_default();
            return Err(LlmError::HermesFailed(msg));
        }
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
            return Ok(false); // usage-only chunk
        };
        let finish = choice.get("finish_reason").and_then(Value::as_str);
        if finish == Some("error") {
            return Err(LlmError::FinishedWithError);
        }
        if let Some(calls) = choice.get("delta").and_then(|d| d.get("tool_calls")) {
            self.got_first = true;
            self.calls.push(calls);
        }
        if let Some(text) = choice
            .get("delta")
            .and_then(|d| d.get("content"))
            .and_then(Value::as_str)
        {
            self.text.push_str(text);
            let text = self.think.push(text);
            self.emit(text, tx).await?;
        }
        if finish.is_some() {
            self.finished = true;
            self.flush(tx).await?;
        }
        Ok(false)
    }

    async fn emit(&mut self, text: String, tx: &mpsc::Sender<LlmEvent>) -> Result<(), LlmError> {
        let text = if self.segment_start {
            let t = text.trim_start();
            if t.is_empty() {
                return Ok(());
            }
            self.segment_start = false;
            t.to_string()
        } else {
            text
        };
        if text.is_empty() {
            return Ok(());
        }
        self.got_first = true;
        send(tx, LlmEvent::Delta(text)).await
    }

    async fn flush(&mut self, tx: &mpsc::Sender<LlmEvent>) -> Result<(), LlmError> {
        let rest = self.think.finish();
        self.emit(rest, tx).await
    }
}

async fn send(tx: &mpsc::Sender<LlmEvent>, ev: LlmEvent) -> Result<(), LlmError> {
    tx.send(ev).await.map_err(|_| LlmError::Abandoned)
}

/// Removes `<think>…</think>` spans from streamed text, tags possibly split across deltas.
#[derive(Debug, Default)]
pub(crate) struct ThinkFilter {
    in_think: bool,
    pending: String,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkFilter {
    pub(crate) fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let mut out = String::new();
        loop {
            let tag = if self.in_think { CLOSE } else { OPEN };
            if let Some(i) = self.pending.find(tag) {
                if !self.in_think {
                    out.push_str(&self.pending[..i]);
                }
                self.pending.replace_range(..i + tag.len(), "");
                self.in_think = !self.in_think;
                continue;
            }
            // Keep a suffix that could be the start of the tag.
            let keep = (1..tag.len())
                .rev()
                .find(|&n| self.pending.ends_with(&tag[..n]))
                .unwrap_or(0);
            let cut = self.pending.len() - keep;
            if !self.in_think {
                out.push_str(&self.pending[..cut]);
            }
            self.pending.replace_range(..cut, "");
            return out;
        }
    }

    pub(crate) fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        if self.in_think { String::new() } else { rest }
    }
}

/// The message of an error object (`{"message": …}`), or the value itself if it is a string.
fn error_message(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string()),
        other => other.to_string(),
    }
}

/// A readable message from an error response body (OpenAI envelope, FastAPI `detail`, text).
pub(crate) fn error_text(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        for key in ["error", "detail", "message"] {
            if let Some(e) = v.get(key) {
                return match e {
                    Value::Object(o) if o.contains_key("message") => error_message(e),
                    Value::Object(o) if o.contains_key("msg") => o
                        .get("msg")
                        .map(error_message)
                        .unwrap_or_else(|| e.to_string()),
                    Value::Array(a) => a
                        .iter()
                        .map(|d| {
                            d.get("msg")
                                .and_then(Value::as_str)
                                .map(str::to_string)
                                .unwrap_or_else(|| d.to_string())
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                    _ => error_message(e),
                };
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".into()
    } else {
        text.chars().take(300).collect()
    }
}

/// A reqwest error with its cause chain (the top level alone says little).
pub(crate) fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    if e.is_connect() {
        s.push_str(" (is the server running, and is base_url right?)");
    }
    s
}

impl super::kinds::LlmKindImpl for OpenAiChat {
    /// Every brain kind speaks Chat Completions: the table with its kind's (or preset's)
    /// defaults filled in.
    fn build(cfg: &LlmConfig) -> Result<Self, SetupError> {
        Self::new(&cfg.resolved())
    }
}

#[cfg(test)]
mod tests;
