//! The multi-context WebSocket of [`crate::elevenlabs::FakeElevenLabs`]:
//! `/v1/text-to-speech/{voice_id}/multi-stream-input`, as strict as the real
//! one. The socket needs `xi-api-key` (header, or `xi_api_key` / `authorization` in the first
//! message), `model_id`, `output_format=ulaw_8000` (the only format this fake speaks) and an
//! `inactivity_timeout` of at most 180; a failure is an error frame
//! `{"message","error","code":1008}` and close 1008. Every message needs a `context_id` (except
//! `{"close_socket":true}`); a context's first message must be its init (`"text":" "`), and
//! `voice_settings` / `generation_config` are accepted only there; text to a closed context,
//! a 6th open context (`max_active_conversations`), a binary or non-JSON frame, and silence
//! past the inactivity timeout are errors that close the socket with 1008. Text is buffered
//! until `flush` (or `close_context`) and then spoken as `audio` frames (base64 μ-law tone,
//! `alignment` / `normalizedAlignment` of the characters starting in that frame's audio, timed
//! from the frame's start, [`crate::alignment`]; `contextId`); after `close_context` the context's audio
//! ends and `{"isFinal":true,"contextId"}` follows. `close_socket` lets open contexts finish,
//! then closes with 1000. `fail_status` 401 refuses the key; any other closes with 1011.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::upgrade;
use hyper::Request;
use hyper::body::Incoming;
use patterd::net::ws_pump::{self, WsIn};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::elevenlabs::{FakeElevenLabsConfig, Shared, WsContext, audio_ms};
use crate::http::{self, Body};
use crate::tone::mulaw_tone;

const MAX_CONTEXTS: usize = 5;

pub(crate) async fn upgrade(
    s: Arc<Shared>,
    cfg: FakeElevenLabsConfig,
    mut req: Request<Incoming>,
) -> hyper::Response<Body> {
    let path = req.uri().path().to_string();
    let voice_ok = path
        .strip_prefix("/v1/text-to-speech/")
        .and_then(|p| p.strip_suffix("/multi-stream-input"))
        .is_some_and(|v| !v.is_empty() && !v.contains('/'));
    if !voice_ok {
        return http::json(
            404,
            &json!({"detail": {"status": "not_found", "message": "Not Found"}}),
        );
    }
    if !upgrade::is_upgrade_request(&req) {
        return http::json(
            426,
            &json!({"detail": {"status": "upgrade_required", "message": "WebSocket upgrade required"}}),
        );
    }
    let query = http::query_pairs(&req);
    let header_key = req
        .headers()
        .get("xi-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let Ok((resp, fut)) = upgrade::upgrade(&mut req) else {
        return http::plain(400, "bad WebSocket handshake");
    };
    s.record.modify(|r| r.ws_sockets.push(query.clone()));
    let s2 = s.clone();
    s.tasks.spawn(async move {
        if let Ok(ws) = fut.await {
            session(s2, cfg, query, header_key, ws).await;
        }
    });
    resp.map(http_body_util::BodyExt::boxed)
}

/// Why the socket's query is refused, if it is.
fn bad_query(q: &[(String, String)]) -> Option<String> {
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if get("model_id").is_none_or(str::is_empty) {
        return Some("model_id is required".into());
    }
    if get("output_format") != Some("ulaw_8000") {
        return Some("this fake serves output_format=ulaw_8000 only".into());
    }
    if let Some(t) = get("inactivity_timeout")
        && t.parse::<u32>().map_or(true, |t| t == 0 || t > 180)
    {
        return Some("inactivity_timeout must be 1-180".into());
    }
    None
}

enum Job {
    Speak(String),
    Close,
}

struct Ctx {
    jobs: mpsc::UnboundedSender<Job>,
    closed: bool,
    idx: usize,
}

type Ws = fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// A refusal: the fake sends `{message, error, code}`, then closes with `code`.
struct Fail {
    error: &'static str,
    message: String,
    code: u16,
}

fn refused(error: &'static str, message: impl Into<String>, code: u16) -> Fail {
    Fail {
        error,
        message: message.into(),
        code,
    }
}

async fn fail(s: &Shared, tx: &Sender, f: Fail) {
    s.record
        .modify(|r| r.ws_errors.push((f.error.to_string(), f.code)));
    let frame = json!({"message": f.message, "error": f.error, "code": f.code});
    let _ = tx.text(&frame.to_string()).await;
    let _ = tx.close(f.code, &f.message).await;
}

type Sender =
    ws_pump::WsSender<tokio::io::WriteHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>;

