//! `FakeElevenLabs`: the ElevenLabs HTTP streaming endpoint
//! `POST /v1/text-to-speech/{voice_id}/stream` (as ElevenLabs documents it), and its
//! `…/stream/with-timestamps` twin, whose body is JSON lines of base64 `audio_base64` with the
//! `alignment` / `normalized_alignment` of the characters starting in that chunk (`characters`,
//! `character_start_times_seconds`, `character_end_times_seconds`, seconds from the start of
//! the request's audio; [`crate::alignment`] spreads the characters evenly over the clip). As
//! strict as the real one:
//! `xi-api-key` must match (401 JSON `detail` otherwise), `output_format=ulaw_8000`, and a JSON
//! body with a non-empty `text` and a `model_id` (422 with a validation `detail` otherwise). It
//! answers `audio/basic` μ-law: a tone lasting `ms_per_char` per character of text (at least
//! `min_ms`), in `chunk_ms` pieces after `first_chunk_delay`, paced by `chunk_interval`. It
//! records every request and whether the client went away before the audio ended (the body
//! was dropped: cancellation). A failure mode answers every request with 500 or 401. With a
//! `voice` clip set, the audio is that clip (repeated as needed) instead of a tone, so the
//! agent sounds like speech to a voice-activity detector and can be echoed back. The same
//! server answers the multi-context WebSocket `/v1/text-to-speech/{voice_id}/multi-stream-input`
//! (`crate::elevenlabs_ws`), recorded in `ws_sockets` / `ws_contexts` / `ws_errors`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_tone;

/// Settings of a [`FakeElevenLabs`].
#[derive(Debug, Clone)]
pub struct FakeElevenLabsConfig {
    pub api_key: String,
    pub ms_per_char: u32,
    pub min_ms: u32,
    /// Audio per body chunk.
    pub chunk_ms: u32,
    pub first_chunk_delay: Duration,
    /// Pause between later chunks.
    pub chunk_interval: Duration,
    /// Answer every request with this status (500 or 401 style) instead of audio.
    pub fail_status: Option<u16>,
    /// Requests whose text contains this answer 500 (the others are served): one failing
    /// sentence among good ones.
    pub fail_text_containing: Option<String>,
    /// Requests whose text contains this get a 200 head and then no audio at all (a stall).
    pub stall_text_containing: Option<String>,
    /// μ-law speech to speak with instead of a tone (repeated to the needed length).
    pub voice: Option<Arc<Vec<u8>>>,
}

impl Default for FakeElevenLabsConfig {
    fn default() -> Self {
        Self {
            api_key: "el-test-key".into(),
            ms_per_char: 10,
            min_ms: 200,
            chunk_ms: 100,
            first_chunk_delay: Duration::from_millis(0),
            chunk_interval: Duration::from_millis(5),
            fail_status: None,
            fail_text_containing: None,
            stall_text_containing: None,
            voice: None,
        }
    }
}

/// One synthesis request.
#[derive(Debug, Clone, Default)]
pub struct TtsRequest {
    pub voice_id: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub text: String,
    pub model_id: String,
    /// The HTTP status answered.
    pub status: u16,
    pub bytes_sent: usize,
    /// All audio was handed to the connection.
    pub completed: bool,
    /// The client dropped the response before the audio ended.
    pub cancelled: bool,
    /// Asked on `…/stream/with-timestamps` (alignment with the audio).
    pub with_timestamps: bool,
}

/// One context on the multi-context socket.
#[derive(Debug, Clone, Default)]
pub struct WsContext {
    pub context_id: String,
    /// The context's init message.
    pub init: Value,
    /// All text sent to it (concatenated).
    pub text: String,
    pub bytes_sent: usize,
    /// The client sent `close_context`.
    pub closed: bool,
    /// Its `isFinal` was sent.
    pub final_sent: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ElevenLabsRecord {
    pub requests: Vec<TtsRequest>,
    /// Multi-context sockets accepted (upgraded), with their query parameters.
    pub ws_sockets: Vec<Vec<(String, String)>>,
    pub ws_contexts: Vec<WsContext>,
    /// Error frames' `error` ids and the close codes the fake sent.
    pub ws_errors: Vec<(String, u16)>,
    /// `close_socket` messages received.
    pub ws_close_socket: usize,
}

impl ElevenLabsRecord {
    /// The texts of all requests, in order.
    pub fn texts(&self) -> Vec<String> {
        self.requests.iter().map(|r| r.text.clone()).collect()
    }
}

pub(crate) struct Shared {
    cfg: Mutex<FakeElevenLabsConfig>,
    pub(crate) record: Recorder<ElevenLabsRecord>,
    pub(crate) tasks: Tasks,
}

/// A running fake; dropping it stops the server.
pub struct FakeElevenLabs(http::Server<Shared>);

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

impl FakeElevenLabs {
    pub async fn start(api_key: &str) -> std::io::Result<Self> {
        Self::start_with(FakeElevenLabsConfig {
            api_key: api_key.into(),
            ..Default::default()
        })
        .await
    }

