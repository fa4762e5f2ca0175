//! `FakeCartesia`: Cartesia's TTS WebSocket `/tts/websocket`, as strict as the
//! real one: the upgrade needs `Cartesia-Version` (400 otherwise) and `X-API-Key` or
//! `Authorization: Bearer` matching the key (401 JSON otherwise). On the socket every text
//! frame is a generation request or a cancel; a request missing `model_id`, `transcript`,
//! `voice.id`, `context_id` or a raw `output_format` gets an `error` frame (`status_code` 400,
//! `title`, `message`, `error_code`, `request_id`) for its context; a binary frame or a frame
//! that is not JSON is answered with close 1003. A good request is answered with `chunk`
//! frames (base64 μ-law 8 kHz of a tone, `ms_per_char` per character, `status_code` 206; with
//! `add_timestamps`, each followed by a `timestamps` frame whose `word_timestamps` has the words
//! starting in it, seconds from the context's start, [`crate::alignment`]) and a `done` frame; `{"context_id":…,"cancel":true}` stops that context. Failure modes: every
//! generation answered with an `error` frame of `fail_status`, the socket closed with
//! `close_code` after the first request, or no frames at all for text containing a marker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::upgrade;
use hyper::Request;
use hyper::body::Incoming;
use patterd::net::ws_pump::{self, WsIn};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_tone;

#[derive(Debug, Clone)]
pub struct FakeCartesiaConfig {
    pub api_key: String,
    pub ms_per_char: u32,
    pub min_ms: u32,
    pub chunk_ms: u32,
    pub chunk_interval: Duration,
    /// Every generation gets an `error` frame with this `status_code`.
    pub fail_status: Option<u16>,
    /// The socket is closed with this code right after the first request.
    pub close_code: Option<u16>,
    /// Requests whose transcript contains this get no frames (a stall).
    pub stall_text_containing: Option<String>,
}

