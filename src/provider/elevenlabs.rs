//! ElevenLabs text-to-speech over HTTP streaming (the default
//! `transport = "http"`; `"websocket"` hands each call an [`ElevenLabsWs`] session): one
//! `POST /v1/text-to-speech/{voice_id}/stream?output_format=ulaw_8000` per text piece, whose
//! chunked body is raw μ-law 8 kHz that goes to the carrier untouched. With `word_timestamps`
//! (the default) the request goes to `…/stream/with-timestamps` instead, whose body is JSON
//! lines (`audio_base64` plus a per-character `alignment`, times from the start of the
//! request's audio): the audio goes out the same, and the characters become
//! [`TtsEvent::Words`]. A raw `audio/*` answer there is taken as audio without timings.
//!
//! Why per-utterance HTTP streams rather than the multi-context WebSocket: cancelling on
//! barge-in is just dropping the request (no context bookkeeping, no late audio of a cancelled
//! context to filter out, no socket keep-alive), a failed request affects one sentence only,
//! and for sentence-sized text the time to first audio is comparable because the connection
//! pool keeps the TLS connection warm. The sentence chunker already supplies text in pieces.

use std::time::Duration;

/// The most audio one piece of text may produce: two minutes of μ-law 8 kHz. A piece is at most
/// [`super::chunker::MAX_PIECE_BYTES`] of text (well under a minute of speech), so a stream
/// that goes past this is broken or hostile and is cut instead of filling the call's queue.
pub(crate) const MAX_AUDIO_BYTES: usize = 120 * 8000;

use serde_json::json;
use tokio::sync::mpsc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::alignment::{self, CharWords};
use super::elevenlabs_ws::ElevenLabsWs;
use super::error::{SetupError, TtsError};
use super::openai::error_text;
use super::{TtsEvent, TtsProvider, TtsStream};
use crate::config::schema::{TtsConfig, TtsTransport};
use crate::util::TaskGuard;

const VENDOR: &str = "ElevenLabs";

/// Default longest wait for the response head or the next body chunk.
const DEFAULT_STALL: Duration = Duration::from_secs(10);

pub struct ElevenLabsTts {
    cfg: TtsConfig,
    client: reqwest::Client,
    url: String,
    stall: Duration,
}

impl ElevenLabsTts {
    pub fn new(cfg: &TtsConfig) -> Result<Self, SetupError> {
        crate::util::init_tls();
        // No redirects: the vendor key travels in a custom header, which a redirect to
        // another host would carry along.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(SetupError::Client)?;
        let mut url = format!(
            "{}/v1/text-to-speech/{}/stream{}?output_format=ulaw_8000",
            cfg.base_url.trim_end_matches('/'),
            url_escape(&cfg.voice_id),
            if cfg.word_timestamps {
                "/with-timestamps"
            } else {
                ""
            }
        );
        if let Some(n) = cfg.optimize_streaming_latency {
            url.push_str(&format!("&optimize_streaming_latency={}", n.min(4)));
        }
        Ok(Self {
            cfg: cfg.clone(),
            client,
            url,
            stall: DEFAULT_STALL,
        })
    }
}

fn url_escape(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl TtsProvider for ElevenLabsTts {
    fn for_call(&self) -> Option<std::sync::Arc<dyn TtsProvider>> {
        (self.cfg.transport == TtsTransport::Websocket)
            .then(|| std::sync::Arc::new(ElevenLabsWs::new(&self.cfg)) as _)
    }

    fn synthesize(&self, text: &str) -> TtsStream {
        if self.cfg.transport == TtsTransport::Websocket {
            // Outside a call (e.g. `patterd try`): a socket for this text alone, closed
            // once it is spoken.
            let session = ElevenLabsWs::new(&self.cfg);
            let mut inner = session.synthesize(text);
            let (tx, rx) = mpsc::channel(64);
            let task = tokio::spawn(async move {
                let _session = session;
                while let Some(ev) = inner.events.recv().await {
                    let last = !matches!(ev, TtsEvent::Audio(_));
                    if tx.send(ev).await.is_err() || last {
                        break;
                    }
                }
            });
            return TtsStream {
                events: rx,
                guard: TaskGuard::new(task),
            };
        }
        let mut body = json!({ "text": text, "model_id": self.cfg.model });
        if let Some(speed) = self.cfg.speed {
            body["voice_settings"] = json!({ "speed": speed });
        }
        let accept = if self.cfg.word_timestamps {
            "application/json"
        } else {
            "audio/basic"
        };
        let req = self
            .client
            .post(&self.url)
            .header("xi-api-key", self.cfg.api_key.expose())
            .header("Accept", accept)
            .json(&body);
        let stall = self.stall;
        TtsStream::spawn(move |tx| async move { run(req, stall, &tx).await })
    }
}

async fn run(
    req: reqwest::RequestBuilder,
    stall: Duration,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let mut resp = tokio::time::timeout(stall, req.send())
        .await
        .map_err(|_| TtsError::NoAnswer {
            vendor: VENDOR,
            after: stall,
        })?
        .map_err(|source| TtsError::Request {
            vendor: VENDOR,
            source,
        })?;
    let status = resp.status();
    let ctype = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let json_lines = ctype.starts_with("application/json")
        || ctype.contains("ndjson")
        || ctype.starts_with("text/event-stream");
    if status != reqwest::StatusCode::OK || !(ctype.starts_with("audio/") || json_lines) {
        let mut body = Vec::new();
        while body.len() < 16 * 1024 {
            match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
                Ok(Ok(Some(c))) => body.extend_from_slice(&c),
                _ => break,
            }
        }
        let hint = match status.as_u16() {
            401 => " (check [tts] api_key)",
            402 => " (payment required: plan or voice not available)",
            404 => " (check [tts] voice_id)",
            429 => " (too many concurrent requests)",
            _ => "",
        };
        return Err(TtsError::Http {
            vendor: VENDOR,
            status: status.as_u16(),
            content_type: if ctype.is_empty() {
                "no content type".to_string()
            } else {
                ctype
            },
            message: error_text(&body),
            hint,
        });
    }
    if json_lines {
        return run_lines(resp, stall, tx).await;
    }
    let mut received = 0usize;
    loop {
        let chunk = next_chunk(&mut resp, stall).await?;
        match chunk {
            Some(c) if c.is_empty() => {}
            Some(c) => {
                received += c.len();
                if received > MAX_AUDIO_BYTES {
                    return Err(TtsError::TooMuchAudio {
                        vendor: VENDOR,
                        limit: MAX_AUDIO_BYTES,
                    });
                }
                tx.send(TtsEvent::Audio(c))
                    .await
                    .map_err(|_| TtsError::Abandoned)?
            }
            None => return Ok(()),
        }
    }
}

