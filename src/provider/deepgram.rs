//! Deepgram live speech-to-text, v1 (`/v1/listen`). One WebSocket per call:
//! caller μ-law 8 kHz goes up as binary frames unchanged (never an empty one), control goes as
//! JSON text (`Finalize`, `CloseStream`, and `KeepAlive` whenever no audio went up for
//! `keepalive_ms`, 3 s by default, because Deepgram closes idle sockets after 10 s), run by the
//! shared session loop (`stt_session`). Server `Results` become interim or final transcripts, `SpeechStarted` and
//! `UtteranceEnd` pass through, `Metadata` is ignored. Handshake failures (HTTP 401 etc.) are
//! fatal errors saying what to check; close codes are logged with their reason (`NET-0001`,
//! `DATA-0000`) and the `dg-request-id` of the handshake. Dropping the stream closes it.

use std::time::Duration;

use serde_json::Value;

use super::error::SetupError;
use super::stt_session::{self, Frame, Step, SttWire};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::WsConnectError;

pub struct DeepgramStt {
    cfg: SttConfig,
    url: String,
}

impl DeepgramStt {
    pub fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        Ok(Self {
            cfg: cfg.clone(),
            url: listen_url(cfg)?,
        })
    }

    /// The full `/v1/listen` URL this provider connects to.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Builds the listen URL from the configuration.
pub(crate) fn listen_url(cfg: &SttConfig) -> Result<String, SetupError> {
    let base = ws_base(cfg)?;
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("model", cfg.effective_model())
        .append_pair("encoding", "mulaw")
        .append_pair("sample_rate", "8000")
        .append_pair("channels", "1")
        .append_pair("interim_results", "true")
        .append_pair("endpointing", &cfg.endpointing_ms.to_string());
    if cfg.utterance_end_ms > 0 {
        q.append_pair("utterance_end_ms", &cfg.utterance_end_ms.to_string());
    }
    q.append_pair("vad_events", "true")
        .append_pair(
            "smart_format",
            if cfg.smart_format { "true" } else { "false" },
        )
        .append_pair("language", &cfg.language);
    for k in &cfg.keyterms {
        q.append_pair("keyterm", k);
    }
    Ok(format!("{base}/v1/listen?{}", q.finish()))
}

/// `base_url` as a WebSocket root (`https` → `wss`, `http` → `ws`), without a trailing `/`.
pub fn ws_base(cfg: &SttConfig) -> Result<String, SetupError> {
    let base = cfg.effective_base_url().trim().trim_end_matches('/');
    if let Some(rest) = base.strip_prefix("https://") {
        Ok(format!("wss://{rest}"))
    } else if let Some(rest) = base.strip_prefix("http://") {
        Ok(format!("ws://{rest}"))
    } else if base.starts_with("wss://") || base.starts_with("ws://") {
        Ok(base.to_string())
    } else {
        Err(SetupError::SttBaseUrl(cfg.effective_base_url().to_string()))
    }
}

impl SttProvider for DeepgramStt {
    fn endpointing_ms(&self) -> u64 {
        u64::from(self.cfg.endpointing_ms)
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let wire = Wire {
            url: self.url.clone(),
            auth: format!("Token {}", self.cfg.api_key.expose()),
            keepalive: Duration::from_millis(self.cfg.keepalive_ms.max(100)),
            request_id: "-".into(),
        };
        stt_session::open(wire, &ctx.call_id)
    }
}

/// Deepgram v1's framing: audio as binary frames (never an empty one), `Finalize`,
/// `CloseStream` (drained), `KeepAlive`; `Results` and the rest through [`map_message`].
struct Wire {
    url: String,
    auth: String,
    keepalive: Duration,
    request_id: String,
}

