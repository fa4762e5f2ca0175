//! `FakeAssemblyAi`: AssemblyAI Universal-Streaming v3 (`/v3/ws`), as strict
//! as the real service. The handshake needs the path `/v3/ws`, an `encoding` among v3's and a
//! `sample_rate` for PCM ones (this fake decodes only `pcm_mulaw` at 8000; anything else closes
//! 3006 / 4000 after the upgrade, as the service does), a known `speech_model` when given,
//! `format_turns` a bool and `end_of_turn_confidence_threshold` within 0–1. A wrong or missing
//! raw-key `Authorization` upgrades and closes 4001 "Not authorized" (the service's own way);
//! a test can instead refuse the handshake with an HTTP status. After the upgrade it sends
//! `Begin` {`id`, `expires_at`}, then ends turns from the audio it hears: 20 ms blocks of
//! μ-law above a level are speech. Speech sends `SpeechStarted` once per turn and partial
//! `Turn`s (`end_of_turn:false`) every 300 ms; `eot_ms` of silence sends the `Turn` with
//! `end_of_turn:true` (and, with `format_turns=true`, a second formatted one: capitalised, with
//! a full stop, same `turn_order`). Each binary chunk must be 50–1000 ms of audio (an `Error`
//! 3007 and close 3007 otherwise). Text frames: `Terminate` → `Termination` then close 1000;
//! `ForceEndpoint` ends the open turn now; `KeepAlive` and `UpdateConfiguration` are accepted;
//! anything else closes 4101 (not JSON: 4100). Everything is recorded.

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
const PARTIAL_EVERY_MS: u64 = 300;
const ENCODINGS: &[&str] = &["pcm_s16le", "pcm_mulaw", "opus", "ogg_opus", "aac"];
const MODELS: &[&str] = &[
    "universal-streaming-english",
    "universal-streaming-multilingual",
    "u3-rt-pro",
    "universal-3-5-pro",
    "whisper-rt",
];

/// How the fake misbehaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssemblyAiFailure {
    /// Answer the handshake with this HTTP status (no upgrade).
    RefuseHandshake(u16),
    /// After this many audio bytes, send `Error` 3005 and close 3005.
    ErrorAfterAudioBytes(usize),
}

#[derive(Debug, Clone)]
pub struct FakeAssemblyAiConfig {
    pub api_key: String,
    /// Words for each turn, in order.
    pub turns: Vec<String>,
    pub default_words: String,
    /// Silence before the end of turn.
    pub eot_ms: u64,
    pub failure: Option<AssemblyAiFailure>,
}

