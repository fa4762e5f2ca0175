//! OpenAI Realtime transcription (providers.md §4.3), kind `openai_realtime`: one WebSocket
//! per call to `{base_url}/realtime?intent=transcription` (GA interface: no `OpenAI-Beta`
//! header, no `model=` in the URL), authenticated by `Authorization: Bearer <key>`. After the
//! server's `session.created` we send one `session.update` of `type: "transcription"` with
//! `audio.input.format = {"type":"audio/pcmu"}`, so the caller's μ-law 8 kHz goes up unchanged
//! (no resampling), base64 inside `input_audio_buffer.append` text frames, one per carrier
//! frame. Audio waits until the server confirms with `session.updated`, which is when the
//! session counts as open ([`SttEvent::Connected`]).
//!
//! Turn detection: with `endpointing_ms > 0` the server's VAD segments the audio
//! (`server_vad`, `silence_duration_ms = endpointing_ms`) and our endpointer counts that
//! silence; with `endpointing_ms = 0` the server does not segment (`turn_detection: null`) and
//! our endpointer's [`SttInput::Finalize`] becomes `input_audio_buffer.commit` (only with at
//! least 100 ms of audio in the buffer, as the server requires). Transcription deltas are
//! interim transcripts (accumulated per item); `…transcription.completed` is the item's final
//! text. An `error` event before the session is configured fails the session (so a fallback
//! chain moves on); after it, an `error` or `…transcription.failed` is reported and the
//! session goes on, and any close we did not ask for is fatal, named with OpenAI's code (a
//! bad key: `invalid_api_key`, close 3000).

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::deepgram::ws_base;
use super::error::SetupError;
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::{self, WsConnectError};
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const INPUT_QUEUE: usize = 1024;
/// The least audio `input_audio_buffer.commit` accepts: 100 ms of μ-law 8 kHz.
const MIN_COMMIT_BYTES: usize = 800;

pub struct OpenAiRealtimeStt {
    cfg: SttConfig,
    url: String,
    session_update: String,
}

