//! `FakeOpenAiSpeech`: `POST /v1/audio/speech` in three dialects, each
//! as strict as the real server:
//! - [`Dialect::OpenAi`]: `Authorization: Bearer <key>` must match (401 `invalid_api_key`
//!   otherwise); `model` one of OpenAI's speech models, `input` 1–4096 characters, `voice`
//!   required; an unknown body field is refused (400 "Unrecognized request argument
//!   supplied"), `instructions` with a `tts-1*` model too.
//! - [`Dialect::Kokoro`]: no key needed; `model` `kokoro`/`tts-1`/`tts-1-hd`; extra fields
//!   ignored (FastAPI); output always 24 kHz.
//! - [`Dialect::Speaches`]: no key needed; the non-standard `sample_rate` (8000–48000) picks
//!   the PCM rate.
//!
//! With `response_format = "pcm"` the answer is `audio/pcm`: raw 16-bit little-endian mono
//! PCM of a 440 Hz tone plus a 9 kHz tone (inaudible after a correct resampler: it must not
//! fold back below 4 kHz), lasting `ms_per_char` per character, in body chunks of an odd byte
//! count (so samples straddle chunks). Other formats answer 400 here: patterd must ask for
//! `pcm`. Failure modes: every request 500/429, or a 200 head with no audio (stall) for text
//! containing a marker. Every request is recorded, with the bytes sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::http::{self, Body, Recorder, Tasks};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Kokoro,
    Speaches,
}

#[derive(Debug, Clone)]
pub struct FakeOpenAiSpeechConfig {
    pub dialect: Dialect,
    /// The bearer key to require (`None`: no auth, as a self-hosted server).
    pub api_key: Option<String>,
    pub ms_per_char: u32,
    pub min_ms: u32,
    /// Body chunk size in bytes (odd, so samples straddle chunks).
    pub chunk_bytes: usize,
    pub first_chunk_delay: Duration,
    pub chunk_interval: Duration,
    /// Answer every request with this status (500, 429 …) and OpenAI's error JSON.
    pub fail_status: Option<u16>,
    /// Requests whose text contains this get a 200 head and then no audio (a stall).
    pub stall_text_containing: Option<String>,
}

