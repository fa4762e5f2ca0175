//! `FakeFlux`: Deepgram Flux turn-based transcription (`/v2/listen`), as
//! strict as the real service. The handshake needs `Authorization: Token <key>` (401 JSON
//! otherwise), `model` = `flux-general-en` or `flux-general-multi`, `encoding` among Flux's
//! (raw ones with a `sample_rate`; patterd's `mulaw` must be 8000), and thresholds in range:
//! `eot_threshold` 0.5–0.9, `eager_eot_threshold` 0.3–0.9 and not above `eot_threshold`,
//! `eot_timeout_ms` 500–10000 (400 JSON otherwise). After the upgrade it sends `Connected`,
//! then ends turns from the audio it hears: 20 ms blocks of μ-law above a level are speech.
//! Speech opens a turn (`TurnInfo` `StartOfTurn`), `Update`s follow every 300 ms; each burst of
//! speech takes the next scripted words and the turn's transcript is the bursts' words joined.
//! After `eager_ms` of silence (only with `eager_eot_threshold`) it sends `EagerEndOfTurn`,
//! speech before `eot_ms` of silence sends `TurnResumed`, and `eot_ms` of silence sends
//! `EndOfTurn`. Every message carries `request_id` and an increasing `sequence_id`.
//! `ForceEndTurn` ends the turn in progress at once (`EndOfTurn`; ignored with no turn open).
//! `CloseStream` closes 1000; an empty binary frame is an error (close 1002 after an `Error`
//! message); failure modes refuse the handshake or send an `Error` (`INTERNAL_SERVER_ERROR`)
//! and close 1011 after some audio. Everything is recorded, with when each event left.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use fastwebsockets::upgrade;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_level;
use patterd::net::ws_pump::{self, WsIn};

const SPEECH_LEVEL: f64 = 1000.0;
const UPDATE_EVERY_MS: u64 = 300;
const ENCODINGS: &[&str] = &["linear16", "linear32", "mulaw", "alaw", "opus", "ogg-opus"];

/// How the fake misbehaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FluxFailure {
    /// Answer the handshake with this HTTP status.
    RefuseHandshake(u16),
    /// After this many audio bytes, send an `Error` message and close 1011.
    ErrorAfterAudioBytes(usize),
}

#[derive(Debug, Clone)]
pub struct FakeFluxConfig {
    pub api_key: String,
    /// Words for each burst of speech, in order.
    pub bursts: Vec<String>,
    pub default_words: String,
    /// Silence before `EagerEndOfTurn` (when the client asked for eager turns).
    pub eager_ms: u64,
    /// Silence before `EndOfTurn`.
    pub eot_ms: u64,
    pub failure: Option<FluxFailure>,
}