    pub async fn start_with(cfg: FakeElevenLabsConfig) -> std::io::Result<Self> {
        let shared = Shared {
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.0.addr)
    }

    /// Changes the settings for later requests.
    pub fn configure(&self, f: impl FnOnce(&mut FakeElevenLabsConfig)) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            f(&mut c);
        }
    }

    pub fn record(&self) -> ElevenLabsRecord {
        self.0.shared.record.snapshot()
    }

    /// Waits (up to 10 s, then panics) until `pred` holds; returns that record.
    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&ElevenLabsRecord) -> bool,
    ) -> ElevenLabsRecord {
        self.0.shared.record.wait_until(what, pred).await
    }

    /// Bytes of μ-law audio the fake answers for `text` under the current settings.
    pub fn expected_bytes(&self, text: &str) -> usize {
        let c = self
            .0
            .shared
            .cfg
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        audio_ms(&c, text) as usize * 8
    }
}

pub(crate) fn audio_ms(c: &FakeElevenLabsConfig, text: &str) -> u32 {
    (text.chars().count() as u32 * c.ms_per_char).max(c.min_ms)
}

fn detail(status: &str, message: &str) -> Value {
    json!({"detail": {"status": status, "message": message}})
}

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let mut r = TtsRequest {
        query: http::query_pairs(&req),
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    let path = req.uri().path().to_string();
    let with_timestamps = path.ends_with("/stream/with-timestamps");
    r.with_timestamps = with_timestamps;
    let voice = path
        .strip_prefix("/v1/text-to-speech/")
        .and_then(|p| {
            p.strip_suffix("/stream/with-timestamps")
                .or_else(|| p.strip_suffix("/stream"))
        })
        .filter(|v| !v.is_empty() && !v.contains('/'))
        .map(str::to_string);
    let key_ok = req
        .headers()
        .get("xi-api-key")
        .is_some_and(|v| v.as_bytes() == cfg.api_key.as_bytes());
    if path.ends_with("/multi-stream-input") {
        return crate::elevenlabs_ws::upgrade(s.clone(), cfg, req).await;
    }
    if path == "/v1/user" && req.method() == hyper::Method::GET {
        // The credential check.
        return if key_ok {
            http::json(
                200,
                &json!({"subscription": {"tier": "sim"}, "is_new_user": false}),
            )
        } else {
            http::json(401, &detail("invalid_api_key", "Invalid API key"))
        };
    }
    let is_post = req.method() == hyper::Method::POST;
    let body = http::read_body(req, 1 << 20).await.unwrap_or_default();
    r.body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    r.text = r
        .body
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    r.model_id = r
        .body
        .get("model_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    r.voice_id = voice.clone().unwrap_or_default();

    let (status, err) = verdict(&cfg, &r, is_post && voice.is_some(), key_ok);
    r.status = status;
    let mut idx = 0;
    s.record.modify(|rec| {
        idx = rec.requests.len();
        rec.requests.push(r.clone());
    });
    if let Some(e) = err {
        return http::json(status, &e);
    }

    let audio = match cfg.voice.as_deref().filter(|v| !v.is_empty()) {
        Some(voice) => {
            let n = audio_ms(&cfg, &r.text) as usize * 8;
            voice.iter().copied().cycle().take(n).collect()
        }
        None => mulaw_tone(audio_ms(&cfg, &r.text)),
    };
    let ctype = if with_timestamps {
        "application/json"
    } else {
        "audio/basic"
    };
    let (resp, tx) = http::streaming(200, &[("content-type", ctype)]);
    let total_ms = audio_ms(&cfg, &r.text);
    let chars = crate::alignment::char_times(&r.text, total_ms);
    if cfg
        .stall_text_containing
        .as_deref()
        .is_some_and(|t| r.text.contains(t))
    {
        // Hold the body open without a byte until the client gives up.
        s.tasks.spawn(async move { tx.closed().await });
        return resp;
    }
    s.tasks.spawn(send_audio(
        s.clone(),
        cfg,
        audio,
        chars,
        with_timestamps,
        idx,
        tx,
    ));
    resp
}

/// The status of a speech request and its error body (`None`: 200, speak).
fn verdict(
    cfg: &FakeElevenLabsConfig,
    r: &TtsRequest,
    route_ok: bool,
    key_ok: bool,
) -> (u16, Option<Value>) {
    if !route_ok {
        (404, Some(detail("not_found", "Not Found")))
    } else if !key_ok {
        (401, Some(detail("invalid_api_key", "Invalid API key")))
    } else if cfg
        .fail_text_containing
        .as_deref()
        .is_some_and(|t| r.text.contains(t))
    {
        (
            500,
            Some(detail("internal_error", "An internal error occurred")),
        )
    } else if let Some(st) = cfg.fail_status {
        let (code, msg) = match st {
            401 => ("invalid_api_key", "Invalid API key"),
            _ => ("internal_error", "An internal error occurred"),
        };
        (st, Some(detail(code, msg)))
    } else if !r
        .query
        .iter()
        .any(|(k, v)| k == "output_format" && v == "ulaw_8000")
    {
        (
            422,
            Some(
                json!({"detail": [{"loc": ["query", "output_format"], "msg": "output_format must be ulaw_8000 here", "type": "value_error"}]}),
            ),
        )
    } else if r.body.is_null() || r.text.trim().is_empty() || r.model_id.is_empty() {
        (
            422,
            Some(
                json!({"detail": [{"loc": ["body", "text"], "msg": "text and model_id are required", "type": "missing"}]}),
            ),
        )
    } else {
        (200, None)
    }
}

/// Sends `audio` in `chunk_ms` pieces, paced as configured (as `with-timestamps` lines when
/// asked), and records what was sent and whether the client stayed to the end.
async fn send_audio(
    s: Arc<Shared>,
    cfg: FakeElevenLabsConfig,
    audio: Vec<u8>,
    chars: Vec<crate::alignment::Timed>,
    with_timestamps: bool,
    idx: usize,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) {
    let chunk = (cfg.chunk_ms.max(1) as usize) * 8;
    let mut first = true;
    let mut sent = 0;
    for (k, piece) in audio.chunks(chunk).enumerate() {
        let pause = if first {
            cfg.first_chunk_delay
        } else {
            cfg.chunk_interval
        };
        first = false;
        tokio::select! {
            _ = crate::pause(pause) => {}
            _ = tx.closed() => break,
        }
        let body = if with_timestamps {
            let from = (k * chunk / 8) as u32;
            let to = from + (piece.len() / 8) as u32;
            let last = (k + 1) * chunk >= audio.len();
            Bytes::from(timestamps_line(piece, &chars, from, to, last))
        } else {
            Bytes::copy_from_slice(piece)
        };
        if tx.send(body).await.is_err() {
            break;
        }
        sent += piece.len();
        s.record
            .modify(|rec| rec.requests[idx].bytes_sent += piece.len());
    }
    let done = sent == audio.len();
    if done {
        s.record.modify(|rec| rec.requests[idx].completed = true);
    } else {
        s.record.modify(|rec| rec.requests[idx].cancelled = true);
    }
}

/// One `with-timestamps` line: the chunk's audio and the characters starting within
/// `[from_ms, to_ms)` (all the rest on the last chunk), or `null` alignment when none do.
fn timestamps_line(
    audio: &[u8],
    chars: &[crate::alignment::Timed],
    from_ms: u32,
    to_ms: u32,
    last: bool,
) -> Vec<u8> {
    let here: Vec<_> = chars
        .iter()
        .filter(|c| c.start_ms >= from_ms && (c.start_ms < to_ms || last))
        .collect();
    let alignment = if here.is_empty() {
        Value::Null
    } else {
        json!({
            "characters": here.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
            "character_start_times_seconds": here.iter().map(|c| f64::from(c.start_ms) / 1000.0).collect::<Vec<_>>(),
            "character_end_times_seconds": here.iter().map(|c| f64::from(c.end_ms) / 1000.0).collect::<Vec<_>>(),
        })
    };
    let line = json!({
        "audio_base64": base64::engine::general_purpose::STANDARD.encode(audio),
        "alignment": alignment,
        "normalized_alignment": alignment,
    });
    let mut out = line.to_string().into_bytes();
    out.push(b'\n');
    out
}
