//! Cartesia Sonic text-to-speech over its WebSocket: each sentence is one
//! generation context (`context_id`, `continue: false`, `max_buffer_delay_ms: 0` since whole
//! sentences are sent) asking for `{"container":"raw","encoding":"pcm_mulaw","sample_rate":8000}`,
//! so the `chunk` frames' base64 `data` is μ-law 8 kHz that goes to the carrier untouched.
//! With `word_timestamps` (the default) the request asks `add_timestamps`, and each
//! `timestamps` frame's `word_timestamps` (`words`, `start`, `end`, seconds from the start of
//! the context's audio) becomes [`TtsEvent::Words`].
//! Auth is the `X-API-Key` header with `Cartesia-Version`.
//!
//! Barge-in cancels the context: when the call drops the stream, the socket task sends
//! `{"context_id":…,"cancel":true}` and closes the socket with 1000. Frames of another context
//! are ignored. An `error` frame or a close before `done` fails the sentence (status ≥ 500 or
//! 429, a close 1011/1013 and a refused connection are [`TtsEvent::Unavailable`], so a chain
//! switches).
//!
//! Simplification (documented in docs/providers.md): one socket per sentence rather than one
//! kept open per call, so each sentence pays a WebSocket handshake.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::alignment;
use super::elevenlabs::MAX_AUDIO_BYTES;
use super::error::TtsError;
use super::{TtsEvent, TtsProvider, TtsStream};
use crate::config::schema::TtsConfig;
use crate::net::ws_client;
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

const VENDOR: &str = "Cartesia";
/// The `Cartesia-Version` sent (the API version this client was written against).
pub(crate) const CARTESIA_VERSION: &str = "2026-03-01";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const STALL: Duration = Duration::from_secs(10);

pub struct CartesiaTts {
    cfg: TtsConfig,
    url: String,
    next_context: AtomicU64,
}

impl CartesiaTts {
    pub fn new(cfg: &TtsConfig) -> Self {
        Self {
            cfg: cfg.clone(),
            url: format!("{}/tts/websocket", cfg.base_url.trim_end_matches('/')),
            next_context: AtomicU64::new(1),
        }
    }

    /// The generation request for `text` on context `ctx` (Cartesia's field names).
    pub fn request(&self, text: &str, ctx: &str) -> Value {
        let mut r = json!({
            "model_id": self.cfg.model,
            "transcript": text,
            "voice": {"mode": "id", "id": self.cfg.voice_id},
            "language": "en",
            "context_id": ctx,
            "output_format": {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000},
            "continue": false,
            "max_buffer_delay_ms": 0,
        });
        if let Some(speed) = self.cfg.speed {
            r["generation_config"] = json!({ "speed": speed });
        }
        if self.cfg.word_timestamps {
            r["add_timestamps"] = json!(true);
        }
        r
    }
}

impl TtsProvider for CartesiaTts {
    fn synthesize(&self, text: &str) -> TtsStream {
        let (tx, rx) = mpsc::channel(64);
        let n = self.next_context.fetch_add(1, Ordering::Relaxed);
        let ctx = format!("patterd-{n}");
        let request = self.request(text, &ctx).to_string();
        let (url, key) = (self.url.clone(), self.cfg.api_key.expose().to_string());
        // Not aborted on drop: the task notices the dropped stream, cancels the context and
        // closes the socket itself (bounded by the read stall).
        tokio::spawn(async move {
            let result = run(&url, &key, &ctx, &request, &tx).await;
            if let Some(last) = TtsError::final_event(result) {
                let _ = tx.send(last).await;
            }
        });
        TtsStream {
            events: rx,
            guard: TaskGuard::new(tokio::spawn(async {})),
        }
    }
}

fn reported(message: String, status: Option<u16>) -> TtsError {
    TtsError::Reported {
        vendor: VENDOR,
        message,
        status,
    }
}

/// What a text frame asks of [`run`]'s loop.
enum Step {
    /// Keep reading.
    More,
    /// Close the socket, then end with this.
    Close(Result<(), TtsError>),
}