async fn session(
    s: Arc<Shared>,
    cfg: FakeElevenLabsConfig,
    query: Vec<(String, String)>,
    header_key: Option<String>,
    ws: Ws,
) {
    let (mut rx, tx, _reader) = ws_pump::split(ws);
    if let Some(why) = bad_query(&query) {
        return fail(&s, &tx, refused("invalid_request", why, 1008)).await;
    }
    let inactivity = query
        .iter()
        .find(|(k, _)| k == "inactivity_timeout")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .unwrap_or(20);
    let mut authed = match header_key {
        Some(k) if k == cfg.api_key && cfg.fail_status != Some(401) => true,
        Some(_) => return fail(&s, &tx, refused("invalid_api_key", "Invalid API key", 1008)).await,
        None => false,
    };
    let (out_tx, mut out_rx) = mpsc::channel::<String>(64);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut contexts = Contexts {
        s: s.clone(),
        cfg,
        open: HashMap::new(),
        closing: false,
        out: out_tx,
        done: done_tx,
    };
    loop {
        if contexts.closing && contexts.open.is_empty() {
            let _ = tx.close(1000, "").await;
            return;
        }
        let msg = tokio::select! {
            Some(frame) = out_rx.recv() => {
                if tx.text(&frame).await.is_err() {
                    return;
                }
                continue;
            }
            Some(ctx) = done_rx.recv() => {
                contexts.open.remove(&ctx);
                continue;
            }
            m = tokio::time::timeout(Duration::from_secs(inactivity), rx.recv()) => m,
        };
        let text = match msg {
            Err(_) => {
                let m = format!("Input timeout exceeded: no message within {inactivity} s");
                return fail(&s, &tx, refused("input_timeout_exceeded", m, 1008)).await;
            }
            Ok(Some(WsIn::Text(t))) => t,
            Ok(Some(WsIn::Binary(_))) => {
                let f = refused("invalid_message", "binary frames are not accepted", 1008);
                return fail(&s, &tx, f).await;
            }
            Ok(_) => return,
        };
        if let Err(f) = contexts.on_text(&text, &mut authed) {
            return fail(&s, &tx, f).await;
        }
    }
}

/// One socket's contexts and the channels their generators answer on.
struct Contexts {
    s: Arc<Shared>,
    cfg: FakeElevenLabsConfig,
    open: HashMap<String, Ctx>,
    /// `close_socket` was sent: the socket closes once every context is done.
    closing: bool,
    out: mpsc::Sender<String>,
    done: mpsc::UnboundedSender<String>,
}

impl Contexts {
    /// One text frame: authentication (if the header had no key), the forced failure, then
    /// `close_socket` or a context's message.
    fn on_text(&mut self, text: &str, authed: &mut bool) -> Result<(), Fail> {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Err(refused("invalid_message", "the message is not JSON", 1008));
        };
        let cfg = &self.cfg;
        if !*authed {
            let k = v.get("xi_api_key").and_then(Value::as_str);
            let b = v.get("authorization").and_then(Value::as_str);
            let ok = cfg.fail_status != Some(401)
                && (k == Some(cfg.api_key.as_str())
                    || b == Some(format!("Bearer {}", cfg.api_key).as_str()));
            if !ok {
                return Err(refused("invalid_api_key", "Invalid API key", 1008));
            }
            *authed = true;
        }
        if cfg.fail_status.is_some_and(|c| c != 401) {
            return Err(refused(
                "internal_error",
                "An internal error occurred",
                1011,
            ));
        }
        if v.get("close_socket").and_then(Value::as_bool) == Some(true) {
            self.s.record.modify(|r| r.ws_close_socket += 1);
            for c in self.open.values_mut().filter(|c| !c.closed) {
                c.closed = true;
                let _ = c.jobs.send(Job::Close);
            }
            self.closing = true;
            return Ok(());
        }
        let Some(ctx) = v
            .get("context_id")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(refused("invalid_message", "context_id is required", 1008));
        };
        if self.open.contains_key(&ctx) {
            self.on_context(&ctx, &v)
        } else {
            self.init(ctx, &v)
        }
    }

    /// A context's first message: text `" "`, a valid chunk schedule, at most
    /// [`MAX_CONTEXTS`]; starts its generator.
    fn init(&mut self, ctx: String, v: &Value) -> Result<(), Fail> {
        if v.get("text").and_then(Value::as_str) != Some(" ") {
            let m = format!("context {ctx} must be initialised with text \" \" first");
            return Err(refused("invalid_message_order", m, 1008));
        }
        if let Some(sched) = v.pointer("/generation_config/chunk_length_schedule") {
            let ok = sched.as_array().is_some_and(|a| {
                a.iter()
                    .all(|x| x.as_u64().is_some_and(|n| (50..=500).contains(&n)))
            });
            if !ok {
                let m = "chunk_length_schedule values must be 50-500";
                return Err(refused("invalid_request", m, 1008));
            }
        }
        if self.open.len() >= MAX_CONTEXTS {
            let m = "Maximum simultaneous contexts per WebSocket connection exceeded (5)";
            return Err(refused("max_active_conversations", m, 1008));
        }
        let mut idx = 0;
        self.s.record.modify(|r| {
            idx = r.ws_contexts.len();
            r.ws_contexts.push(WsContext {
                context_id: ctx.clone(),
                init: v.clone(),
                ..Default::default()
            });
        });
        let (jobs, jobs_rx) = mpsc::unbounded_channel();
        self.s.tasks.spawn(speak(
            self.s.clone(),
            self.cfg.clone(),
            ctx.clone(),
            idx,
            jobs_rx,
            self.out.clone(),
            self.done.clone(),
        ));
        self.open.insert(
            ctx,
            Ctx {
                jobs,
                closed: false,
                idx,
            },
        );
        Ok(())
    }

    /// A later message of an open context: text, `flush`, `close_context`.
    fn on_context(&mut self, ctx: &str, v: &Value) -> Result<(), Fail> {
        if v.get("voice_settings").is_some() || v.get("generation_config").is_some() {
            let m = "voice_settings and generation_config are only accepted in a context's init";
            return Err(refused("invalid_message", m, 1008));
        }
        let Some(c) = self.open.get_mut(ctx) else {
            return Ok(());
        };
        if c.closed {
            let m = format!("context {ctx} is closed");
            return Err(refused("invalid_message_order", m, 1008));
        }
        let idx = c.idx;
        if let Some(t) = v
            .get("text")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.s
                .record
                .modify(|r| r.ws_contexts[idx].text.push_str(t));
            let _ = c.jobs.send(Job::Speak(t.to_string()));
        }
        let flush = v.get("flush").and_then(Value::as_bool) == Some(true);
        let close = v.get("close_context").and_then(Value::as_bool) == Some(true);
        if flush || close {
            let _ = c.jobs.send(Job::Speak(String::new()));
        }
        if close {
            c.closed = true;
            self.s.record.modify(|r| r.ws_contexts[idx].closed = true);
            let _ = c.jobs.send(Job::Close);
        }
        Ok(())
    }
}