impl Default for FakeOpenAiSpeechConfig {
    fn default() -> Self {
        Self {
            dialect: Dialect::OpenAi,
            api_key: Some("sk-test-key".into()),
            ms_per_char: 10,
            min_ms: 200,
            chunk_bytes: 4801,
            first_chunk_delay: Duration::ZERO,
            chunk_interval: Duration::from_millis(2),
            fail_status: None,
            stall_text_containing: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SpeechRequest {
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub input: String,
    pub status: u16,
    /// PCM rate answered.
    pub rate: u32,
    pub bytes_sent: usize,
    pub completed: bool,
    pub cancelled: bool,
}

#[derive(Debug, Clone, Default)]
pub struct SpeechRecord {
    pub requests: Vec<SpeechRequest>,
}

impl SpeechRecord {
    pub fn texts(&self) -> Vec<String> {
        self.requests.iter().map(|r| r.input.clone()).collect()
    }
}

struct Shared {
    cfg: Mutex<FakeOpenAiSpeechConfig>,
    record: Recorder<SpeechRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

/// A running fake; dropping it stops the server.
pub struct FakeOpenAiSpeech(http::Server<Shared>);

impl FakeOpenAiSpeech {
    pub async fn start(cfg: FakeOpenAiSpeechConfig) -> std::io::Result<Self> {
        let shared = Shared {
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.0.addr)
    }

    pub fn configure(&self, f: impl FnOnce(&mut FakeOpenAiSpeechConfig)) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            f(&mut c);
        }
    }

    pub fn record(&self) -> SpeechRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&SpeechRecord) -> bool,
    ) -> SpeechRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

/// OpenAI's error envelope.
pub fn openai_error(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

const OPENAI_MODELS: &[&str] = &[
    "tts-1",
    "tts-1-hd",
    "gpt-4o-mini-tts",
    "gpt-4o-mini-tts-2025-12-15",
];
const OPENAI_FIELDS: &[&str] = &[
    "model",
    "input",
    "voice",
    "instructions",
    "response_format",
    "speed",
    "stream_format",
];

/// Checks the body for `dialect`; `Err((status, json))` when the server would refuse it.
/// Returns the PCM rate to answer with.
fn check(dialect: Dialect, body: &Value) -> Result<u32, (u16, Value)> {
    let bad = |m: &str| (400, openai_error(m, "invalid_request_error", None));
    let Some(obj) = body.as_object() else {
        return Err(bad("We could not parse the JSON body of your request."));
    };
    let model = obj.get("model").and_then(Value::as_str).unwrap_or("");
    let input = obj.get("input").and_then(Value::as_str).unwrap_or("");
    let voice = obj.get("voice").and_then(Value::as_str).unwrap_or("");
    let format = obj
        .get("response_format")
        .and_then(Value::as_str)
        .unwrap_or("mp3");
    match dialect {
        Dialect::OpenAi => {
            if let Some(k) = obj.keys().find(|k| !OPENAI_FIELDS.contains(&k.as_str())) {
                return Err(bad(&format!("Unrecognized request argument supplied: {k}")));
            }
            if !OPENAI_MODELS.contains(&model) {
                return Err(bad(&format!("Invalid model: {model:?}")));
            }
            if model.starts_with("tts-1") && obj.contains_key("instructions") {
                return Err(bad("instructions are not supported with tts-1 models"));
            }
        }
        Dialect::Kokoro => {
            if !["kokoro", "tts-1", "tts-1-hd"].contains(&model) {
                return Err((
                    400,
                    json!({"detail": {"error": "invalid_model", "message": format!("Unsupported model: {model}")}}),
                ));
            }
        }
        Dialect::Speaches => {
            if model.is_empty() {
                return Err((
                    422,
                    json!({"detail": [{"loc": ["body", "model"], "msg": "Field required", "type": "missing"}]}),
                ));
            }
        }
    }
    if input.is_empty() || input.chars().count() > 4096 {
        return Err(bad("input must be 1 to 4096 characters"));
    }
    if voice.is_empty() {
        return Err(bad("voice is required"));
    }
    if format != "pcm" {
        return Err(bad("this fake only serves response_format \"pcm\""));
    }
    match (dialect, obj.get("sample_rate")) {
        (Dialect::Speaches, Some(r)) => match r.as_u64() {
            Some(r @ 8000..=48000) => Ok(r as u32),
            _ => Err((
                422,
                json!({"detail": [{"loc": ["body", "sample_rate"], "msg": "sample_rate must be 8000 to 48000", "type": "value_error"}]}),
            )),
        },
        _ => Ok(24_000),
    }
}

/// `ms` of 440 Hz at -12 dBFS plus 9 kHz at -12 dBFS (when the rate carries it), PCM16 LE.
pub fn test_pcm(rate: u32, ms: u32) -> Vec<u8> {
    let n = rate as usize * ms as usize / 1000;
    let mut out = Vec::with_capacity(n * 2);
    for i in 0..n {
        let t = i as f64 / f64::from(rate);
        let mut v = 0.25 * (2.0 * std::f64::consts::PI * 440.0 * t).sin();
        if f64::from(rate) / 2.0 > 9500.0 {
            v += 0.25 * (2.0 * std::f64::consts::PI * 9000.0 * t).sin();
        }
        out.extend_from_slice(&((v * 32767.0) as i16).to_le_bytes());
    }
    out
}

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let mut r = SpeechRequest {
        headers: http::header_pairs(&req),
        ..Default::default()
    };
    let route_ok = req.method() == hyper::Method::POST && req.uri().path() == "/v1/audio/speech";
    let key_ok = match &cfg.api_key {
        Some(k) => http::authorized(&req, &format!("Bearer {k}")),
        None => true,
    };
    let body = http::read_body(req, 1 << 20).await.unwrap_or_default();
    r.body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    r.input = r
        .body
        .get("input")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    let verdict = if !route_ok {
        Err((
            404,
            openai_error("Not found", "invalid_request_error", None),
        ))
    } else if !key_ok {
        Err((
            401,
            openai_error(
                "Incorrect API key provided.",
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
        ))
    } else if let Some(st) = cfg.fail_status {
        let (m, kind) = match st {
            429 => ("Rate limit reached for requests", "requests"),
            _ => (
                "The server had an error while processing your request.",
                "server_error",
            ),
        };
        Err((st, openai_error(m, kind, None)))
    } else {
        check(cfg.dialect, &r.body)
    };
    let rate = match verdict {
        Ok(rate) => rate,
        Err((status, e)) => {
            r.status = status;
            s.record.modify(|rec| rec.requests.push(r));
            return http::json(status, &e);
        }
    };
    r.status = 200;
    r.rate = rate;
    let mut idx = 0;
    s.record.modify(|rec| {
        idx = rec.requests.len();
        rec.requests.push(r.clone());
    });
    let ms = (r.input.chars().count() as u32 * cfg.ms_per_char).max(cfg.min_ms);
    let audio = test_pcm(rate, ms);
    let (resp, tx) = http::streaming(200, &[("content-type", "audio/pcm")]);
    if cfg
        .stall_text_containing
        .as_deref()
        .is_some_and(|t| r.input.contains(t))
    {
        s.tasks.spawn(async move { tx.closed().await });
        return resp;
    }
    let s2 = s.clone();
    s.tasks.spawn(async move {
        let mut sent = 0;
        for (i, piece) in audio.chunks(cfg.chunk_bytes.max(1)).enumerate() {
            let pause = if i == 0 {
                cfg.first_chunk_delay
            } else {
                cfg.chunk_interval
            };
            tokio::select! {
                _ = crate::pause(pause) => {}
                _ = tx.closed() => break,
            }
            if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                break;
            }
            sent += piece.len();
            s2.record
                .modify(|rec| rec.requests[idx].bytes_sent += piece.len());
        }
        let done = sent == audio.len();
        s2.record.modify(|rec| {
            rec.requests[idx].completed = done;
            rec.requests[idx].cancelled = !done;
        });
    });
    resp
}