/// The body's next chunk, or a stall error when none comes within `stall`.
async fn next_chunk(
    resp: &mut reqwest::Response,
    stall: Duration,
) -> Result<Option<bytes::Bytes>, TtsError> {
    tokio::time::timeout(stall, resp.chunk())
        .await
        .map_err(|_| TtsError::Stalled {
            vendor: VENDOR,
            after: stall,
        })?
        .map_err(|source| TtsError::Stream {
            vendor: VENDOR,
            source,
        })
}

/// Longest JSON line accepted from `with-timestamps` (a line carries one audio chunk).
const MAX_LINE_BYTES: usize = 4 << 20;

fn reported(message: String) -> TtsError {
    TtsError::Reported {
        vendor: VENDOR,
        message,
        status: None,
    }
}

/// The body of `…/stream/with-timestamps`: one JSON object a line (an SSE `data:` prefix is
/// tolerated), each with base64 `audio_base64` and the alignment of its characters.
async fn run_lines(
    mut resp: reqwest::Response,
    stall: Duration,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut received = 0usize;
    let mut words = CharWords::default();
    loop {
        let chunk = next_chunk(&mut resp, stall).await?;
        let Some(chunk) = chunk else {
            let rest = std::mem::take(&mut buf);
            line(&rest, &mut received, &mut words, tx).await?;
            if let Some(w) = words.finish() {
                tx.send(TtsEvent::Words(vec![w]))
                    .await
                    .map_err(|_| TtsError::Abandoned)?;
            }
            return Ok(());
        };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let l: Vec<u8> = buf.drain(..=pos).collect();
            line(&l, &mut received, &mut words, tx).await?;
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(reported(format!(
                "a with-timestamps line longer than {MAX_LINE_BYTES} bytes"
            )));
        }
    }
}

/// One `with-timestamps` line: its audio, then the words it completed.
async fn line(
    raw: &[u8],
    received: &mut usize,
    words: &mut CharWords,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let text = String::from_utf8_lossy(raw);
    let text = text.trim();
    let text = text.strip_prefix("data:").map_or(text, str::trim);
    if text.is_empty() {
        return Ok(());
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Err(reported("a with-timestamps line that is not JSON".into()));
    };
    let data = v
        .get("audio_base64")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let audio = STANDARD
        .decode(data)
        .map_err(|_| reported("audio_base64 that is not base64".into()))?;
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
    let done = alignment::http_words(&v, words);
    if !done.is_empty() {
        tx.send(TtsEvent::Words(done))
            .await
            .map_err(|_| TtsError::Abandoned)?;
    }
    Ok(())
}

impl super::kinds::TtsKindImpl for ElevenLabsTts {
    fn build(cfg: &TtsConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    /// `GET /v1/user` with `xi-api-key`.
    fn credential_check(
        cfg: &TtsConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        let base = super::kinds::http_base(&cfg.base_url);
        Some(
            client
                .get(format!("{base}/v1/user"))
                .header("xi-api-key", cfg.api_key.expose()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::schema::{Secret, TtsKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers any request with an endless chunked `audio/basic` body.
    async fn endless_audio_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: audio/basic\r\n\
                        transfer-encoding: chunked\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![0xffu8; 16 * 1024];
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            while sock.write_all(&frame).await.is_ok() {}
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_piece_that_never_stops_producing_audio_is_cut() {
        let cfg = TtsConfig {
            kind: TtsKind::Elevenlabs,
            api_key: Secret::new("k"),
            voice_id: "v".into(),
            model: "m".into(),
            base_url: endless_audio_server().await,
            optimize_streaming_latency: None,
            speed: None,
            instructions: None,
            sample_rate: None,
            transport: Default::default(),
            word_timestamps: true,
            voice_path: None,
            library: None,
            program: None,
            threads: None,
            workers: None,
        };
        let tts = ElevenLabsTts::new(&cfg).expect("tts");
        let mut s = tts.synthesize("Hello.");
        let mut bytes = 0usize;
        let last = loop {
            match s.events.recv().await {
                Some(TtsEvent::Audio(a)) => bytes += a.len(),
                other => break other,
            }
        };
        assert!(bytes <= MAX_AUDIO_BYTES, "{bytes} bytes passed");
        match last {
            Some(TtsEvent::Error(e)) => assert!(e.contains("more than"), "{e}"),
            other => panic!("expected an error, got {other:?}"),
        }
    }
}
