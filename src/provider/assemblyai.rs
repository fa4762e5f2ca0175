//! AssemblyAI Universal-Streaming v3 speech-to-text (`/v3/ws`), kind
//! `assemblyai`. One WebSocket per call, authenticated by the raw key in `Authorization`;
//! caller μ-law 8 kHz goes up unchanged (`encoding=pcm_mulaw&sample_rate=8000`) as binary
//! frames, batched from 20 ms carrier frames into 100 ms chunks (AssemblyAI refuses chunks
//! outside 50–1000 ms with 3007; the last one is padded with μ-law silence to 50 ms).
//! `{"type":"Terminate"}` ends the session (the server answers `Termination` and closes).
//! The model decides the turns: a partial `Turn` is an interim transcript, `SpeechStarted` a
//! barge-in hint, and the `Turn` with `end_of_turn` (the formatted one when `format_turns`,
//! i.e. `smart_format`, is on) becomes [`SttEvent::EndOfTurn`]; `eot_threshold` and
//! `eot_timeout_ms` are sent as `end_of_turn_confidence_threshold` and `max_turn_silence`.
//! Our endpointer only listens ([`SttProvider::ends_turns`]); our `Finalize` (the policy
//! ending a turn whose end it vetoed) is `ForceEndpoint`, after the buffered audio. An `Error` message or a close
//! other than the answer to our `Terminate` is a fatal error naming AssemblyAI's code and
//! what to do about it.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::deepgram::ws_base;
use super::error::SetupError;
use super::stt_session::{self, Frame, Step, SttWire};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::WsConnectError;
/// The API version header AssemblyAI's SDK sends.
const API_VERSION: &str = "2025-05-12";
/// Bytes of μ-law 8 kHz per chunk sent (100 ms).
const CHUNK_BYTES: usize = 800;
/// The shortest chunk AssemblyAI accepts (50 ms).
const MIN_CHUNK_BYTES: usize = 400;
/// μ-law silence.
const MULAW_SILENCE: u8 = 0xFF;

pub(crate) struct AssemblyAiStt {
    cfg: SttConfig,
    url: String,
}

impl AssemblyAiStt {
    pub(crate) fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        Ok(Self {
            cfg: cfg.clone(),
            url: stream_url(cfg)?,
        })
    }
}

/// The `/v3/ws` URL: μ-law 8 kHz, the speech model, `format_turns`, and the turn settings
/// that are set (`keyterms_prompt` is a JSON list, as the SDK sends it).
pub fn stream_url(cfg: &SttConfig) -> Result<String, SetupError> {
    let base = ws_base(cfg)?;
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("sample_rate", "8000")
        .append_pair("encoding", "pcm_mulaw")
        .append_pair("speech_model", cfg.effective_model())
        .append_pair(
            "format_turns",
            if cfg.smart_format { "true" } else { "false" },
        );
    if let Some(t) = cfg.eot_threshold {
        q.append_pair("end_of_turn_confidence_threshold", &t.to_string());
    }
    if let Some(t) = cfg.eot_timeout_ms {
        q.append_pair("max_turn_silence", &t.to_string());
    }
    if !cfg.keyterms.is_empty() {
        let list = serde_json::to_string(&cfg.keyterms).unwrap_or_else(|_| "[]".into());
        q.append_pair("keyterms_prompt", &list);
    }
    Ok(format!("{base}/v3/ws?{}", q.finish()))
}

impl SttProvider for AssemblyAiStt {
    fn ends_turns(&self) -> bool {
        true
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let wire = Wire {
            url: self.url.clone(),
            key: self.cfg.api_key.expose().to_string(),
            formatted: self.cfg.smart_format,
            pending: BytesMut::with_capacity(CHUNK_BYTES),
            session_id: "-".into(),
        };
        stt_session::open(wire, &ctx.call_id)
    }
}

/// AssemblyAI's framing: audio batched into 100 ms binary chunks (the last padded to 50 ms),
/// no `Finalize`, `Terminate` (drained); `Begin` names the session, the rest goes through
/// [`map_message`].
struct Wire {
    url: String,
    key: String,
    formatted: bool,
    pending: BytesMut,
    session_id: String,
}

impl SttWire for Wire {
    const NAME: &'static str = "AssemblyAI";

