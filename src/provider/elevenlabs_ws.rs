//! ElevenLabs text-to-speech over the multi-context WebSocket
//! (`transport = "websocket"`): one socket per call,
//! `…/v1/text-to-speech/{voice_id}/multi-stream-input?model_id=…&output_format=ulaw_8000&inactivity_timeout=180`
//! with the `xi-api-key` header, opened on the call's first sentence and carrying every
//! sentence after it, one context (`patterd-N`) each. Per sentence the session sends the
//! context init (`{"text":" ","context_id",…,"voice_settings"?,"generation_config"}`), the text
//! with `"flush": true`, and `close_context` at once, so `isFinal` (camelCase `contextId` or
//! snake `context_id`) follows the last audio frame; the base64 `audio` is μ-law 8 kHz that goes
//! to the carrier untouched. With `word_timestamps` each frame's `alignment` (times from the
//! start of that frame's audio) becomes [`TtsEvent::Words`], placed by the audio received
//! before it.
//!
//! Barge-in (the call drops the sentence's stream) forgets the context: its later frames are
//! dropped, never reaching the call (the stream is gone, so nothing can be played from it), and
//! if its init was not sent yet (queued behind the 5-context limit) it is never opened. Its
//! `close_context` was already sent with its text, so the server ends it right after the
//! flushed audio. At most [`MAX_CONTEXTS`] contexts are open at a
//! time; more sentences wait in the session. An error frame (`message`, `error`, `code`) or a
//! close fails every open sentence; the next sentence reconnects. When the call's providers are
//! dropped the session sends `{"close_socket":true}` and reads until the server closes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::alignment::{self, CharWords};
use super::elevenlabs::MAX_AUDIO_BYTES;
use super::error::TtsError;
use super::{TtsEvent, TtsProvider, TtsStream};
use crate::config::schema::TtsConfig;
use crate::net::ws_client;
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

const VENDOR: &str = "ElevenLabs";
/// ElevenLabs' limit of simultaneous contexts per socket (the 6th closes the socket).
pub const MAX_CONTEXTS: usize = 5;
/// Asked as `inactivity_timeout` (the documented maximum): a call's socket idles between turns.
pub(crate) const INACTIVITY_TIMEOUT_S: u32 = 180;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the next frame while a sentence is open.
const STALL: Duration = Duration::from_secs(10);

/// The socket URL for `cfg` (its query parameters).
pub fn socket_url(cfg: &TtsConfig) -> String {
    let base = cfg.base_url.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    let esc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    format!(
        "{base}/v1/text-to-speech/{}/multi-stream-input?model_id={}&output_format=ulaw_8000&inactivity_timeout={INACTIVITY_TIMEOUT_S}",
        esc(&cfg.voice_id),
        esc(&cfg.model)
    )
}

enum Cmd {
    Speak {
        ctx: String,
        text: String,
        events: mpsc::Sender<TtsEvent>,
    },
}

/// One call's ElevenLabs socket. Dropping it closes the socket (after open contexts finish).
pub(crate) struct ElevenLabsWs {
    cmd: mpsc::Sender<Cmd>,
    next_context: AtomicU64,
}

impl ElevenLabsWs {
    /// A session for one call; nothing connects before the first sentence.
    pub(crate) fn new(cfg: &TtsConfig) -> Self {
        let (cmd, rx) = mpsc::channel(64);
        let mut init = json!({
            "text": " ",
            "generation_config": {"chunk_length_schedule": [50]},
        });
        if let Some(speed) = cfg.speed {
            init["voice_settings"] = json!({ "speed": speed });
        }
        // Not aborted on drop: when the last sender goes the task sends `close_socket` and
        // reads until the server closes (bounded by the read stall).
        let session = Session {
            url: socket_url(cfg),
            key: cfg.api_key.expose().to_string(),
            init,
            timestamps: cfg.word_timestamps,
            rx,
            waiting: VecDeque::new(),
            open: HashMap::new(),
        };
        tokio::spawn(session.run());
        Self {
            cmd,
            next_context: AtomicU64::new(1),
        }
    }
}

