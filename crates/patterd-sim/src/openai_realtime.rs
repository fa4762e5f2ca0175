//! `FakeOpenAiRealtime`: OpenAI's Realtime transcription WebSocket (GA
//! interface), as strict as the real service. The handshake needs the path `/v1/realtime`
//! with `intent=transcription` (HTTP 400 otherwise); a wrong or missing `Authorization:
//! Bearer <key>` upgrades, then sends an `error` event `invalid_request_error` /
//! `invalid_api_key` and closes 3000 `invalid_request_error.invalid_api_key` (what peers observe
//! from the service); a legacy `OpenAI-Beta: realtime=v1` header is refused the same way with
//! the service's "Realtime Beta API is no longer supported" message. A test can instead
//! refuse the handshake with an HTTP status.
//!
//! After the upgrade it sends `session.created`. `session.update` is checked field by field
//! (`session.type` must be `transcription`; `audio.input.format.type` one of `audio/pcm`
//! (with `rate: 24000`), `audio/pcmu`, `audio/pcma`; a known transcription model and a
//! two-letter language; `turn_detection` null, `server_vad` or `semantic_vad` with their
//! ranges; `noise_reduction` near/far field or null; any unknown key is `unknown_parameter`
//! with its path) and answered `session.updated`, or an `error` event naming the `param`;
//! the legacy `transcription_session.update` and unknown event types are `invalid_value` on
//! `type`. Errors in client events never close the session, as with the service.
//!
//! `input_audio_buffer.append` must carry non-empty base64 `audio` (else an `error`
//! `invalid_value` on `audio`, echoing the client's `event_id`); with `audio/pcmu` each byte is
//! one 8 kHz sample, and 20 ms blocks above a level are speech. With `server_vad`, speech
//! sends `input_audio_buffer.speech_started`, and `silence_duration_ms` of silence
//! `speech_stopped`, `committed`, one `…input_audio_transcription.delta` per word and the
//! `…completed` transcript. With `turn_detection: null`, `input_audio_buffer.commit` does the
//! same for the buffered audio (under 100 ms: `input_audio_buffer_commit_empty`);
//! `input_audio_buffer.clear` answers `input_audio_buffer.cleared`. Audio appended before the
//! first `session.update` is counted (it would be read as the default 24 kHz PCM). Everything
//! is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::upgrade;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_level;
use patterd::net::ws_pump::{self, WsIn};

const SPEECH_LEVEL: f64 = 1000.0;
const MODELS: &[&str] = &[
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-transcribe",
    "whisper-1",
];

/// How the fake misbehaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RealtimeFailure {
    /// Answer the handshake with this HTTP status (no upgrade).
    RefuseHandshake(u16),
    /// After this many audio bytes, send an `error` (`server_error`) and close 1011.
    ErrorAfterAudioBytes(usize),
}

#[derive(Debug, Clone)]
pub struct FakeOpenAiRealtimeConfig {
    pub api_key: String,
    /// Words for each utterance, in order.
    pub utterances: Vec<String>,
    pub default_words: String,
    pub failure: Option<RealtimeFailure>,
}