impl OpenAiRealtimeStt {
    pub fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        Ok(Self {
            cfg: cfg.clone(),
            url: stream_url(cfg)?,
            session_update: session_update(cfg).to_string(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// `{base_url}/realtime?intent=transcription` (base up to and including `/v1`).
pub fn stream_url(cfg: &SttConfig) -> Result<String, SetupError> {
    Ok(format!("{}/realtime?intent=transcription", ws_base(cfg)?))
}

/// The `session.update` sent after `session.created` (GA transcription shape).
pub fn session_update(cfg: &SttConfig) -> Value {
    let mut transcription = json!({"model": cfg.effective_model()});
    if !cfg.language.trim().is_empty() {
        transcription["language"] = json!(cfg.language.trim());
    }
    if !cfg.keyterms.is_empty() {
        transcription["prompt"] = json!(cfg.keyterms.join(", "));
    }
    let turn_detection = if cfg.endpointing_ms == 0 {
        Value::Null
    } else {
        json!({
            "type": "server_vad",
            "threshold": 0.5,
            "prefix_padding_ms": 300,
            "silence_duration_ms": cfg.endpointing_ms,
        })
    };
    json!({
        "type": "session.update",
        "session": {
            "type": "transcription",
            "audio": {"input": {
                "format": {"type": "audio/pcmu"},
                "transcription": transcription,
                "turn_detection": turn_detection,
                "noise_reduction": {"type": "near_field"},
            }},
        },
    })
}

impl SttProvider for OpenAiRealtimeStt {
    fn endpointing_ms(&self) -> u64 {
        u64::from(self.cfg.endpointing_ms)
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(256);
        let session = Session {
            url: self.url.clone(),
            auth: format!("Bearer {}", self.cfg.api_key.expose()),
            update: self.session_update.clone(),
            manual: self.cfg.endpointing_ms == 0,
            call_id: ctx.call_id.clone(),
        };
        let task = tokio::spawn(async move {
            session.run(in_rx, &ev_tx).await;
            let _ = ev_tx.send(SttEvent::Closed).await;
        });
        SttStream {
            input: in_tx,
            events: ev_rx,
            guard: TaskGuard::new(task),
        }
    }
}

/// A clear message for a failed handshake.
fn handshake_message(e: &WsConnectError) -> String {
    let text = e.to_string();
    let hint = match e.status() {
        Some(401) | Some(403) => "OpenAI rejected the API key (HTTP 401/403): check [stt] api_key",
        Some(429) => "OpenAI is rate limiting (HTTP 429): too many sessions or no quota left",
        Some(s) if s >= 500 => "OpenAI had a server error; try again",
        Some(_) => "OpenAI refused the request: check [stt] base_url (up to and including /v1)",
        None => match e {
            WsConnectError::Timeout(..) => {
                "OpenAI did not answer in time: check network access and [stt] base_url"
            }
            _ => "could not reach OpenAI: check network access and [stt] base_url",
        },
    };
    format!("{hint} ({text})")
}

/// What an OpenAI Realtime error code means, and what to do.
pub fn error_hint(code: &str) -> &'static str {
    match code {
        "invalid_api_key" => "check [stt] api_key",
        "model_not_found" => "check [stt] model (e.g. gpt-4o-transcribe)",
        "insufficient_quota" => "the OpenAI account has no quota left",
        "rate_limit_exceeded" => "too many requests or sessions for the OpenAI account",
        "session_expired" => "the session reached its maximum duration",
        "input_audio_buffer_commit_empty" => "a commit had less than 100 ms of audio",
        "server_error" => "OpenAI had a server error; try again",
        "unknown_parameter" | "invalid_value" | "missing_required_parameter" => {
            "OpenAI refused a message patterd sent: check [stt] model and language"
        }
        _ => "see OpenAI's Realtime error codes",
    }
}

/// `error` event → a message naming its type, code, text and what to do.
fn error_message(v: &Value) -> String {
    let e = &v["error"];
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
    let code = s("code");
    let mut m = format!(
        "OpenAI Realtime reported an error: {}.{}: {}",
        s("type"),
        code,
        if s("message").is_empty() {
            "no description"
        } else {
            s("message")
        }
    );
    if !s("param").is_empty() {
        m.push_str(&format!(" (param {})", s("param")));
    }
    m.push_str(&format!(": {}", error_hint(code)));
    m
}

struct Session {
    url: String,
    auth: String,
    update: String,
    manual: bool,
    call_id: String,
}

impl Session {
    async fn run(self, mut input: mpsc::Receiver<SttInput>, ev: &mpsc::Sender<SttEvent>) {
        let fail = |message: String| SttEvent::Error {
            message,
            fatal: true,
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let headers = [("Authorization", self.auth.as_str())];
        let (ws, resp_headers) = match ws_client::connect(&self.url, &headers, CONNECT_TIMEOUT)
            .await
        {
            Ok(x) => x,
            Err(e) => {
                let message = handshake_message(&e);
                tracing::warn!(call = %self.call_id, error = %message, "OpenAI Realtime connect failed");
                let _ = ev.send(fail(message)).await;
                return;
            }
        };
        let request_id = resp_headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        let (mut incoming, sender, _reader) = ws_pump::split(ws);
        let mut configured = false;
        // Bytes appended since the last commit (manual turn detection only).
        let mut uncommitted = 0usize;
        let mut commits_pending = 0usize;
        let mut partial: HashMap<String, String> = HashMap::new();
        loop {
            tokio::select! {
                msg = input.recv(), if configured => {
                    let res = match msg {
                        Some(SttInput::Audio(b)) if !b.is_empty() => {
                            uncommitted += b.len();
                            let m = json!({
                                "type": "input_audio_buffer.append",
                                "audio": STANDARD.encode(&b),
                            });
                            sender.text(&m.to_string()).await
                        }
                        Some(SttInput::Audio(_)) => continue,
                        Some(SttInput::Finalize) => {
                            if !self.manual || uncommitted < MIN_COMMIT_BYTES {
                                continue;
                            }
                            uncommitted = 0;
                            commits_pending += 1;
                            sender.text(r#"{"type":"input_audio_buffer.commit"}"#).await
                        }
                        Some(SttInput::Close) | None => {
                            let _ = sender.close(1000, "").await;
                            return;
                        }
                    };
                    if let Err(e) = res {
                        let _ = ev.send(fail(format!("OpenAI Realtime send failed: {e}"))).await;
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline), if !configured => {
                    let _ = ev.send(fail(format!(
                        "OpenAI Realtime did not confirm the session within {} s (request {request_id})",
                        CONNECT_TIMEOUT.as_secs()
                    ))).await;
                    return;
                }
                msg = incoming.recv() => match msg {
                    Some(WsIn::Text(t)) => {
                        let Ok(v) = serde_json::from_str::<Value>(&t) else {
                            tracing::debug!(call = %self.call_id, "OpenAI Realtime sent a frame that is not JSON");
                            continue;
                        };
                        match v.get("type").and_then(Value::as_str).unwrap_or("") {
                            "session.created" => {
                                if let Err(e) = sender.text(&self.update).await {
                                    let _ = ev.send(fail(format!("OpenAI Realtime send failed: {e}"))).await;
                                    return;
                                }
                            }
                            "session.updated" if !configured => {
                                configured = true;
                                tracing::debug!(call = %self.call_id, request_id = %request_id, "OpenAI Realtime session configured");
                                if ev.send(SttEvent::Connected).await.is_err() {
                                    return;
                                }
                            }
                            "error" => {
                                let message = error_message(&v);
                                tracing::warn!(call = %self.call_id, request_id = %request_id, error = %message, "OpenAI Realtime error");
                                if !configured {
                                    let _ = ev.send(fail(message)).await;
                                    let _ = sender.close(1000, "").await;
                                    return;
                                }
                                if ev.send(SttEvent::Error { message, fatal: false }).await.is_err() {
                                    return;
                                }
                            }
                            _ => {
                                let from_finalize = commits_pending > 0;
                                if let Some(e) = map_event(&v, &mut partial, from_finalize) {
                                    if matches!(e, SttEvent::Final { .. }) {
                                        commits_pending = commits_pending.saturating_sub(1);
                                    }
                                    if ev.send(e).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                    Some(WsIn::Binary(_)) => {}
                    Some(WsIn::Close { code, reason }) => {
                        let code = code.unwrap_or(1005);
                        tracing::info!(call = %self.call_id, code, reason = %reason, request_id = %request_id, "OpenAI Realtime closed the session");
                        let hint = reason.rsplit('.').next().map(error_hint).unwrap_or("");
                        let _ = ev.send(fail(format!(
                            "OpenAI Realtime closed the session: {code} {reason}: {hint} (request {request_id})"
                        ))).await;
                        return;
                    }
                    Some(WsIn::Failed(e)) => {
                        let _ = ev.send(fail(format!(
                            "OpenAI Realtime connection lost: {e} (request {request_id})"
                        ))).await;
                        return;
                    }
                    None => return,
                }
            }
        }
    }
}

/// Maps one server event (other than `session.*` and `error`) onto an STT event: speech
/// start, interim text (the item's deltas so far, kept in `partial`), the item's final text.
/// `from_finalize`: the final answers our commit. Public for the parser tests.
pub fn map_event(
    v: &Value,
    partial: &mut HashMap<String, String>,
    from_finalize: bool,
) -> Option<SttEvent> {
    let item = v
        .get("item_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match v.get("type").and_then(Value::as_str)? {
        "input_audio_buffer.speech_started" => Some(SttEvent::SpeechStarted),
        "conversation.item.input_audio_transcription.delta" => {
            let delta = v.get("delta").and_then(Value::as_str).unwrap_or("");
            if partial.len() > 64 && !partial.contains_key(&item) {
                partial.clear();
            }
            let text = partial.entry(item).or_default();
            text.push_str(delta);
            let t = text.trim();
            (!t.is_empty()).then(|| SttEvent::Interim(t.to_string()))
        }
        "conversation.item.input_audio_transcription.completed" => {
            partial.remove(&item);
            let text = v
                .get("transcript")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_string();
            Some(SttEvent::Final {
                text,
                speech_final: true,
                from_finalize,
            })
        }
        "conversation.item.input_audio_transcription.failed" => {
            partial.remove(&item);
            let e = &v["error"];
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
            Some(SttEvent::Error {
                message: format!(
                    "OpenAI Realtime could not transcribe an utterance: {}: {}",
                    s("code"),
                    s("message")
                ),
                fatal: false,
            })
        }
        _ => None,
    }
}

impl super::kinds::SttKindImpl for OpenAiRealtimeStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    /// OpenAI's REST root is the Realtime base (`…/v1`) over HTTPS.
    fn credential_check(cfg: &SttConfig, client: &reqwest::Client) -> reqwest::RequestBuilder {
        super::kinds::models_check(cfg.effective_base_url(), &cfg.api_key, client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> SttConfig {
        toml::from_str(&format!("kind = \"openai_realtime\"\n{extra}")).expect("config")
    }

    #[test]
    fn url_and_session_update_follow_the_ga_shape() {
        let c = cfg("");
        assert_eq!(
            stream_url(&c).expect("url"),
            "wss://api.openai.com/v1/realtime?intent=transcription"
        );
        let u = session_update(&c);
        assert_eq!(u["type"], "session.update");
        assert_eq!(u["session"]["type"], "transcription");
        let input = &u["session"]["audio"]["input"];
        assert_eq!(input["format"], json!({"type": "audio/pcmu"}));
        assert_eq!(
            input["transcription"],
            json!({"model": "gpt-4o-transcribe", "language": "en"})
        );
        assert_eq!(input["turn_detection"]["type"], "server_vad");
        assert_eq!(input["turn_detection"]["silence_duration_ms"], 300);
        let manual = session_update(&cfg("endpointing_ms = 0\nkeyterms = [\"Patterd\"]"));
        let input = &manual["session"]["audio"]["input"];
        assert!(input["turn_detection"].is_null());
        assert_eq!(input["transcription"]["prompt"], "Patterd");
        let c = cfg("base_url = \"http://127.0.0.1:9/v1/\"");
        assert_eq!(
            stream_url(&c).expect("url"),
            "ws://127.0.0.1:9/v1/realtime?intent=transcription"
        );
    }

    #[test]
    fn events_map_onto_stt_events() {
        let mut p = HashMap::new();
        let delta = |d: &str| {
            json!({"type": "conversation.item.input_audio_transcription.delta",
                   "event_id": "e1", "item_id": "it1", "content_index": 0, "delta": d})
        };
        assert_eq!(
            map_event(&delta("I need"), &mut p, false),
            Some(SttEvent::Interim("I need".into()))
        );
        assert_eq!(
            map_event(&delta(" a table"), &mut p, false),
            Some(SttEvent::Interim("I need a table".into()))
        );
        let done = json!({"type": "conversation.item.input_audio_transcription.completed",
                          "event_id": "e2", "item_id": "it1", "content_index": 0,
                          "transcript": "I need a table. "});
        assert_eq!(
            map_event(&done, &mut p, true),
            Some(SttEvent::Final {
                text: "I need a table.".into(),
                speech_final: true,
                from_finalize: true
            })
        );
        assert!(p.is_empty());
        assert_eq!(
            map_event(
                &json!({"type": "input_audio_buffer.speech_started", "item_id": "it2", "audio_start_ms": 10}),
                &mut p,
                false
            ),
            Some(SttEvent::SpeechStarted)
        );
        assert_eq!(
            map_event(
                &json!({"type": "input_audio_buffer.committed"}),
                &mut p,
                false
            ),
            None
        );
        let Some(SttEvent::Error { message, fatal }) = map_event(
            &json!({"type": "conversation.item.input_audio_transcription.failed", "item_id": "x",
                    "error": {"code": "audio_unintelligible", "message": "could not decode"}}),
            &mut p,
            false,
        ) else {
            panic!("error");
        };
        assert!(!fatal);
        assert!(message.contains("audio_unintelligible: could not decode"));
        let m = error_message(&json!({"type": "error", "error": {
            "type": "invalid_request_error", "code": "invalid_api_key",
            "message": "Incorrect API key provided", "param": null}}));
        assert_eq!(
            m,
            "OpenAI Realtime reported an error: invalid_request_error.invalid_api_key: \
             Incorrect API key provided: check [stt] api_key"
        );
    }
}