impl TtsProvider for ElevenLabsWs {
    fn synthesize(&self, text: &str) -> TtsStream {
        let (tx, rx) = mpsc::channel(64);
        let ctx = format!(
            "patterd-{}",
            self.next_context.fetch_add(1, Ordering::Relaxed)
        );
        let speak = Cmd::Speak {
            ctx: ctx.clone(),
            text: text.to_string(),
            events: tx,
        };
        if let Err(e) = self.cmd.try_send(speak) {
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(TtsEvent::Error(format!(
                "{VENDOR} session is not accepting text ({e})"
            )));
            return TtsStream {
                events: rx,
                guard: TaskGuard::empty(),
            };
        }
        TtsStream {
            events: rx,
            guard: TaskGuard::empty(),
        }
    }
}

type Sender =
    ws_pump::WsSender<tokio::io::WriteHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>;

struct Conn {
    incoming: mpsc::Receiver<WsIn>,
    sender: Sender,
    _reader: TaskGuard,
}

struct Open {
    events: mpsc::Sender<TtsEvent>,
    received: usize,
    /// Characters of the alignment so far, joined into words.
    words: CharWords,
    /// The call dropped the stream: frames are discarded until `isFinal`.
    forgotten: bool,
}

struct Session {
    url: String,
    key: String,
    init: Value,
    /// Turn each frame's alignment into word timings.
    timestamps: bool,
    rx: mpsc::Receiver<Cmd>,
    waiting: VecDeque<(String, String, mpsc::Sender<TtsEvent>)>,
    open: HashMap<String, Open>,
}

fn reported(message: String, status: Option<u16>) -> TtsError {
    TtsError::Reported {
        vendor: VENDOR,
        message,
        status,
    }
}