impl Default for FakeOpenAiRealtimeConfig {
    fn default() -> Self {
        Self {
            api_key: "sk-realtime-test".into(),
            utterances: Vec::new(),
            default_words: "hello there".into(),
            failure: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RealtimeConnection {
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    /// Every `session.update`'s `session`, as received.
    pub session_updates: Vec<Value>,
    /// Appends accepted, and their decoded bytes.
    pub appends: usize,
    pub audio_bytes: usize,
    /// Appends received before the first `session.update`.
    pub appends_before_update: usize,
    pub commits: usize,
    /// Every text frame received.
    pub received: Vec<String>,
    pub binary_frames: usize,
    /// Every event sent, with when it left.
    pub sent: Vec<(Instant, Value)>,
    /// (code, reason, by_client)
    pub closed: Option<(u16, String, bool)>,
}

impl RealtimeConnection {
    /// The `error` events sent.
    pub fn errors(&self) -> Vec<Value> {
        self.events("error")
    }

    /// The events of one type sent.
    pub fn events(&self, ty: &str) -> Vec<Value> {
        self.sent
            .iter()
            .filter(|(_, v)| v["type"] == ty)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct RealtimeRecord {
    pub connections: Vec<RealtimeConnection>,
    /// Handshakes refused with an HTTP status.
    pub rejected: Vec<(u16, String)>,
}

struct Shared {
    cfg: Mutex<FakeOpenAiRealtimeConfig>,
    utterances: Mutex<VecDeque<String>>,
    record: Recorder<RealtimeRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

pub struct FakeOpenAiRealtime(http::Server<Shared>);

impl FakeOpenAiRealtime {
    pub async fn start_with(cfg: FakeOpenAiRealtimeConfig) -> std::io::Result<Self> {
        let shared = Shared {
            utterances: Mutex::new(cfg.utterances.iter().cloned().collect()),
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `ws://127.0.0.1:PORT/v1`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("ws://{}/v1", self.0.addr)
    }

    pub fn set_failure(&self, failure: Option<RealtimeFailure>) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            c.failure = failure;
        }
    }

    pub fn record(&self) -> RealtimeRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&RealtimeRecord) -> bool,
    ) -> RealtimeRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

fn api_error(status: u16, code: &str, message: &str) -> hyper::Response<Body> {
    http::json(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
    )
}

async fn handle(s: Arc<Shared>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let reject = |status: u16, code: &str, msg: &str| {
        s.record.modify(|r| r.rejected.push((status, msg.into())));
        api_error(status, code, msg)
    };
    if req.uri().path() != "/v1/realtime" {
        return reject(404, "unknown_url", "Unknown request URL");
    }
    if let Some(RealtimeFailure::RefuseHandshake(status)) = cfg.failure {
        return reject(status, "refused", "refused by test configuration");
    }
    let query = http::query_pairs(&req);
    if !query
        .iter()
        .any(|(k, v)| k == "intent" && v == "transcription")
    {
        return reject(
            400,
            "missing_required_parameter",
            "this fake serves transcription sessions only: add intent=transcription",
        );
    }
    if !upgrade::is_upgrade_request(&req) {
        return reject(426, "upgrade_required", "WebSocket upgrade required");
    }
    let refusal: Option<(&str, String)> =
        if !http::authorized(&req, &format!("Bearer {}", cfg.api_key)) {
            Some((
                "invalid_api_key",
                "Incorrect API key provided. You can find your API key at \
                 https://platform.openai.com/account/api-keys."
                    .into(),
            ))
        } else if req
            .headers()
            .get("openai-beta")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("realtime=v1"))
        {
            Some((
            "beta_api_unsupported",
            "The Realtime Beta API is no longer supported. Please use /v1/realtime for the GA API."
                .into(),
        ))
        } else {
            None
        };
    let (resp, fut) = match upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(_) => return reject(400, "bad_handshake", "bad WebSocket handshake"),
    };
    let mut idx = 0;
    let conn = RealtimeConnection {
        query,
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    s.record.modify(|r| {
        idx = r.connections.len();
        r.connections.push(conn);
    });
    let refusal = refusal.map(|(c, m)| (c.to_string(), m));
    let s2 = s.clone();
    s.tasks.spawn(async move {
        if let Ok(ws) = fut.await {
            session(s2, idx, cfg, refusal, ws).await;
        }
    });
    resp.map(http_body_util::BodyExt::boxed)
}

/// The input settings `session.update` chose.
#[derive(Debug, Clone)]
struct Input {
    pcmu: bool,
    /// `None`: no server VAD (the client commits).
    silence_ms: Option<u64>,
}

/// An `error` event's inner object for a client event.
fn invalid(code: &str, message: &str, param: &str, event_id: &Value) -> Value {
    json!({
        "type": "invalid_request_error", "code": code, "message": message,
        "param": param, "event_id": event_id,
    })
}

/// Checks `keys` of `obj` against `allowed`; the first unknown one as an error.
fn unknown_key(obj: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("{path}.{k}")),
        None => Ok(()),
    }
}

/// A refused `session.update`: (code, message, param).
type Refusal = (String, String, String);

fn unknown(p: String) -> Refusal {
    (
        "unknown_parameter".to_string(),
        format!("Unknown parameter: '{p}'."),
        p,
    )
}

fn bad(p: &str, m: &str) -> Refusal {
    ("invalid_value".to_string(), m.to_string(), p.to_string())
}

/// Validates a `session.update`'s `session` (GA transcription shape); the error is
/// (code, message, param).
fn check_session(session: &Value) -> Result<Input, Refusal> {
    let Some(s) = session.as_object() else {
        return Err((
            "missing_required_parameter".into(),
            "Missing required parameter: 'session'.".into(),
            "session".into(),
        ));
    };
    unknown_key(s, &["type", "audio", "include"], "session").map_err(unknown)?;
    match s.get("type").and_then(Value::as_str) {
        Some("transcription") => {}
        None => {
            return Err((
                "missing_required_parameter".into(),
                "Missing required parameter: 'session.type'.".into(),
                "session.type".into(),
            ));
        }
        Some(_) => {
            return Err(bad(
                "session.type",
                "this endpoint (intent=transcription) takes session.type 'transcription'",
            ));
        }
    }
    let empty = Map::new();
    let audio = s.get("audio").and_then(Value::as_object).unwrap_or(&empty);
    unknown_key(audio, &["input"], "session.audio").map_err(unknown)?;
    let input = audio
        .get("input")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    unknown_key(
        input,
        &[
            "format",
            "transcription",
            "turn_detection",
            "noise_reduction",
        ],
        "session.audio.input",
    )
    .map_err(unknown)?;
    let pcmu = match input.get("format") {
        Some(f) => check_format(f)?,
        None => false,
    };
    if let Some(t) = input.get("transcription").filter(|t| !t.is_null()) {
        check_transcription(t)?;
    }
    let silence_ms = match input.get("turn_detection") {
        Some(td) => check_turn_detection(td)?,
        None => Some(500),
    };
    if let Some(n) = input.get("noise_reduction").filter(|n| !n.is_null()) {
        let ok = n.as_object().is_some_and(|o| {
            o.len() == 1
                && matches!(
                    o.get("type").and_then(Value::as_str),
                    Some("near_field" | "far_field")
                )
        });
        if !ok {
            return Err(bad(
                "session.audio.input.noise_reduction.type",
                "noise_reduction.type must be near_field or far_field",
            ));
        }
    }
    Ok(Input { pcmu, silence_ms })
}

/// `session.audio.input.format`; whether it is `audio/pcmu`.
fn check_format(f: &Value) -> Result<bool, Refusal> {
    let fo = f.as_object().ok_or_else(|| {
        bad(
            "session.audio.input.format",
            "format must be an object with a type",
        )
    })?;
    unknown_key(fo, &["type", "rate"], "session.audio.input.format").map_err(unknown)?;
    match (
        fo.get("type").and_then(Value::as_str),
        fo.get("rate").and_then(Value::as_u64),
    ) {
        (Some("audio/pcm"), Some(24000)) => Ok(false),
        (Some("audio/pcm"), _) => Err(bad(
            "session.audio.input.format.rate",
            "audio/pcm takes rate 24000",
        )),
        (Some("audio/pcmu" | "audio/pcma"), None) => Ok(fo["type"] == "audio/pcmu"),
        (Some("audio/pcmu" | "audio/pcma"), Some(_)) => {
            Err(unknown("session.audio.input.format.rate".into()))
        }
        _ => Err(bad(
            "session.audio.input.format.type",
            "Invalid value: supported values are 'audio/pcm', 'audio/pcmu' and 'audio/pcma'.",
        )),
    }
}

/// `session.audio.input.transcription` (not null).
fn check_transcription(t: &Value) -> Result<(), Refusal> {
    let to = t.as_object().ok_or_else(|| {
        bad(
            "session.audio.input.transcription",
            "transcription must be an object",
        )
    })?;
    unknown_key(
        to,
        &[
            "model",
            "language",
            "prompt",
            "languages",
            "keywords",
            "delay",
        ],
        "session.audio.input.transcription",
    )
    .map_err(unknown)?;
    match to.get("model").and_then(Value::as_str) {
        Some(m) if MODELS.contains(&m) => {}
        _ => {
            return Err(bad(
                "session.audio.input.transcription.model",
                "Invalid transcription model.",
            ));
        }
    }
    if let Some(l) = to.get("language") {
        let ok = l
            .as_str()
            .is_some_and(|l| l.len() == 2 && l.chars().all(|c| c.is_ascii_lowercase()));
        if !ok {
            return Err(bad(
                "session.audio.input.transcription.language",
                "language must be an ISO-639-1 code such as 'en'",
            ));
        }
    }
    if to.get("prompt").is_some_and(|p| !p.is_string()) {
        return Err(bad(
            "session.audio.input.transcription.prompt",
            "prompt must be a string",
        ));
    }
    Ok(())
}

const TURN_DETECTION: &str = "session.audio.input.turn_detection";

/// `session.audio.input.turn_detection`; the silence that ends a turn (`None`: null, no VAD).
fn check_turn_detection(td: &Value) -> Result<Option<u64>, Refusal> {
    const P: &str = TURN_DETECTION;
    if td.is_null() {
        return Ok(None);
    }
    let o = td
        .as_object()
        .ok_or_else(|| bad(P, "turn_detection must be an object or null"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("server_vad") => check_server_vad(o).map(Some),
        Some("semantic_vad") => {
            unknown_key(
                o,
                &["type", "eagerness", "create_response", "interrupt_response"],
                P,
            )
            .map_err(unknown)?;
            let e = o.get("eagerness").and_then(Value::as_str).unwrap_or("auto");
            match e {
                "high" => Ok(Some(300)),
                "medium" | "auto" => Ok(Some(600)),
                "low" => Ok(Some(1000)),
                _ => Err(bad(
                    &format!("{P}.eagerness"),
                    "eagerness must be low, medium, high or auto",
                )),
            }
        }
        _ => Err(bad(
            &format!("{P}.type"),
            "turn_detection.type must be server_vad or semantic_vad",
        )),
    }
}

/// A `server_vad` turn detection; its `silence_duration_ms` (default 500).
fn check_server_vad(o: &Map<String, Value>) -> Result<u64, Refusal> {
    const P: &str = TURN_DETECTION;
    unknown_key(
        o,
        &[
            "type",
            "threshold",
            "prefix_padding_ms",
            "silence_duration_ms",
            "idle_timeout_ms",
            "create_response",
            "interrupt_response",
        ],
        P,
    )
    .map_err(unknown)?;
    if o.get("threshold")
        .is_some_and(|t| !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)))
    {
        return Err(bad(
            &format!("{P}.threshold"),
            "threshold must be between 0 and 1",
        ));
    }
    for k in ["prefix_padding_ms", "silence_duration_ms"] {
        if o.get(k).is_some_and(|v| v.as_u64().is_none()) {
            return Err(bad(&format!("{P}.{k}"), "must be a non-negative integer"));
        }
    }
    if o.get("idle_timeout_ms")
        .is_some_and(|v| !v.as_u64().is_some_and(|v| (5000..=30000).contains(&v)))
    {
        return Err(bad(
            &format!("{P}.idle_timeout_ms"),
            "idle_timeout_ms must be between 5000 and 30000",
        ));
    }
    Ok(o.get("silence_duration_ms")
        .and_then(Value::as_u64)
        .unwrap_or(500))
}