/// The `dg-request-id` of a handshake's response, `-` without one.
pub(crate) fn request_id(headers: &http::HeaderMap) -> String {
    headers
        .get("dg-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

impl SttWire for Wire {
    const NAME: &'static str = "Deepgram";

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
        self.request_id = request_id(headers);
    }
    fn keepalive(&self) -> Option<(Duration, &'static str)> {
        Some((self.keepalive, r#"{"type":"KeepAlive"}"#))
    }
    fn input(&mut self, input: SttInput, out: &mut Vec<Step>) {
        match input {
            SttInput::Audio(b) if b.is_empty() => {}
            SttInput::Audio(b) => out.push(Step::Send(Frame::Binary(b))),
            SttInput::Finalize => {
                out.push(Step::Send(Frame::Text(r#"{"type":"Finalize"}"#.into())))
            }
            SttInput::Close => {
                out.push(Step::Close { drain: true });
                out.push(Step::Send(Frame::Text(r#"{"type":"CloseStream"}"#.into())));
            }
        }
    }
    fn text(&mut self, text: &str, out: &mut Vec<Step>) {
        out.extend(map_message(text).into_iter().map(Step::Event));
    }
    fn close_message(&self, code: u16, reason: &str) -> String {
        format!(
            "Deepgram closed the stream: {code} {reason} (dg-request-id {})",
            self.request_id
        )
    }
    fn lost_message(&self, error: &str) -> String {
        format!(
            "Deepgram connection lost: {error} (dg-request-id {})",
            self.request_id
        )
    }
    fn log_id(&self) -> &str {
        &self.request_id
    }
}

/// A fatal handshake error, saying what to check.
pub(crate) fn handshake_message(e: &WsConnectError) -> String {
    let text = e.to_string();
    let hint = match e.status() {
        Some(401) => "Deepgram rejected the API key (HTTP 401): check [stt] api_key",
        Some(400) => {
            "Deepgram rejected the request (HTTP 400): check [stt] model, language and keyterms"
        }
        Some(402) | Some(403) => {
            "Deepgram refused the request (payment or permission): check the Deepgram plan and key scope"
        }
        Some(429) => {
            "Deepgram is rate limiting (HTTP 429): too many concurrent streams for the plan"
        }
        Some(s) if s >= 500 => "Deepgram had a server error; try again",
        _ => match e {
            WsConnectError::Timeout(..) => {
                "Deepgram did not answer in time: check network access and [stt] base_url"
            }
            WsConnectError::Connect(..) => {
                "could not reach Deepgram: check network access and [stt] base_url"
            }
            WsConnectError::Tls(..) => {
                "TLS to Deepgram failed: check [stt] base_url and the system clock"
            }
            WsConnectError::BadUrl(..) => "the Deepgram URL is invalid: check [stt] base_url",
            WsConnectError::Refused { .. } | WsConnectError::Handshake { .. } => {
                "the Deepgram WebSocket handshake failed"
            }
        },
    };
    format!("{hint} ({text})")
}

/// Maps one server text frame onto events (usually one; none for `Metadata` and unknowns).
/// Public for the parser property tests (`tests/parsers.rs`).
pub fn map_message(text: &str) -> Vec<SttEvent> {
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => {
            tracing::debug!("ignoring a Deepgram frame that is not JSON");
            return Vec::new();
        }
    };
    let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    match v.get("type").and_then(Value::as_str).unwrap_or("") {
        "Results" => {
            let text = v
                .pointer("/channel/alternatives/0/transcript")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_string();
            if flag("is_final") {
                vec![SttEvent::Final {
                    text,
                    speech_final: flag("speech_final"),
                    from_finalize: flag("from_finalize"),
                }]
            } else if text.is_empty() {
                Vec::new()
            } else {
                vec![SttEvent::Interim(text)]
            }
        }
        "SpeechStarted" => vec![SttEvent::SpeechStarted],
        "UtteranceEnd" => vec![SttEvent::UtteranceEnd],
        "Metadata" => Vec::new(),
        "Error" => {
            let msg = ["description", "message", "err_msg"]
                .iter()
                .find_map(|k| v.get(*k).and_then(Value::as_str))
                .unwrap_or("unknown error");
            vec![SttEvent::Error {
                message: format!("Deepgram error: {msg}"),
                fatal: false,
            }]
        }
        other => {
            tracing::debug!(kind = other, "ignoring a Deepgram message");
            Vec::new()
        }
    }
}

impl super::kinds::SttKindImpl for DeepgramStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(credential_check(cfg, client))
    }
}

/// Deepgram's key check (v1 and Flux): `GET /v1/projects` with `Token`.
pub(crate) fn credential_check(
    cfg: &SttConfig,
    client: &reqwest::Client,
) -> reqwest::RequestBuilder {
    let base = super::kinds::http_base(cfg.effective_base_url());
    client
        .get(format!("{base}/v1/projects"))
        .header("Authorization", format!("Token {}", cfg.api_key.expose()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(base: &str) -> SttConfig {
        let mut c: SttConfig = toml::from_str("kind = \"deepgram\"").expect("config");
        c.base_url = base.into();
        c
    }

    #[test]
    fn url_schemes_and_query() {
        let mut c = cfg("https://dg.example/");
        c.keyterms = vec!["Patter".into(), "Acme Inc".into()];
        let u = listen_url(&c).expect("url");
        assert!(u.starts_with("wss://dg.example/v1/listen?model=nova-3&encoding=mulaw&sample_rate=8000&channels=1&interim_results=true&endpointing=300&utterance_end_ms=1000&vad_events=true&smart_format=true&language=en"), "{u}");
        assert!(u.ends_with("&keyterm=Patter&keyterm=Acme+Inc"), "{u}");
        assert!(
            listen_url(&cfg("http://127.0.0.1:1"))
                .expect("url")
                .starts_with("ws://127.0.0.1:1/v1/listen?")
        );
        assert!(
            listen_url(&cfg("ws://h"))
                .expect("url")
                .starts_with("ws://h/v1/listen?")
        );
        assert!(
            listen_url(&cfg("wss://h"))
                .expect("url")
                .starts_with("wss://h/v1/listen?")
        );
        assert!(listen_url(&cfg("ftp://h")).is_err());
    }

    #[test]
    fn results_mapping() {
        let r = r#"{"type":"Results","is_final":true,"speech_final":true,"channel":{"alternatives":[{"transcript":"hi there"}]}}"#;
        assert_eq!(
            map_message(r),
            vec![SttEvent::Final {
                text: "hi there".into(),
                speech_final: true,
                from_finalize: false
            }]
        );
        let r = r#"{"type":"Results","is_final":false,"channel":{"alternatives":[{"transcript":"hi"}]}}"#;
        assert_eq!(map_message(r), vec![SttEvent::Interim("hi".into())]);
        let r = r#"{"type":"Results","channel":{"alternatives":[]}}"#;
        assert_eq!(map_message(r), vec![]);
        let r = r#"{"type":"Results","is_final":true,"from_finalize":true,"channel":{"alternatives":[{"transcript":""}]}}"#;
        assert_eq!(
            map_message(r),
            vec![SttEvent::Final {
                text: "".into(),
                speech_final: false,
                from_finalize: true
            }]
        );
        assert_eq!(
            map_message(r#"{"type":"UtteranceEnd","last_word_end":1.0}"#),
            vec![SttEvent::UtteranceEnd]
        );
        assert_eq!(
            map_message(r#"{"type":"SpeechStarted"}"#),
            vec![SttEvent::SpeechStarted]
        );
        assert_eq!(map_message(r#"{"type":"Metadata"}"#), vec![]);
        assert_eq!(map_message("garbage"), vec![]);
        assert_eq!(map_message("[1]"), vec![]);
    }
}