    fn url(&self) -> &str {
        &self.url
    }
    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("Authorization", self.key.clone()),
            ("AssemblyAI-Version", API_VERSION.into()),
        ]
    }
    fn handshake_message(&self, e: &WsConnectError) -> String {
        handshake_message(e)
    }
    fn input(&mut self, input: SttInput, out: &mut Vec<Step>) {
        match input {
            SttInput::Audio(b) if !b.is_empty() => {
                self.pending.extend_from_slice(&b);
                if self.pending.len() >= CHUNK_BYTES {
                    let chunk: Bytes = self.pending.split().freeze();
                    out.push(Step::Send(Frame::Binary(chunk)));
                }
            }
            SttInput::Audio(_) => {}
            SttInput::Finalize => {
                // The policy ends the turn itself (a vetoed end whose hold ran out): what is
                // buffered goes first, then `ForceEndpoint`.
                if !self.pending.is_empty() {
                    if self.pending.len() < MIN_CHUNK_BYTES {
                        self.pending.resize(MIN_CHUNK_BYTES, MULAW_SILENCE);
                    }
                    let chunk: Bytes = self.pending.split().freeze();
                    out.push(Step::Send(Frame::Binary(chunk)));
                }
                out.push(Step::Send(Frame::Text(
                    r#"{"type":"ForceEndpoint"}"#.into(),
                )));
            }
            SttInput::Close => {
                out.push(Step::Close { drain: true });
                if !self.pending.is_empty() {
                    if self.pending.len() < MIN_CHUNK_BYTES {
                        self.pending.resize(MIN_CHUNK_BYTES, MULAW_SILENCE);
                    }
                    let chunk: Bytes = self.pending.split().freeze();
                    out.push(Step::Send(Frame::Binary(chunk)));
                }
                out.push(Step::Send(Frame::Text(r#"{"type":"Terminate"}"#.into())));
            }
        }
    }
    fn text(&mut self, text: &str, out: &mut Vec<Step>) {
        if let Some(id) = begin_id(text) {
            tracing::debug!(session = %id, "AssemblyAI session began");
            self.session_id = id;
            return;
        }
        out.extend(map_message(text, self.formatted).map(Step::Event));
    }
    fn close_message(&self, code: u16, reason: &str) -> String {
        format!(
            "AssemblyAI closed the stream: {code} {reason}: {} (session {})",
            close_hint(code),
            self.session_id
        )
    }
    fn lost_message(&self, error: &str) -> String {
        format!(
            "AssemblyAI connection lost: {error} (session {})",
            self.session_id
        )
    }
    fn log_id(&self) -> &str {
        &self.session_id
    }
}

/// A clear message for a failed handshake.
fn handshake_message(e: &WsConnectError) -> String {
    let text = e.to_string();
    let hint = match e.status() {
        Some(401) | Some(403) => {
            "AssemblyAI rejected the API key (HTTP 401/403): check [stt] api_key"
        }
        Some(429) => "AssemblyAI is rate limiting (HTTP 429): too many concurrent streams",
        Some(s) if s >= 500 => "AssemblyAI had a server error; try again",
        Some(_) => "AssemblyAI refused the request: check [stt] model, base_url and thresholds",
        None => match e {
            WsConnectError::Timeout(..) => {
                "AssemblyAI did not answer in time: check network access and [stt] base_url"
            }
            _ => "could not reach AssemblyAI: check network access and [stt] base_url",
        },
    };
    format!("{hint} ({text})")
}

/// What an AssemblyAI close code (or `Error` `error_code`) means, and what to do.
pub(crate) fn close_hint(code: u16) -> &'static str {
    match code {
        4001 => "not authorized: check [stt] api_key",
        4002 => "insufficient funds: top up the AssemblyAI account",
        4003 => "a paid-only feature was requested: check the AssemblyAI plan or [stt] model",
        4000 => "bad sample rate (patterd sends μ-law 8000 Hz; check [stt] base_url)",
        3005 => "AssemblyAI server error; try again",
        3006 => "input validation error: check [stt] model and thresholds",
        3007 => "audio chunk duration violation (chunks must be 50–1000 ms)",
        3008 => "maximum session duration exceeded",
        3009 | 4102 => "too many concurrent sessions for the AssemblyAI plan",
        4029 => "audio sent faster than real time",
        4031 => "session idle too long",
        4100 | 4101 => "AssemblyAI could not parse a control message",
        1013 => "temporary server condition; try again",
        _ => "see AssemblyAI's streaming error codes",
    }
}

/// The session id of a `Begin` message.
fn begin_id(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    (v.get("type").and_then(Value::as_str)? == "Begin").then(|| {
        v.get("id")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string()
    })
}

/// Maps one server text frame onto an event (none for `Begin`, `Termination`, the
/// unformatted end of turn when `formatted` turns are awaited, and unknown types). Public
/// for the parser tests.
pub fn map_message(text: &str, formatted: bool) -> Option<SttEvent> {
    let v: Value = serde_json::from_str(text).ok()?;
    match v.get("type").and_then(Value::as_str)? {
        "SpeechStarted" => Some(SttEvent::SpeechStarted),
        "Turn" => {
            let transcript = v
                .get("transcript")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_string();
            let end = v
                .get("end_of_turn")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let is_formatted = v
                .get("turn_is_formatted")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if end && (!formatted || is_formatted) {
                Some(SttEvent::EndOfTurn(transcript))
            } else if end || transcript.is_empty() {
                None
            } else {
                Some(SttEvent::Interim(transcript))
            }
        }
        "Error" => {
            let code = v.get("error_code").and_then(Value::as_u64).unwrap_or(0);
            let msg = v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no description");
            Some(SttEvent::Error {
                message: format!(
                    "AssemblyAI reported an error: {code}: {msg}: {}",
                    close_hint(u16::try_from(code).unwrap_or(0))
                ),
                fatal: true,
            })
        }
        _ => None,
    }
}

impl super::kinds::SttKindImpl for AssemblyAiStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    /// The streaming host has no key-check endpoint; AssemblyAI's REST API lists transcripts
    /// for a valid key (401 otherwise).
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(
            client
                .get(rest_key_check_url(cfg.effective_base_url()))
                .header("Authorization", cfg.api_key.expose()),
        )
    }
}