/// One context's generator: buffers text, speaks it on a flush (`Speak("")`), and sends
/// `isFinal` after `Close`.
async fn speak(
    s: Arc<Shared>,
    cfg: FakeElevenLabsConfig,
    ctx: String,
    idx: usize,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    out: mpsc::Sender<String>,
    done: mpsc::UnboundedSender<String>,
) {
    let mut buffer = String::new();
    while let Some(job) = jobs.recv().await {
        match job {
            Job::Speak(t) if !t.is_empty() => buffer.push_str(&t),
            Job::Speak(_) => {
                let text = std::mem::take(&mut buffer);
                if text.trim().is_empty() {
                    continue;
                }
                let total_ms = audio_ms(&cfg, text.trim());
                let audio = mulaw_tone(total_ms);
                let chars = crate::alignment::char_times(&text, total_ms);
                let chunk = (cfg.chunk_ms.max(1) * 8) as usize;
                let mut first = true;
                for (k, piece) in audio.chunks(chunk).enumerate() {
                    let pause = if first {
                        cfg.first_chunk_delay
                    } else {
                        cfg.chunk_interval
                    };
                    crate::pause(pause).await;
                    let mut f = json!({
                        "audio": STANDARD.encode(piece),
                        "isFinal": null,
                        "contextId": ctx,
                    });
                    // The characters starting in this chunk, timed from the chunk's start.
                    let from = (k * chunk / 8) as u32;
                    let to = from + (piece.len() / 8) as u32;
                    let last = (k + 1) * chunk >= audio.len();
                    let here: Vec<_> = chars
                        .iter()
                        .filter(|c| c.start_ms >= from && (c.start_ms < to || last))
                        .collect();
                    if !here.is_empty() {
                        let align = json!({
                            "chars": here.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
                            "charStartTimesMs": here.iter().map(|c| c.start_ms - from).collect::<Vec<_>>(),
                            "charDurationsMs": here.iter().map(|c| c.end_ms - c.start_ms).collect::<Vec<_>>(),
                        });
                        f["alignment"] = align.clone();
                        f["normalizedAlignment"] = align;
                    }
                    first = false;
                    if out.send(f.to_string()).await.is_err() {
                        return;
                    }
                    s.record
                        .modify(|r| r.ws_contexts[idx].bytes_sent += piece.len());
                }
            }
            Job::Close => {
                let f = json!({"isFinal": true, "contextId": ctx});
                if out.send(f.to_string()).await.is_ok() {
                    s.record.modify(|r| r.ws_contexts[idx].final_sent = true);
                }
                let _ = done.send(ctx);
                return;
            }
        }
    }
}