/// One utterance being heard.
#[derive(Default)]
struct Utterance {
    item: Option<String>,
    silence_ms: u64,
    start_ms: u64,
    speech: bool,
}

/// How a connection ended: (code, reason, whether the client closed it).
type Ended = (u16, String, bool);

/// The socket went away while the fake was sending.
fn gone() -> Ended {
    (1006, String::new(), true)
}

type Sender =
    ws_pump::WsSender<tokio::io::WriteHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>;

/// One connection's sending side, its ids and its record.
struct Conn {
    s: Arc<Shared>,
    idx: usize,
    /// Shared by event and item ids.
    seq: u64,
    tx: Sender,
    /// Transcribed when the queue of utterances is empty.
    default_words: String,
}

/// What the connection has heard since it was opened.
#[derive(Default)]
struct Heard {
    input: Option<Input>,
    audio_ms: u64,
    buffered_ms: u64,
    buffered_speech: bool,
    previous_item: Option<String>,
    utt: Utterance,
}

impl Heard {
    /// An utterance was transcribed: the buffer starts again.
    fn committed(&mut self, item: String) {
        self.previous_item = Some(item);
        self.utt = Utterance::default();
        self.buffered_ms = 0;
        self.buffered_speech = false;
    }
}

impl Conn {
    fn rec(&self, f: impl FnOnce(&mut RealtimeConnection)) {
        self.s.record.modify(|r| f(&mut r.connections[self.idx]));
    }