impl Default for FakeFluxConfig {
    fn default() -> Self {
        Self {
            api_key: "dg-test-key".into(),
            bursts: Vec::new(),
            default_words: "hello there".into(),
            eager_ms: 200,
            eot_ms: 600,
            failure: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct FluxConnection {
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub audio_bytes: usize,
    pub close_streams: usize,
    /// `ForceEndTurn` messages received.
    pub force_end_turns: usize,
    /// Every text frame received.
    pub received: Vec<String>,
    /// Every text frame sent, with when it left.
    pub sent: Vec<(Instant, Value)>,
    /// (code, reason, by_client)
    pub closed: Option<(u16, String, bool)>,
}

impl FluxConnection {
    /// When each `TurnInfo` event of this kind left.
    pub fn events(&self, event: &str) -> Vec<(Instant, Value)> {
        self.sent
            .iter()
            .filter(|(_, v)| v["type"] == "TurnInfo" && v["event"] == event)
            .cloned()
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct FluxRecord {
    pub connections: Vec<FluxConnection>,
    pub rejected: Vec<(u16, String)>,
}

struct Shared {
    cfg: Mutex<FakeFluxConfig>,
    bursts: Mutex<VecDeque<String>>,
    record: Recorder<FluxRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

pub struct FakeFlux(http::Server<Shared>);

impl FakeFlux {
    pub async fn start_with(cfg: FakeFluxConfig) -> std::io::Result<Self> {
        let shared = Shared {
            bursts: Mutex::new(cfg.bursts.iter().cloned().collect()),
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `ws://127.0.0.1:PORT`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("ws://{}", self.0.addr)
    }

    pub fn set_failure(&self, failure: Option<FluxFailure>) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            c.failure = failure;
        }
    }

    pub fn record(&self) -> FluxRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&FluxRecord) -> bool,
    ) -> FluxRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

async fn handle(s: Arc<Shared>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let mut idb = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut idb);
    let request_id = hex::encode(idb);
    let reject = |status: u16, code: &str, msg: &str| {
        s.record
            .modify(|r| r.rejected.push((status, format!("{code}: {msg}"))));
        let mut resp = http::json(
            status,
            &json!({"err_code": code, "err_msg": msg, "request_id": request_id}),
        );
        if let Ok(v) = hyper::header::HeaderValue::from_str(&request_id) {
            resp.headers_mut().insert("dg-request-id", v);
        }
        resp
    };
    if req.uri().path() != "/v2/listen" {
        return reject(404, "NOT_FOUND", "unknown path");
    }
    if !http::authorized(&req, &format!("Token {}", cfg.api_key)) {
        return reject(401, "INVALID_AUTH", "Invalid credentials.");
    }
    if let Some(FluxFailure::RefuseHandshake(status)) = cfg.failure {
        return reject(status, "REFUSED", "refused by test configuration");
    }
    let query = http::query_pairs(&req);
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let num = |k: &str| get(k).map(|v| v.parse::<f64>().map_err(|_| ()));
    if !matches!(get("model"), Some("flux-general-en" | "flux-general-multi")) {
        return reject(
            400,
            "Bad Request",
            "model must be flux-general-en or flux-general-multi",
        );
    }
    match (get("encoding"), get("sample_rate")) {
        (Some("mulaw"), Some("8000")) => {}
        (Some("mulaw"), _) => return reject(400, "Bad Request", "mulaw needs sample_rate=8000"),
        (Some(e), _) if ENCODINGS.contains(&e) => {
            return reject(
                400,
                "Bad Request",
                "this fake only decodes mulaw at 8000 Hz",
            );
        }
        _ => return reject(400, "Bad Request", "encoding is missing or unsupported"),
    }
    let eot = match num("eot_threshold") {
        None => 0.7,
        Some(Ok(v)) if (0.5..=0.9).contains(&v) => v,
        _ => {
            return reject(
                400,
                "Bad Request",
                "eot_threshold must be between 0.5 and 0.9",
            );
        }
    };
    let eager = match num("eager_eot_threshold") {
        None => None,
        Some(Ok(v)) if (0.3..=0.9).contains(&v) && v <= eot => Some(v),
        _ => {
            return reject(
                400,
                "Bad Request",
                "eager_eot_threshold must be between 0.3 and 0.9 and not above eot_threshold",
            );
        }
    };
    match num("eot_timeout_ms") {
        None => {}
        Some(Ok(v)) if (500.0..=10000.0).contains(&v) => {}
        _ => {
            return reject(
                400,
                "Bad Request",
                "eot_timeout_ms must be between 500 and 10000",
            );
        }
    }
    if !upgrade::is_upgrade_request(&req) {
        return reject(426, "Bad Request", "WebSocket upgrade required");
    }
    let (resp, fut) = match upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(_) => return reject(400, "Bad Request", "bad WebSocket handshake"),
    };
    let mut idx = 0;
    let conn = FluxConnection {
        query: query.clone(),
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    s.record.modify(|r| {
        idx = r.connections.len();
        r.connections.push(conn);
    });
    let s2 = s.clone();
    let rid = request_id.clone();
    s.tasks.spawn(async move {
        if let Ok(ws) = fut.await {
            session(s2, idx, cfg, eager.is_some(), rid, ws).await;
        }
    });
    let mut resp = resp.map(http_body_util::BodyExt::boxed);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("dg-request-id", v);
    }
    resp
}

/// One turn's state.
#[derive(Default)]
struct Turn {
    index: u64,
    open: bool,
    in_speech: bool,
    words: Vec<String>,
    speech_ms: u64,
    silence_ms: u64,
    since_update_ms: u64,
    eager_sent: bool,
    start_ms: u64,
}

#[allow(unused_assignments)] // the last message's sequence_id bump
async fn session(
    s: Arc<Shared>,
    idx: usize,
    cfg: FakeFluxConfig,
    eager: bool,
    request_id: String,
    ws: fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    let (mut rx, tx, _reader) = ws_pump::split(ws);
    let mut seq = 0u64;
    let mut audio_ms = 0u64;
    let mut turn = Turn::default();
    let rec =
        |f: &mut dyn FnMut(&mut FluxConnection)| s.record.modify(|r| f(&mut r.connections[idx]));
    let next_words = || {
        s.bursts
            .lock()
            .ok()
            .and_then(|mut q| q.pop_front())
            .unwrap_or_else(|| cfg.default_words.clone())
    };
    macro_rules! send {
        ($v:expr) => {{
            let mut v: Value = $v;
            v["request_id"] = json!(request_id);
            v["sequence_id"] = json!(seq);
            seq += 1;
            let ok = tx.text(&v.to_string()).await.is_ok();
            let at = Instant::now();
            rec(&mut |c| c.sent.push((at, v.clone())));
            ok
        }};
    }
    macro_rules! turn_info {
        ($event:expr, $conf:expr) => {{
            let transcript = turn.words.join(" ");
            let words: Vec<Value> = transcript
                .split_whitespace()
                .map(|w| json!({"word": w, "confidence": 0.98}))
                .collect();
            send!(json!({
                "type": "TurnInfo", "event": $event, "turn_index": turn.index,
                "audio_window_start": turn.start_ms as f64 / 1000.0,
                "audio_window_end": audio_ms as f64 / 1000.0,
                "transcript": transcript, "words": words,
                "end_of_turn_confidence": $conf,
            }))
        }};
    }
    if !send!(json!({"type": "Connected"})) {
        return;
    }
    let ended = loop {
        let Some(msg) = rx.recv().await else {
            break (1006, String::new(), true);
        };
        match msg {
            WsIn::Binary(b) => {
                if b.is_empty() {
                    send!(
                        json!({"type": "Error", "code": "INVALID_AUDIO", "description": "empty binary frame"})
                    );
                    let _ = tx.close(1002, "empty binary frame").await;
                    break (1002, "empty binary frame".into(), false);
                }
                let mut total = 0;
                rec(&mut |c| {
                    c.audio_bytes += b.len();
                    total = c.audio_bytes;
                });
                if let Some(FluxFailure::ErrorAfterAudioBytes(n)) =
                    s.cfg.lock().ok().and_then(|c| c.failure.clone())
                    && total >= n
                {
                    send!(
                        json!({"type": "Error", "code": "INTERNAL_SERVER_ERROR", "description": "the fake failed on purpose"})
                    );
                    let _ = tx.close(1011, "INTERNAL_SERVER_ERROR").await;
                    break (1011, "INTERNAL_SERVER_ERROR".into(), false);
                }
                let mut ok = true;
                for block in b.chunks(160) {
                    let ms = block.len() as u64 / 8;
                    audio_ms += ms;
                    let speech = mulaw_level(block) >= SPEECH_LEVEL;
                    if speech {
                        if !turn.open {
                            turn.open = true;
                            turn.start_ms = audio_ms - ms;
                            ok &= turn_info!("StartOfTurn", 0.0);
                        }
                        if !turn.in_speech {
                            turn.in_speech = true;
                            turn.words.push(next_words());
                            if turn.eager_sent {
                                turn.eager_sent = false;
                                ok &= turn_info!("TurnResumed", 0.2);
                            }
                        }
                        turn.silence_ms = 0;
                        turn.speech_ms += ms;
                        turn.since_update_ms += ms;
                        if turn.since_update_ms >= UPDATE_EVERY_MS {
                            turn.since_update_ms = 0;
                            ok &= turn_info!("Update", 0.1);
                        }
                    } else if turn.open {
                        turn.in_speech = false;
                        turn.silence_ms += ms;
                        if eager && !turn.eager_sent && turn.silence_ms >= cfg.eager_ms {
                            turn.eager_sent = true;
                            ok &= turn_info!("EagerEndOfTurn", 0.55);
                        }
                        if turn.silence_ms >= cfg.eot_ms {
                            ok &= turn_info!("EndOfTurn", 0.85);
                            turn = Turn {
                                index: turn.index + 1,
                                ..Default::default()
                            };
                        }
                    }
                }
                if !ok {
                    break (1006, String::new(), true);
                }
            }
            WsIn::Text(t) => {
                rec(&mut |c| c.received.push(t.clone()));
                let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                match v["type"].as_str() {
                    Some("CloseStream") => {
                        rec(&mut |c| c.close_streams += 1);
                        let _ = tx.close(1000, "").await;
                        break (1000, String::new(), false);
                    }
                    Some("Configure") => {
                        send!(json!({"type": "ConfigureSuccess", "thresholds": v["thresholds"]}));
                    }
                    Some("ForceEndTurn") => {
                        // Ends the turn in progress now, as if detected; ignored without one.
                        rec(&mut |c| c.force_end_turns += 1);
                        if turn.open {
                            if !turn_info!("EndOfTurn", 1.0) {
                                break (1006, String::new(), true);
                            }
                            turn = Turn {
                                index: turn.index + 1,
                                ..Default::default()
                            };
                        }
                    }
                    _ => {
                        send!(
                            json!({"type": "Error", "code": "UNPARSABLE_CLIENT_MESSAGE", "description": format!("unknown message: {t}")})
                        );
                        let _ = tx.close(1008, "UNPARSABLE_CLIENT_MESSAGE").await;
                        break (1008, "UNPARSABLE_CLIENT_MESSAGE".into(), false);
                    }
                }
            }
            WsIn::Close { code, reason } => break (code.unwrap_or(1005), reason, true),
            WsIn::Failed(_) => break (1006, String::new(), true),
        }
    };
    rec(&mut |c| c.closed = Some(ended.clone()));
}