impl Default for FakeCartesiaConfig {
    fn default() -> Self {
        Self {
            api_key: "cartesia-test-key".into(),
            ms_per_char: 10,
            min_ms: 200,
            chunk_ms: 100,
            chunk_interval: Duration::from_millis(2),
            fail_status: None,
            close_code: None,
            stall_text_containing: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CartesiaContext {
    pub context_id: String,
    pub request: Value,
    pub transcript: String,
    pub bytes_sent: usize,
    pub completed: bool,
    pub cancelled: bool,
}

#[derive(Debug, Clone, Default)]
pub struct CartesiaRecord {
    /// Upgrade requests refused: (status, why).
    pub rejected: Vec<(u16, String)>,
    /// Headers of each accepted socket.
    pub sockets: Vec<Vec<(String, String)>>,
    pub contexts: Vec<CartesiaContext>,
    /// Close codes the fake sent.
    pub closes_sent: Vec<u16>,
}

impl CartesiaRecord {
    pub fn texts(&self) -> Vec<String> {
        self.contexts.iter().map(|c| c.transcript.clone()).collect()
    }
}

struct Shared {
    cfg: Mutex<FakeCartesiaConfig>,
    record: Recorder<CartesiaRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

pub struct FakeCartesia(http::Server<Shared>);

impl FakeCartesia {
    pub async fn start(cfg: FakeCartesiaConfig) -> std::io::Result<Self> {
        let shared = Shared {
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

    pub fn configure(&self, f: impl FnOnce(&mut FakeCartesiaConfig)) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            f(&mut c);
        }
    }

    pub fn record(&self) -> CartesiaRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&CartesiaRecord) -> bool,
    ) -> CartesiaRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

async fn handle(s: Arc<Shared>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let reject = |status: u16, msg: &str| {
        s.record
            .modify(|r| r.rejected.push((status, msg.to_string())));
        http::json(status, &json!({"error": msg}))
    };
    if req.uri().path() != "/tts/websocket" {
        return reject(404, "not found");
    }
    let h = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    if h("cartesia-version").is_empty() {
        return reject(400, "Cartesia-Version header is required");
    }
    let key_ok =
        h("x-api-key") == cfg.api_key || h("authorization") == format!("Bearer {}", cfg.api_key);
    if !key_ok {
        return reject(401, "Invalid API key");
    }
    if !upgrade::is_upgrade_request(&req) {
        return reject(426, "WebSocket upgrade required");
    }
    let headers = http::header_pairs(&req);
    let (resp, fut) = match upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(_) => return reject(400, "bad WebSocket handshake"),
    };
    s.record.modify(|r| r.sockets.push(headers));
    let s2 = s.clone();
    s.tasks.spawn(async move {
        if let Ok(ws) = fut.await {
            session(s2, cfg, ws).await;
        }
    });
    resp.map(http_body_util::BodyExt::boxed)
}

fn error_frame(ctx: Option<&str>, status: u16, title: &str, message: &str, code: &str) -> Value {
    json!({
        "type": "error", "context_id": ctx, "done": true, "status_code": status,
        "title": title, "message": message, "error_code": code,
        "doc_url": "https://docs.cartesia.ai", "request_id": "req_fake",
    })
}

/// Why a generation request is refused, if it is.
fn invalid(v: &Value) -> Option<String> {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str);
    if s("/model_id").is_none_or(str::is_empty) {
        return Some("model_id is required".into());
    }
    if s("/transcript").is_none() {
        return Some("transcript is required".into());
    }
    if s("/voice/id").is_none_or(str::is_empty) {
        return Some("voice.id is required".into());
    }
    if s("/context_id").is_none_or(str::is_empty) {
        return Some("context_id is required".into());
    }
    if s("/output_format/container") != Some("raw")
        || s("/output_format/encoding") != Some("pcm_mulaw")
        || v.pointer("/output_format/sample_rate")
            .and_then(Value::as_u64)
            != Some(8000)
    {
        return Some("this fake serves output_format raw pcm_mulaw 8000 only".into());
    }
    None
}

async fn session(
    s: Arc<Shared>,
    cfg: FakeCartesiaConfig,
    ws: fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    let (mut rx, tx, _reader) = ws_pump::split(ws);
    // Cancels reach the generators through this: context id → stop sender.
    let (cancel_tx, _) = tokio::sync::broadcast::channel::<String>(16);
    let (out_tx, mut out_rx) = mpsc::channel::<String>(64);
    loop {
        tokio::select! {
            Some(frame) = out_rx.recv() => {
                if tx.text(&frame).await.is_err() {
                    return;
                }
            }
            msg = rx.recv() => {
                let text = match msg {
                    Some(WsIn::Text(t)) => t,
                    Some(WsIn::Binary(_)) => {
                        s.record.modify(|r| r.closes_sent.push(1003));
                        let _ = tx.close(1003, "binary frames are not accepted").await;
                        return;
                    }
                    _ => return,
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    s.record.modify(|r| r.closes_sent.push(1003));
                    let _ = tx.close(1003, "invalid JSON").await;
                    return;
                };
                let ctx = v.get("context_id").and_then(Value::as_str).map(str::to_string);
                if v.get("cancel").and_then(Value::as_bool) == Some(true) {
                    if let Some(c) = ctx {
                        s.record.modify(|r| {
                            for x in r.contexts.iter_mut().filter(|x| x.context_id == c && !x.completed) {
                                x.cancelled = true;
                            }
                        });
                        let _ = cancel_tx.send(c);
                    }
                    continue;
                }
                if let Some(why) = invalid(&v) {
                    let e = error_frame(ctx.as_deref(), 400, "Invalid request", &why, "invalid_request");
                    let _ = tx.text(&e.to_string()).await;
                    continue;
                }
                let ctx = ctx.unwrap_or_default();
                let transcript = v.get("transcript").and_then(Value::as_str).unwrap_or("").to_string();
                let mut idx = 0;
                s.record.modify(|r| {
                    idx = r.contexts.len();
                    r.contexts.push(CartesiaContext {
                        context_id: ctx.clone(),
                        request: v.clone(),
                        transcript: transcript.clone(),
                        ..Default::default()
                    });
                });
                if let Some(code) = cfg.close_code {
                    s.record.modify(|r| r.closes_sent.push(code));
                    let _ = tx.close(code, "internal error").await;
                    return;
                }
                if let Some(st) = cfg.fail_status {
                    let e = error_frame(Some(&ctx), st, "Server error", "generation failed", "internal_error");
                    let _ = tx.text(&e.to_string()).await;
                    continue;
                }
                if cfg.stall_text_containing.as_deref().is_some_and(|m| transcript.contains(m)) {
                    continue;
                }
                let ms = (transcript.chars().count() as u32 * cfg.ms_per_char).max(cfg.min_ms);
                let audio = mulaw_tone(ms);
                // `add_timestamps`: the words starting in each chunk follow it.
                let words = (v.get("add_timestamps").and_then(Value::as_bool) == Some(true))
                    .then(|| crate::alignment::word_times(&transcript, ms));
                let (out, s3, cfg2) = (out_tx.clone(), s.clone(), cfg.clone());
                let mut cancelled = cancel_tx.subscribe();
                s.tasks.spawn(async move {
                    let chunk = (cfg2.chunk_ms.max(1) * 8) as usize;
                    for (k, piece) in audio.chunks(chunk).enumerate() {
                        crate::pause(cfg2.chunk_interval).await;
                        while let Ok(c) = cancelled.try_recv() {
                            if c == ctx {
                                return;
                            }
                        }
                        let f = json!({
                            "type": "chunk", "context_id": ctx, "data": STANDARD.encode(piece),
                            "done": false, "status_code": 206, "step_time": 1.0, "flush_id": 1,
                        });
                        if out.send(f.to_string()).await.is_err() {
                            return;
                        }
                        s3.record.modify(|r| r.contexts[idx].bytes_sent += piece.len());
                        if let Some(words) = &words {
                            let from = (k * chunk / 8) as u32;
                            let to = from + (piece.len() / 8) as u32;
                            let last = (k + 1) * chunk >= audio.len();
                            let here: Vec<_> = words
                                .iter()
                                .filter(|w| w.start_ms >= from && (w.start_ms < to || last))
                                .collect();
                            if !here.is_empty() {
                                let secs = |t: u32| f64::from(t) / 1000.0;
                                let f = json!({
                                    "type": "timestamps", "context_id": ctx, "done": false,
                                    "status_code": 206, "flush_id": 1,
                                    "word_timestamps": {
                                        "words": here.iter().map(|w| w.text.clone()).collect::<Vec<_>>(),
                                        "start": here.iter().map(|w| secs(w.start_ms)).collect::<Vec<_>>(),
                                        "end": here.iter().map(|w| secs(w.end_ms)).collect::<Vec<_>>(),
                                    },
                                });
                                if out.send(f.to_string()).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let d = json!({"type": "done", "context_id": ctx, "done": true, "status_code": 200});
                    if out.send(d.to_string()).await.is_ok() {
                        s3.record.modify(|r| r.contexts[idx].completed = true);
                    }
                });
            }
        }
    }
}