async fn run(
    url: &str,
    key: &str,
    ctx: &str,
    request: &str,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let headers = [("X-API-Key", key), ("Cartesia-Version", CARTESIA_VERSION)];
    let (ws, _) = ws_client::connect(url, &headers, CONNECT_TIMEOUT)
        .await
        .map_err(connect_error)?;
    let (mut incoming, sender, _reader) = ws_pump::split(ws);
    if let Err(e) = sender.text(request).await {
        return Err(TtsError::Connect {
            vendor: VENDOR,
            message: e.to_string(),
        });
    }
    let mut received = 0usize;
    loop {
        let msg = tokio::select! {
            m = tokio::time::timeout(STALL, incoming.recv()) => m,
            _ = tx.closed() => {
                // Barge-in or hang-up: cancel the context, then close.
                let cancel = json!({"context_id": ctx, "cancel": true}).to_string();
                let _ = sender.text(&cancel).await;
                let _ = sender.close(1000, "").await;
                return Err(TtsError::Abandoned);
            }
        };
        let msg = msg.map_err(|_| TtsError::Stalled {
            vendor: VENDOR,
            after: STALL,
        })?;
        match msg {
            Some(WsIn::Text(t)) => {
                if let Step::Close(result) = on_text(&t, ctx, tx, &mut received).await? {
                    let _ = sender.close(1000, "").await;
                    return result;
                }
            }
            Some(WsIn::Binary(_)) => {
                return Err(reported("an unexpected binary frame".into(), None));
            }
            Some(WsIn::Close { code, reason }) => {
                let code = code.unwrap_or(1005);
                let status = matches!(code, 1011 | 1013).then_some(503);
                return Err(reported(
                    format!("closed the socket ({code} {reason}) before the sentence was done"),
                    status,
                ));
            }
            Some(WsIn::Failed(e)) => {
                return Err(TtsError::Connect {
                    vendor: VENDOR,
                    message: e,
                });
            }
            None => {
                return Err(TtsError::Connect {
                    vendor: VENDOR,
                    message: "the socket ended".into(),
                });
            }
        }
    }
}

/// A refused handshake below 500 (but 429) is the key's fault; anything else is the network's.
fn connect_error(e: ws_client::WsConnectError) -> TtsError {
    match e.status() {
        Some(s) if s != 429 && s < 500 => reported(
            format!("the socket was refused with HTTP {s} (check [tts] api_key)"),
            Some(s),
        ),
        _ => TtsError::Connect {
            vendor: VENDOR,
            message: e.to_string(),
        },
    }
}

/// One JSON frame: frames of other contexts are skipped (errors are not), chunks and word
/// timestamps go to `tx`, `done` and `error` end the sentence.
async fn on_text(
    t: &str,
    ctx: &str,
    tx: &mpsc::Sender<TtsEvent>,
    received: &mut usize,
) -> Result<Step, TtsError> {
    let Ok(v) = serde_json::from_str::<Value>(t) else {
        return Err(reported("a frame that is not JSON".into(), None));
    };
    if v.get("context_id").and_then(Value::as_str) != Some(ctx)
        && v.get("type").and_then(Value::as_str) != Some("error")
    {
        return Ok(Step::More);
    }
    match v.get("type").and_then(Value::as_str).unwrap_or("") {
        "chunk" => {
            let data = v.get("data").and_then(Value::as_str).unwrap_or("");
            let audio = STANDARD
                .decode(data)
                .map_err(|_| reported("a chunk whose data is not base64".into(), None))?;
            *received += audio.len();
            if *received > MAX_AUDIO_BYTES {
                return Err(TtsError::TooMuchAudio {
                    vendor: VENDOR,
                    limit: MAX_AUDIO_BYTES,
                });
            }
            if !audio.is_empty() {
                tx.send(TtsEvent::Audio(audio.into()))
                    .await
                    .map_err(|_| TtsError::Abandoned)?;
            }
        }
        "done" => return Ok(Step::Close(Ok(()))),
        "error" => {
            let status = v
                .get("status_code")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok());
            let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            return Ok(Step::Close(Err(reported(
                format!(
                    "{} ({}): {}",
                    field("title"),
                    field("error_code"),
                    field("message")
                ),
                status,
            ))));
        }
        "timestamps" => {
            let words = v
                .get("word_timestamps")
                .and_then(alignment::cartesia_words)
                .unwrap_or_default();
            if !words.is_empty() {
                tx.send(TtsEvent::Words(words))
                    .await
                    .map_err(|_| TtsError::Abandoned)?;
            }
        }
        // flush_done, phoneme_timestamps: nothing to play.
        _ => {}
    }
    Ok(Step::More)
}

impl super::kinds::TtsKindImpl for CartesiaTts {
    fn build(cfg: &TtsConfig) -> Result<Self, super::SetupError> {
        Ok(Self::new(cfg))
    }
    /// `GET /voices` with `X-API-Key` and the API version.
    fn credential_check(
        cfg: &TtsConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        let base = super::kinds::http_base(&cfg.base_url);
        Some(
            client
                .get(format!("{base}/voices"))
                .header("X-API-Key", cfg.api_key.expose())
                .header("Cartesia-Version", CARTESIA_VERSION),
        )
    }
}
