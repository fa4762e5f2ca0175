//! Deepgram live speech-to-text, v1 (`/v1/listen`, providers.md §2). One WebSocket per call:
//! caller μ-law 8 kHz goes up as binary frames unchanged (never an empty one), control goes as
//! JSON text (`Finalize`, `CloseStream`, and `KeepAlive` whenever no audio went up for
//! `keepalive_ms`, 3 s by default, because Deepgram closes idle sockets after 10 s). `open()`
//! returns at once; the task connects (10 s budget) while audio waits in the bounded input
//! channel. Server `Results` become interim or final transcripts, `SpeechStarted` and
//! `UtteranceEnd` pass through, `Metadata` is ignored. Handshake failures (HTTP 401 etc.) are
//! fatal errors saying what to check; close codes are logged with their reason (`NET-0001`,
//! `DATA-0000`) and the `dg-request-id` of the handshake. Dropping the stream closes it.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::SetupError;
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::{self, WsConnectError};
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After `CloseStream`, how long to wait for the server's last results and close.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Input queue: about 20 s of 20 ms carrier frames, enough to cover the connect.
const INPUT_QUEUE: usize = 1024;

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
pub fn listen_url(cfg: &SttConfig) -> Result<String, SetupError> {
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
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(256);
        let session = Session {
            url: self.url.clone(),
            auth: format!("Token {}", self.cfg.api_key.expose()),
            keepalive: Duration::from_millis(self.cfg.keepalive_ms.max(100)),
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

struct Session {
    url: String,
    auth: String,
    keepalive: Duration,
    call_id: String,
}

impl Session {
    async fn run(self, mut input: mpsc::Receiver<SttInput>, ev: &mpsc::Sender<SttEvent>) {
        let headers = [("Authorization", self.auth.as_str())];
        let (ws, resp_headers) = match ws_client::connect(&self.url, &headers, CONNECT_TIMEOUT)
            .await
        {
            Ok(x) => x,
            Err(e) => {
                let message = handshake_message(&e);
                tracing::warn!(call = %self.call_id, error = %message, "Deepgram connect failed");
                let _ = ev
                    .send(SttEvent::Error {
                        message,
                        fatal: true,
                    })
                    .await;
                return;
            }
        };
        let request_id = resp_headers
            .get("dg-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        tracing::debug!(call = %self.call_id, request_id = %request_id, "Deepgram connected");
        if ev.send(SttEvent::Connected).await.is_err() {
            return;
        }
        let (mut incoming, sender, _reader) = ws_pump::split(ws);
        let mut last_audio = Instant::now();
        let mut closing: Option<Instant> = None;
        let fail = |message: String| SttEvent::Error {
            message,
            fatal: true,
        };
        loop {
            let keepalive_at = last_audio + self.keepalive;
            let drain_at = closing.unwrap_or_else(Instant::now) + DRAIN_TIMEOUT;
            tokio::select! {
                msg = input.recv(), if closing.is_none() => {
                    let res = match msg {
                        Some(SttInput::Audio(b)) => {
                            if b.is_empty() {
                                continue;
                            }
                            last_audio = Instant::now();
                            sender.binary(&b).await
                        }
                        Some(SttInput::Finalize) => sender.text(r#"{"type":"Finalize"}"#).await,
                        Some(SttInput::Close) | None => {
                            closing = Some(Instant::now());
                            sender.text(r#"{"type":"CloseStream"}"#).await
                        }
                    };
                    if let Err(e) = res {
                        let _ = ev.send(fail(format!("Deepgram send failed: {e}"))).await;
                        return;
                    }
                }
                _ = tokio::time::sleep_until(keepalive_at), if closing.is_none() => {
                    last_audio = Instant::now();
                    if let Err(e) = sender.text(r#"{"type":"KeepAlive"}"#).await {
                        let _ = ev.send(fail(format!("Deepgram send failed: {e}"))).await;
                        return;
                    }
                }
                _ = tokio::time::sleep_until(drain_at), if closing.is_some() => {
                    tracing::debug!(call = %self.call_id, request_id = %request_id, "Deepgram did not close in time after CloseStream");
                    let _ = sender.close(1000, "").await;
                    return;
                }
                msg = incoming.recv() => {
                    match msg {
                        Some(WsIn::Text(t)) => {
                            for e in map_message(&t) {
                                if ev.send(e).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Some(WsIn::Binary(_)) => {}
                        Some(WsIn::Close { code, reason }) => {
                            let code = code.unwrap_or(1005);
                            tracing::info!(call = %self.call_id, code, reason = %reason, request_id = %request_id, "Deepgram closed the stream");
                            if code != 1000 || closing.is_none() {
                                let _ = ev.send(fail(format!(
                                    "Deepgram closed the stream: {code} {reason} (dg-request-id {request_id})"
                                ))).await;
                            }
                            return;
                        }
                        Some(WsIn::Failed(e)) => {
                            tracing::info!(call = %self.call_id, error = %e, request_id = %request_id, "Deepgram connection ended");
                            if closing.is_none() {
                                let _ = ev.send(fail(format!(
                                    "Deepgram connection lost: {e} (dg-request-id {request_id})"
                                ))).await;
                            }
                            return;
                        }
                        None => return,
                    }
                }
            }
        }
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
    fn credential_check(cfg: &SttConfig, client: &reqwest::Client) -> reqwest::RequestBuilder {
        credential_check(cfg, client)
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