    fn next_id(&mut self, prefix: &str) -> String {
        self.seq += 1;
        format!("{prefix}_fake{}_{}", self.idx, self.seq)
    }

    fn next_words(&self) -> String {
        self.s
            .utterances
            .lock()
            .ok()
            .and_then(|mut q| q.pop_front())
            .unwrap_or_else(|| self.default_words.clone())
    }

    /// Sends `v` with a fresh `event_id` and records it; false when the socket is gone.
    async fn send(&mut self, mut v: Value) -> bool {
        v["event_id"] = json!(self.next_id("event"));
        let ok = self.tx.text(&v.to_string()).await.is_ok();
        let at = Instant::now();
        self.rec(|c| c.sent.push((at, v)));
        ok
    }

    async fn send_invalid(&mut self, code: &str, message: &str, param: &str, eid: &Value) {
        self.send(json!({"type": "error", "error": invalid(code, message, param, eid)}))
            .await;
    }

    /// Sends `committed`, a `delta` per word and `completed` for `item` (`words` may be
    /// empty). False when the socket is gone.
    async fn transcribe(&mut self, item: &str, previous: &Option<String>, words: String) -> bool {
        let mut ok = self
            .send(json!({"type": "input_audio_buffer.committed",
                "item_id": item, "previous_item_id": previous}))
            .await;
        let mut first = true;
        for w in words.split_whitespace() {
            let delta = if first {
                w.to_string()
            } else {
                format!(" {w}")
            };
            first = false;
            ok &= self
                .send(
                    json!({"type": "conversation.item.input_audio_transcription.delta",
                    "item_id": item, "content_index": 0, "delta": delta}),
                )
                .await;
        }
        ok &= self
            .send(
                json!({"type": "conversation.item.input_audio_transcription.completed",
                "item_id": item, "content_index": 0, "transcript": words,
                "usage": {"type": "duration", "seconds": 1}}),
            )
            .await;
        ok
    }