/// AssemblyAI's REST key check for a streaming `base_url`: `wss://streaming.assemblyai.com`
/// → `https://api.assemblyai.com/v2/transcript?limit=1` (EU: `streaming.eu.` → `api.eu.`); any
/// other host (a fake, a proxy) is asked at the same path.
fn rest_key_check_url(base: &str) -> String {
    let base = super::kinds::http_base(base).replace("://streaming.", "://api.");
    format!("{base}/v2/transcript?limit=1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_carries_encoding_model_and_turn_settings() {
        let mut c: SttConfig = toml::from_str(r#"kind = "assemblyai""#).expect("config");
        assert_eq!(
            stream_url(&c).expect("url"),
            "wss://streaming.assemblyai.com/v3/ws?sample_rate=8000&encoding=pcm_mulaw\
             &speech_model=universal-streaming-english&format_turns=true"
        );
        c.eot_threshold = Some(0.6);
        c.eot_timeout_ms = Some(2000);
        c.keyterms = vec!["Patterd".into()];
        let u = stream_url(&c).expect("url");
        assert!(
            u.ends_with(
                "&end_of_turn_confidence_threshold=0.6&max_turn_silence=2000\
                 &keyterms_prompt=%5B%22Patterd%22%5D"
            ),
            "{u}"
        );
    }

    #[test]
    fn turns_map_onto_stt_events() {
        let turn = |end: bool, fmt: bool, t: &str| {
            format!(
                r#"{{"type":"Turn","turn_order":0,"turn_is_formatted":{fmt},"end_of_turn":{end},"transcript":"{t}","end_of_turn_confidence":0.9,"words":[]}}"#
            )
        };
        assert_eq!(
            map_message(&turn(false, false, "hi"), true),
            Some(SttEvent::Interim("hi".into()))
        );
        assert_eq!(map_message(&turn(false, false, ""), true), None);
        // With format_turns, the unformatted end of turn is skipped for the formatted one.
        assert_eq!(map_message(&turn(true, false, "hi there"), true), None);
        assert_eq!(
            map_message(&turn(true, true, "Hi there."), true),
            Some(SttEvent::EndOfTurn("Hi there.".into()))
        );
        assert_eq!(
            map_message(&turn(true, false, "hi there"), false),
            Some(SttEvent::EndOfTurn("hi there".into()))
        );
        assert_eq!(
            map_message(r#"{"type":"SpeechStarted","timestamp":120}"#, true),
            Some(SttEvent::SpeechStarted)
        );
        assert_eq!(
            map_message(r#"{"type":"Begin","id":"s1","expires_at":1}"#, true),
            None
        );
        assert_eq!(
            begin_id(r#"{"type":"Begin","id":"s1"}"#).as_deref(),
            Some("s1")
        );
        assert_eq!(map_message("not json", true), None);
        let Some(SttEvent::Error { message, fatal }) =
            map_message(r#"{"type":"Error","error_code":3005,"error":"boom"}"#, true)
        else {
            panic!("error event");
        };
        assert!(fatal);
        assert!(message.contains("3005: boom"), "{message}");
    }

    #[test]
    fn audio_goes_up_in_100_ms_chunks_and_the_last_is_padded_before_terminate() {
        let mut w = Wire {
            url: String::new(),
            key: String::new(),
            formatted: true,
            pending: BytesMut::new(),
            session_id: "-".into(),
        };
        let mut out = Vec::new();
        for _ in 0..5 {
            w.input(SttInput::Audio(Bytes::from(vec![1u8; 160])), &mut out);
        }
        assert_eq!(
            out,
            vec![Step::Send(Frame::Binary(Bytes::from(vec![1u8; 800])))]
        );
        out.clear();
        // Our `Finalize` (a vetoed end of turn whose hold ran out) ends AssemblyAI's turn.
        w.input(SttInput::Finalize, &mut out);
        assert_eq!(
            out,
            vec![Step::Send(Frame::Text(
                r#"{"type":"ForceEndpoint"}"#.into()
            ))]
        );
        out.clear();
        w.input(SttInput::Audio(Bytes::from(vec![2u8; 160])), &mut out);
        assert!(out.is_empty());
        w.input(SttInput::Close, &mut out);
        let mut last = vec![2u8; 160];
        last.resize(MIN_CHUNK_BYTES, MULAW_SILENCE);
        assert_eq!(
            out,
            vec![
                Step::Close { drain: true },
                Step::Send(Frame::Binary(Bytes::from(last))),
                Step::Send(Frame::Text(r#"{"type":"Terminate"}"#.into())),
            ]
        );
        out.clear();
        w.text(r#"{"type":"Begin","id":"s9"}"#, &mut out);
        assert!(out.is_empty());
        assert_eq!(
            w.lost_message("reset"),
            "AssemblyAI connection lost: reset (session s9)"
        );
    }
}
