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
use serde_json::{Value, json};
use tokio::time::Instant;

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_level;
use checks::{Input, check_session, invalid};

mod checks;
use patterd::net::ws_pump::{self, WsIn};

const SPEECH_LEVEL: f64 = 1000.0;

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