    /// One text frame; `Some` ends the connection.
    async fn on_text(&mut self, t: &str, heard: &mut Heard, session_id: &str) -> Option<Ended> {
        let Ok(v) = serde_json::from_str::<Value>(t) else {
            self.send_invalid(
                "invalid_json",
                "We could not parse the JSON body of your request.",
                "",
                &Value::Null,
            )
            .await;
            return None;
        };
        let eid = v.get("event_id").cloned().unwrap_or(Value::Null);
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "session.update" => {
                let sess = v.get("session").cloned().unwrap_or(Value::Null);
                self.rec(|c| c.session_updates.push(sess.clone()));
                match check_session(&sess) {
                    Ok(i) => {
                        heard.input = Some(i);
                        let mut echoed = sess;
                        echoed["id"] = json!(session_id);
                        self.send(json!({"type": "session.updated", "session": echoed}))
                            .await;
                    }
                    Err((code, message, param)) => {
                        self.send_invalid(&code, &message, &param, &eid).await;
                    }
                }
            }
            "input_audio_buffer.append" => return self.on_append(&v, &eid, heard).await,
            "input_audio_buffer.commit" => return self.on_commit(&eid, heard).await,
            "input_audio_buffer.clear" => {
                heard.buffered_ms = 0;
                heard.buffered_speech = false;
                heard.utt = Utterance::default();
                self.send(json!({"type": "input_audio_buffer.cleared"}))
                    .await;
            }
            other => {
                let msg = if other == "transcription_session.update" {
                    "Invalid value: 'transcription_session.update'. This is a beta event; use 'session.update' with session.type 'transcription'.".to_string()
                } else {
                    format!(
                        "Invalid value: '{other}'. Supported values are: 'session.update', 'input_audio_buffer.append', 'input_audio_buffer.commit' and 'input_audio_buffer.clear'."
                    )
                };
                self.send_invalid("invalid_value", &msg, "type", &eid).await;
            }
        }
        None
    }

    /// `input_audio_buffer.append`: recorded, failed on purpose if so configured, and μ-law
    /// audio heard for server VAD.
    async fn on_append(&mut self, v: &Value, eid: &Value, heard: &mut Heard) -> Option<Ended> {
        let bytes = v
            .get("audio")
            .and_then(Value::as_str)
            .and_then(|a| STANDARD.decode(a).ok())
            .filter(|b| !b.is_empty());
        let Some(bytes) = bytes else {
            self.send_invalid(
                "invalid_value",
                "Invalid 'audio'. Expected base64-encoded audio bytes.",
                "audio",
                eid,
            )
            .await;
            return None;
        };
        let mut total = 0;
        let configured = heard.input.is_some();
        self.rec(|c| {
            c.appends += 1;
            c.audio_bytes += bytes.len();
            total = c.audio_bytes;
            if !configured {
                c.appends_before_update += 1;
            }
        });
        if let Some(RealtimeFailure::ErrorAfterAudioBytes(n)) =
            self.s.cfg.lock().ok().and_then(|c| c.failure.clone())
            && total >= n
        {
            let why = "The fake failed on purpose.";
            self.send(json!({"type": "error", "error": {
                "type": "server_error", "code": "server_error", "message": why,
                "param": null, "event_id": null}}))
                .await;
            let _ = self.tx.close(1011, "server_error").await;
            return Some((1011, "server_error".into(), false));
        }
        // Only μ-law is decoded; other formats count as silence.
        let cur = heard.input.clone().filter(|i| i.pcmu)?;
        self.hear_mulaw(&bytes, cur.silence_ms, heard).await
    }

    /// Server VAD over μ-law audio in 20 ms blocks: `speech_started` on the first loud block,
    /// `speech_stopped` and the transcript after `silence` ms of quiet (`None`: no VAD).
    async fn hear_mulaw(
        &mut self,
        bytes: &[u8],
        silence: Option<u64>,
        heard: &mut Heard,
    ) -> Option<Ended> {
        for block in bytes.chunks(160) {
            let ms = block.len() as u64 / 8;
            heard.audio_ms += ms;
            heard.buffered_ms += ms;
            let loud = mulaw_level(block) >= SPEECH_LEVEL;
            heard.buffered_speech |= loud;
            let Some(silence) = silence else {
                continue;
            };
            if loud {
                if heard.utt.item.is_none() {
                    let item = self.next_id("item");
                    heard.utt = Utterance {
                        item: Some(item.clone()),
                        start_ms: heard.audio_ms - ms,
                        ..Default::default()
                    };
                    if !self
                        .send(json!({"type": "input_audio_buffer.speech_started",
                            "audio_start_ms": heard.utt.start_ms, "item_id": item}))
                        .await
                    {
                        return Some(gone());
                    }
                }
                heard.utt.speech = true;
                heard.utt.silence_ms = 0;
            } else if let Some(item) = heard.utt.item.clone() {
                heard.utt.silence_ms += ms;
                if heard.utt.silence_ms >= silence {
                    let ok = self
                        .send(json!({"type": "input_audio_buffer.speech_stopped",
                            "audio_end_ms": heard.audio_ms, "item_id": item}))
                        .await;
                    let words = self.next_words();
                    if !ok || !self.transcribe(&item, &heard.previous_item, words).await {
                        return Some(gone());
                    }
                    heard.committed(item);
                }
            }
        }
        None
    }

    /// `input_audio_buffer.commit`: at least 100 ms of audio, transcribed (empty if silent).
    async fn on_commit(&mut self, eid: &Value, heard: &mut Heard) -> Option<Ended> {
        self.rec(|c| c.commits += 1);
        if heard.buffered_ms < 100 {
            let message = format!(
                "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, but buffer only has {}.00ms of audio.",
                heard.buffered_ms
            );
            self.send_invalid("input_audio_buffer_commit_empty", &message, "", eid)
                .await;
            return None;
        }
        let item = heard
            .utt
            .item
            .take()
            .unwrap_or_else(|| self.next_id("item"));
        let words = if heard.buffered_speech {
            self.next_words()
        } else {
            String::new()
        };
        if !self.transcribe(&item, &heard.previous_item, words).await {
            return Some(gone());
        }
        heard.committed(item);
        None
    }
}