impl Default for FakeAssemblyAiConfig {
    fn default() -> Self {
        Self {
            api_key: "aai-test-key".into(),
            turns: Vec::new(),
            default_words: "hello there".into(),
            eot_ms: 600,
            failure: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AssemblyAiConnection {
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub audio_bytes: usize,
    /// The length of every binary chunk received.
    pub chunks: Vec<usize>,
    pub terminates: usize,
    /// Every text frame received.
    pub received: Vec<String>,
    /// Every text frame sent, with when it left.
    pub sent: Vec<(Instant, Value)>,
    /// (code, reason, by_client)
    pub closed: Option<(u16, String, bool)>,
}

impl AssemblyAiConnection {
    /// The `Turn` messages sent with `end_of_turn:true`.
    pub fn ends_of_turn(&self) -> Vec<Value> {
        self.sent
            .iter()
            .filter(|(_, v)| v["type"] == "Turn" && v["end_of_turn"] == true)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct AssemblyAiRecord {
    pub connections: Vec<AssemblyAiConnection>,
    /// Handshakes refused with an HTTP status.
    pub rejected: Vec<(u16, String)>,
}

struct Shared {
    cfg: Mutex<FakeAssemblyAiConfig>,
    turns: Mutex<VecDeque<String>>,
    record: Recorder<AssemblyAiRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

pub struct FakeAssemblyAi(http::Server<Shared>);

impl FakeAssemblyAi {
    pub async fn start_with(cfg: FakeAssemblyAiConfig) -> std::io::Result<Self> {
        let shared = Shared {
            turns: Mutex::new(cfg.turns.iter().cloned().collect()),
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

    pub fn set_failure(&self, failure: Option<AssemblyAiFailure>) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            c.failure = failure;
        }
    }

    pub fn record(&self) -> AssemblyAiRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&AssemblyAiRecord) -> bool,
    ) -> AssemblyAiRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

async fn handle(s: Arc<Shared>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let reject = |status: u16, msg: &str| {
        s.record.modify(|r| r.rejected.push((status, msg.into())));
        http::json(status, &json!({"error": msg}))
    };
    if req.uri().path() != "/v3/ws" {
        return reject(404, "Not found");
    }
    if let Some(AssemblyAiFailure::RefuseHandshake(status)) = cfg.failure {
        return reject(status, "refused by test configuration");
    }
    let query = http::query_pairs(&req);
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    // Decided before the upgrade, reported after it as a close code (the service's way).
    let refusal: Option<(u16, &str)> = if !http::authorized(&req, &cfg.api_key) {
        Some((4001, "Not authorized"))
    } else {
        match (get("encoding").unwrap_or("pcm_s16le"), get("sample_rate")) {
            (e, _) if !ENCODINGS.contains(&e) => Some((3006, "Invalid encoding")),
            ("pcm_mulaw", Some("8000")) => None,
            ("pcm_mulaw", _) => Some((4000, "Sample rate must be 8000 for pcm_mulaw here")),
            _ => Some((3006, "this fake only decodes pcm_mulaw at 8000 Hz")),
        }
        .or_else(|| match get("speech_model") {
            Some(m) if !MODELS.contains(&m) => Some((3006, "Invalid speech_model")),
            _ => None,
        })
        .or_else(|| match get("format_turns") {
            None | Some("true" | "false") => None,
            _ => Some((3006, "format_turns must be a boolean")),
        })
        .or_else(|| match get("end_of_turn_confidence_threshold") {
            None => None,
            Some(v) if v.parse::<f64>().is_ok_and(|v| (0.0..=1.0).contains(&v)) => None,
            _ => Some((
                3006,
                "end_of_turn_confidence_threshold must be between 0 and 1",
            )),
        })
        .or_else(|| match get("max_turn_silence") {
            None => None,
            Some(v) if v.parse::<u32>().is_ok() => None,
            _ => Some((3006, "max_turn_silence must be an integer")),
        })
    };
    if !upgrade::is_upgrade_request(&req) {
        return reject(426, "WebSocket upgrade required");
    }
    let (resp, fut) = match upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(_) => return reject(400, "bad WebSocket handshake"),
    };
    let mut idx = 0;
    let conn = AssemblyAiConnection {
        query: query.clone(),
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    s.record.modify(|r| {
        idx = r.connections.len();
        r.connections.push(conn);
    });
    let formatted = get("format_turns") == Some("true");
    let refusal = refusal.map(|(c, m)| (c, m.to_string()));
    let s2 = s.clone();
    s.tasks.spawn(async move {
        if let Ok(ws) = fut.await {
            session(s2, idx, cfg, formatted, refusal, ws).await;
        }
    });
    resp.map(http_body_util::BodyExt::boxed)
}

/// One turn's state.
#[derive(Default)]
struct Turn {
    order: u64,
    open: bool,
    in_speech: bool,
    words: String,
    silence_ms: u64,
    since_partial_ms: u64,
}

fn formatted_text(words: &str) -> String {
    let mut c = words.chars();
    let mut out: String = match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    };
    if !out.is_empty() && !out.ends_with(['.', '?', '!']) {
        out.push('.');
    }
    out
}

async fn session(
    s: Arc<Shared>,
    idx: usize,
    cfg: FakeAssemblyAiConfig,
    formatted: bool,
    refusal: Option<(u16, String)>,
    ws: fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    let (mut rx, tx, _reader) = ws_pump::split(ws);
    let rec = |f: &mut dyn FnMut(&mut AssemblyAiConnection)| {
        s.record.modify(|r| f(&mut r.connections[idx]))
    };
    if let Some((code, reason)) = refusal {
        let _ = tx.close(code, &reason).await;
        rec(&mut |c| c.closed = Some((code, reason.clone(), false)));
        return;
    }
    let next_words = || {
        s.turns
            .lock()
            .ok()
            .and_then(|mut q| q.pop_front())
            .unwrap_or_else(|| cfg.default_words.clone())
    };
    macro_rules! send {
        ($v:expr) => {{
            let v: Value = $v;
            let ok = tx.text(&v.to_string()).await.is_ok();
            let at = Instant::now();
            rec(&mut |c| c.sent.push((at, v.clone())));
            ok
        }};
    }
    macro_rules! turn_msg {
        ($t:expr, $end:expr, $fmt:expr, $conf:expr) => {{
            let t: &Turn = $t;
            let text = if $fmt {
                formatted_text(&t.words)
            } else {
                t.words.clone()
            };
            let words: Vec<Value> = text
                .split_whitespace()
                .map(|w| json!({"text": w, "start": 0, "end": 0, "confidence": 0.97, "word_is_final": $end}))
                .collect();
            send!(json!({
                "type": "Turn", "turn_order": t.order, "turn_is_formatted": $fmt,
                "end_of_turn": $end, "transcript": text,
                "end_of_turn_confidence": $conf, "words": words,
            }))
        }};
    }
    macro_rules! end_turn {
        ($turn:expr) => {{
            let mut ok = turn_msg!(&$turn, true, false, 0.91);
            if formatted {
                ok &= turn_msg!(&$turn, true, true, 0.91);
            }
            $turn = Turn {
                order: $turn.order + 1,
                ..Default::default()
            };
            ok
        }};
    }
    let id = format!("fake-{idx}");
    if !send!(json!({"type": "Begin", "id": id, "expires_at": 4_102_444_800u64})) {
        return;
    }
    let mut audio_ms = 0u64;
    let mut turn = Turn::default();
    let ended = loop {
        let Some(msg) = rx.recv().await else {
            break (1006, String::new(), true);
        };
        match msg {
            WsIn::Binary(b) => {
                // μ-law 8 kHz: 8 bytes a millisecond.
                let ms = b.len() as u64 / 8;
                let mut total = 0;
                rec(&mut |c| {
                    c.audio_bytes += b.len();
                    c.chunks.push(b.len());
                    total = c.audio_bytes;
                });
                if !(50..=1000).contains(&ms) {
                    let why = "Audio chunk duration violation";
                    send!(json!({"type": "Error", "error_code": 3007, "error": why}));
                    let _ = tx.close(3007, why).await;
                    break (3007, why.into(), false);
                }
                if let Some(AssemblyAiFailure::ErrorAfterAudioBytes(n)) =
                    s.cfg.lock().ok().and_then(|c| c.failure.clone())
                    && total >= n
                {
                    let why = "the fake failed on purpose";
                    send!(json!({"type": "Error", "error_code": 3005, "error": why}));
                    let _ = tx.close(3005, why).await;
                    break (3005, why.into(), false);
                }
                let mut ok = true;
                for block in b.chunks(160) {
                    let ms = block.len() as u64 / 8;
                    audio_ms += ms;
                    if mulaw_level(block) >= SPEECH_LEVEL {
                        if !turn.open {
                            turn.open = true;
                            turn.words = next_words();
                            ok &=
                                send!(json!({"type": "SpeechStarted", "timestamp": audio_ms - ms}));
                        }
                        turn.in_speech = true;
                        turn.silence_ms = 0;
                        turn.since_partial_ms += ms;
                        if turn.since_partial_ms >= PARTIAL_EVERY_MS {
                            turn.since_partial_ms = 0;
                            ok &= turn_msg!(&turn, false, false, 0.05);
                        }
                    } else if turn.open {
                        turn.in_speech = false;
                        turn.silence_ms += ms;
                        if turn.silence_ms >= cfg.eot_ms {
                            ok &= end_turn!(turn);
                        }
                    }
                }
                if !ok {
                    break (1006, String::new(), true);
                }
            }
            WsIn::Text(t) => {
                rec(&mut |c| c.received.push(t.clone()));
                let Ok(v) = serde_json::from_str::<Value>(&t) else {
                    let _ = tx.close(4100, "Invalid JSON").await;
                    break (4100, "Invalid JSON".into(), false);
                };
                match v["type"].as_str() {
                    Some("Terminate") => {
                        rec(&mut |c| c.terminates += 1);
                        send!(json!({
                            "type": "Termination",
                            "audio_duration_seconds": audio_ms / 1000,
                            "session_duration_seconds": audio_ms / 1000,
                        }));
                        let _ = tx.close(1000, "").await;
                        break (1000, String::new(), false);
                    }
                    Some("ForceEndpoint") => {
                        if turn.open && !end_turn!(turn) {
                            break (1006, String::new(), true);
                        }
                    }
                    Some("KeepAlive" | "UpdateConfiguration") => {}
                    _ => {
                        let _ = tx.close(4101, "Invalid schema").await;
                        break (4101, "Invalid schema".into(), false);
                    }
                }
            }
            WsIn::Close { code, reason } => break (code.unwrap_or(1005), reason, true),
            WsIn::Failed(_) => break (1006, String::new(), true),
        }
    };
    rec(&mut |c| c.closed = Some(ended.clone()));
}
