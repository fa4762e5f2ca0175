//! OpenAI Realtime transcription, kind `openai_realtime`: one WebSocket
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

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::deepgram::ws_base;
use super::error::SetupError;
use super::stt_session::{self, Frame, Step, SttWire};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::WsConnectError;
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
pub(crate) fn session_update(cfg: &SttConfig) -> Value {
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
        let wire = Wire {
            url: self.url.clone(),
            auth: format!("Bearer {}", self.cfg.api_key.expose()),
            update: self.session_update.clone(),
            manual: self.cfg.endpointing_ms == 0,
            request_id: "-".into(),
            configured: false,
            uncommitted: 0,
            commits_pending: 0,
            partial: HashMap::new(),
        };
        stt_session::open(wire, &ctx.call_id)
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
pub(crate) fn error_hint(code: &str) -> &'static str {
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

/// OpenAI Realtime's framing: `session.update` on `session.created`, ready on
/// `session.updated`; audio base64 in `input_audio_buffer.append`, `Finalize` as a commit
/// (manual turn detection, at least 100 ms); a close is immediate. Events through
/// [`map_event`].
struct Wire {
    url: String,
    auth: String,
    update: String,
    manual: bool,
    request_id: String,
    configured: bool,
    /// Bytes appended since the last commit (manual turn detection only).
    uncommitted: usize,
    commits_pending: usize,
    partial: HashMap<String, String>,
}

impl SttWire for Wire {
    const NAME: &'static str = "OpenAI Realtime";

    fn url(&self) -> &str {
        &self.url
    }
    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![("Authorization", self.auth.clone())]
    }
    fn handshake_message(&self, e: &WsConnectError) -> String {
        handshake_message(e)
    }
    fn connected(&mut self, headers: &http::HeaderMap) {
        self.request_id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
    }
    fn ready_at_connect(&self) -> bool {
        false
    }
    fn input(&mut self, input: SttInput, out: &mut Vec<Step>) {
        match input {
            SttInput::Audio(b) if !b.is_empty() => {
                self.uncommitted += b.len();
                let m = json!({
                    "type": "input_audio_buffer.append",
                    "audio": STANDARD.encode(&b),
                });
                out.push(Step::Send(Frame::Text(m.to_string().into())));
            }
            SttInput::Audio(_) => {}
            SttInput::Finalize => {
                if self.manual && self.uncommitted >= MIN_COMMIT_BYTES {
                    self.uncommitted = 0;
                    self.commits_pending += 1;
                    let commit = r#"{"type":"input_audio_buffer.commit"}"#;
                    out.push(Step::Send(Frame::Text(commit.into())));
                }
            }
            SttInput::Close => out.push(Step::Close { drain: false }),
        }
    }
    fn text(&mut self, text: &str, out: &mut Vec<Step>) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            tracing::debug!("OpenAI Realtime sent a frame that is not JSON");
            return;
        };
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "session.created" => out.push(Step::Send(Frame::Text(self.update.clone().into()))),
            "session.updated" if !self.configured => {
                self.configured = true;
                tracing::debug!(request_id = %self.request_id, "OpenAI Realtime session configured");
                out.push(Step::Ready);
            }
            "error" => {
                let message = error_message(&v);
                tracing::warn!(request_id = %self.request_id, error = %message, "OpenAI Realtime error");
                let fatal = !self.configured;
                out.push(Step::Event(SttEvent::Error { message, fatal }));
                if fatal {
                    out.push(Step::Close { drain: false });
                }
            }
            _ => {
                let from_finalize = self.commits_pending > 0;
                if let Some(e) = map_event(&v, &mut self.partial, from_finalize) {
                    if matches!(e, SttEvent::Final { .. }) {
                        self.commits_pending = self.commits_pending.saturating_sub(1);
                    }
                    out.push(Step::Event(e));
                }
            }
        }
    }
    fn close_message(&self, code: u16, reason: &str) -> String {
        let hint = reason.rsplit('.').next().map(error_hint).unwrap_or("");
        format!(
            "OpenAI Realtime closed the session: {code} {reason}: {hint} (request {})",
            self.request_id
        )
    }
    fn lost_message(&self, error: &str) -> String {
        format!(
            "OpenAI Realtime connection lost: {error} (request {})",
            self.request_id
        )
    }
    fn unconfirmed_message(&self) -> String {
        format!(
            "OpenAI Realtime did not confirm the session within {} s (request {})",
            stt_session::CONNECT_TIMEOUT.as_secs(),
            self.request_id
        )
    }
    fn log_id(&self) -> &str {
        &self.request_id
    }
}

/// Maps one server event (other than `session.*` and `error`) onto an STT event: speech
/// start, interim text (the item's deltas so far, kept in `partial`), the item's final text.
/// `from_finalize`: the final answers our commit. Public for the parser tests.
pub(crate) fn map_event(
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
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(super::kinds::models_check(
            cfg.effective_base_url(),
            &cfg.api_key,
            client,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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

    #[test]
    fn the_session_is_ready_on_its_update_and_commits_need_100_ms() {
        let c = cfg("endpointing_ms = 0");
        let mut w = Wire {
            url: String::new(),
            auth: String::new(),
            update: session_update(&c).to_string(),
            manual: true,
            request_id: "r1".into(),
            configured: false,
            uncommitted: 0,
            commits_pending: 0,
            partial: HashMap::new(),
        };
        let mut out = Vec::new();
        w.text(r#"{"type":"session.created"}"#, &mut out);
        assert!(matches!(&out[..], [Step::Send(Frame::Text(t))] if t.contains("session.update")));
        out.clear();
        w.text(r#"{"type":"session.updated"}"#, &mut out);
        w.text(r#"{"type":"session.updated"}"#, &mut out);
        assert_eq!(out, vec![Step::Ready]);
        out.clear();
        w.input(SttInput::Audio(Bytes::from(vec![0xFFu8; 400])), &mut out);
        w.input(SttInput::Finalize, &mut out);
        assert_eq!(out.len(), 1, "under 100 ms: no commit");
        w.input(SttInput::Audio(Bytes::from(vec![0xFFu8; 400])), &mut out);
        w.input(SttInput::Finalize, &mut out);
        assert_eq!(
            out.last(),
            Some(&Step::Send(Frame::Text(
                r#"{"type":"input_audio_buffer.commit"}"#.into()
            )))
        );
        out.clear();
        w.text(
            r#"{"type":"conversation.item.input_audio_transcription.completed","item_id":"i","transcript":"hi"}"#,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Step::Event(SttEvent::Final {
                text: "hi".into(),
                speech_final: true,
                from_finalize: true
            })]
        );
        out.clear();
        w.input(SttInput::Close, &mut out);
        assert_eq!(out, vec![Step::Close { drain: false }]);
    }
}