async fn session(
    s: Arc<Shared>,
    idx: usize,
    cfg: FakeOpenAiRealtimeConfig,
    refusal: Option<(String, String)>,
    ws: fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    let (mut rx, tx, _reader) = ws_pump::split(ws);
    let mut conn = Conn {
        s,
        idx,
        seq: 0,
        tx,
        default_words: cfg.default_words,
    };
    if let Some((code, message)) = refusal {
        conn.send(json!({"type": "error", "error": {
            "type": "invalid_request_error", "code": code, "message": message,
            "param": null, "event_id": null}}))
            .await;
        let reason = format!("invalid_request_error.{code}");
        let _ = conn.tx.close(3000, &reason).await;
        conn.rec(|c| c.closed = Some((3000, reason, false)));
        return;
    }
    let session_id = format!("sess_fake{idx}");
    if !conn
        .send(json!({"type": "session.created", "session": {
            "type": "transcription", "id": session_id, "object": "realtime.transcription_session",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                "transcription": null, "noise_reduction": null,
                "turn_detection": {"type": "server_vad", "threshold": 0.5,
                    "prefix_padding_ms": 300, "silence_duration_ms": 500}}}}}))
        .await
    {
        return;
    }
    let mut heard = Heard::default();
    let ended: Ended = loop {
        let Some(msg) = rx.recv().await else {
            break gone();
        };
        let t = match msg {
            WsIn::Text(t) => t,
            WsIn::Binary(_) => {
                conn.rec(|c| c.binary_frames += 1);
                conn.send_invalid(
                    "invalid_value",
                    "Binary frames are not supported; send JSON events.",
                    "",
                    &Value::Null,
                )
                .await;
                continue;
            }
            WsIn::Close { code, reason } => break (code.unwrap_or(1005), reason, true),
            WsIn::Failed(_) => break gone(),
        };
        conn.rec(|c| c.received.push(t.clone()));
        if let Some(end) = conn.on_text(&t, &mut heard, &session_id).await {
            break end;
        }
    };
    conn.rec(|c| c.closed = Some(ended));
}