impl Session {
    async fn run(mut self) {
        let mut conn: Option<Conn> = None;
        let mut closing = false;
        loop {
            let busy = !self.open.is_empty() || closing;
            let frame = async {
                match conn.as_mut() {
                    Some(c) if busy => tokio::time::timeout(STALL, c.incoming.recv()).await,
                    Some(c) => Ok(c.incoming.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = self.rx.recv(), if !closing => match cmd {
                    Some(Cmd::Speak { ctx, text, events }) => {
                        self.waiting.push_back((ctx, text, events));
                    }
                    None => {
                        let Some(c) = conn.as_ref() else { return };
                        let _ = c.sender.text(&json!({"close_socket": true}).to_string()).await;
                        closing = true;
                    }
                },
                f = frame => match f {
                    Err(_) => {
                        self.fail_all(TtsError::Stalled { vendor: VENDOR, after: STALL }).await;
                        if let Some(c) = conn.take() {
                            let _ = c.sender.close(1000, "").await;
                        }
                        if closing {
                            return;
                        }
                    }
                    Ok(msg) => {
                        if let Err(e) = self.on_frame(msg).await {
                            self.fail_all(e).await;
                            if let Some(c) = conn.take() {
                                let _ = c.sender.close(1000, "").await;
                            }
                            if closing {
                                return;
                            }
                        }
                    }
                },
            }
            // Open waiting sentences while there is room.
            while !closing && self.open.len() < MAX_CONTEXTS {
                let Some((ctx, text, events)) = self.waiting.pop_front() else {
                    break;
                };
                if events.is_closed() {
                    continue;
                }
                if conn.is_none() {
                    match self.connect().await {
                        Ok(c) => conn = Some(c),
                        Err(e) => {
                            tracing::warn!(error = %e, "speech synthesis failed");
                            let _ = events.send(e.event()).await;
                            continue;
                        }
                    }
                }
                let Some(c) = conn.as_mut() else { break };
                if let Err(e) = self.open_context(c, &ctx, &text).await {
                    // The server may have said why before closing (e.g. a bad key).
                    let e = match tokio::time::timeout(Duration::from_secs(2), c.incoming.recv())
                        .await
                    {
                        Ok(m) => self.on_frame(m).await.err().unwrap_or(e),
                        Err(_) => e,
                    };
                    let _ = events.send(e.event()).await;
                    self.fail_all(e).await;
                    conn = None;
                    continue;
                }
                self.open.insert(
                    ctx,
                    Open {
                        events,
                        received: 0,
                        words: CharWords::default(),
                        forgotten: false,
                    },
                );
            }
        }
    }

    async fn connect(&self) -> Result<Conn, TtsError> {
        let headers = [("xi-api-key", self.key.as_str())];
        let (ws, _) = match ws_client::connect(&self.url, &headers, CONNECT_TIMEOUT).await {
            Ok(x) => x,
            Err(e) => {
                return Err(match e.status() {
                    Some(s) if s != 429 && s < 500 => reported(
                        format!(
                            "the socket was refused with HTTP {s} (check [tts] api_key and voice_id)"
                        ),
                        Some(s),
                    ),
                    _ => TtsError::Connect {
                        vendor: VENDOR,
                        message: e.to_string(),
                    },
                });
            }
        };
        let (incoming, sender, reader) = ws_pump::split(ws);
        Ok(Conn {
            incoming,
            sender,
            _reader: reader,
        })
    }

    async fn open_context(&self, c: &Conn, ctx: &str, text: &str) -> Result<(), TtsError> {
        let mut init = self.init.clone();
        init["context_id"] = json!(ctx);
        // Each chunk ends with a single space.
        let text = format!("{} ", text.trim_end());
        let msgs = [
            init,
            json!({"text": text, "context_id": ctx, "flush": true}),
            json!({"context_id": ctx, "close_context": true}),
        ];
        for m in msgs {
            c.sender
                .text(&m.to_string())
                .await
                .map_err(|e| TtsError::Connect {
                    vendor: VENDOR,
                    message: e.to_string(),
                })?;
        }
        Ok(())
    }

    async fn fail_all(&mut self, e: TtsError) {
        if !self.open.is_empty() {
            tracing::warn!(error = %e, "speech synthesis failed");
        }
        for (_, o) in self.open.drain() {
            if !o.forgotten {
                let _ = o.events.send(e.event()).await;
            }
        }
    }

    async fn on_frame(&mut self, msg: Option<WsIn>) -> Result<(), TtsError> {
        let t = match msg {
            Some(WsIn::Text(t)) => t,
            Some(WsIn::Binary(_)) => {
                return Err(reported("an unexpected binary frame".into(), None));
            }
            Some(WsIn::Close { code, reason }) => {
                let code = code.unwrap_or(1005);
                let status = matches!(code, 1011 | 1013).then_some(503);
                return Err(reported(
                    format!("closed the socket ({code} {reason})"),
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
        };
        let Ok(v) = serde_json::from_str::<Value>(&t) else {
            return Err(reported("a frame that is not JSON".into(), None));
        };
        if v.get("error").is_some() || (v.get("message").is_some() && v.get("audio").is_none()) {
            let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            let hint = if field("error").contains("auth") || field("error").contains("api_key") {
                " (check [tts] api_key)"
            } else {
                ""
            };
            return Err(reported(
                format!("{} ({}){hint}", field("message"), field("error")),
                None,
            ));
        }
        let ctx = v
            .get("contextId")
            .or_else(|| v.get("context_id"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let timestamps = self.timestamps;
        let Some(o) = self.open.get_mut(&ctx) else {
            // A flush_done or a frame of a context already finished.
            return Ok(());
        };
        if let Some(data) = v.get("audio").and_then(Value::as_str) {
            let audio = STANDARD
                .decode(data)
                .map_err(|_| reported("audio that is not base64".into(), None))?;
            // μ-law 8 kHz: 8 bytes a millisecond.
            let offset_ms = u32::try_from(o.received / 8).unwrap_or(u32::MAX);
            o.received += audio.len();
            if o.received > MAX_AUDIO_BYTES {
                let o = self.open.remove(&ctx);
                if let Some(o) = o.filter(|o| !o.forgotten) {
                    let e = TtsError::TooMuchAudio {
                        vendor: VENDOR,
                        limit: MAX_AUDIO_BYTES,
                    };
                    let _ = o.events.send(e.event()).await;
                }
                return Ok(());
            }
            if o.events.is_closed() {
                o.forgotten = true;
            }
            if !o.forgotten && !audio.is_empty() {
                // Never blocks the socket for long: the call reads its streams continuously;
                // a stream it dropped is forgotten.
                if o.events.send(TtsEvent::Audio(audio.into())).await.is_err() {
                    o.forgotten = true;
                }
            }
            if timestamps {
                let words = alignment::ws_words(&v, offset_ms, &mut o.words);
                if !o.forgotten
                    && !words.is_empty()
                    && o.events.send(TtsEvent::Words(words)).await.is_err()
                {
                    o.forgotten = true;
                }
            }
        }
        if v.get("isFinal").and_then(Value::as_bool) == Some(true)
            && let Some(mut o) = self.open.remove(&ctx)
            && !o.forgotten
        {
            if let Some(w) = o.words.finish().filter(|_| timestamps) {
                let _ = o.events.send(TtsEvent::Words(vec![w])).await;
            }
            let _ = o.events.send(TtsEvent::Done).await;
        }
        Ok(())
    }
}
