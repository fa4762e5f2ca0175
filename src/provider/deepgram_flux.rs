//! Deepgram Flux, turn-based speech-to-text (`/v2/listen`, providers.md §2.7), kind
//! `deepgram_flux`. One WebSocket per call: caller μ-law 8 kHz goes up unchanged as binary
//! frames; `CloseStream` ends it. The model decides the turns: `TurnInfo` events become
//! [`SttEvent`]s — `StartOfTurn` → `SpeechStarted`, `Update` → an interim transcript (barge-in
//! words), `EagerEndOfTurn` → [`SttEvent::EagerEndOfTurn`] (the policy starts the brain
//! speculatively; only sent when `eager_eot_threshold` is set), `TurnResumed` →
//! [`SttEvent::TurnResumed`] (the speculation is dropped unheard), `EndOfTurn` →
//! [`SttEvent::EndOfTurn`]. Our endpointer only listens ([`SttProvider::ends_turns`]). Flux has
//! no `Finalize`, so ours is not sent. An `Error` message or a close other than the answer to
//! our `CloseStream` is a fatal error naming the code, the description and the request id.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::deepgram::{handshake_message, ws_base};
use super::error::SetupError;
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client;
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const INPUT_QUEUE: usize = 1024;

pub struct DeepgramFluxStt {
    cfg: SttConfig,
    url: String,
}

impl DeepgramFluxStt {
    pub fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        Ok(Self {
            cfg: cfg.clone(),
            url: flux_url(cfg)?,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// The `/v2/listen` URL: model, μ-law 8 kHz, and the turn thresholds that are set.
pub fn flux_url(cfg: &SttConfig) -> Result<String, SetupError> {
    let base = ws_base(cfg)?;
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("model", cfg.effective_model())
        .append_pair("encoding", "mulaw")
        .append_pair("sample_rate", "8000");
    if let Some(t) = cfg.eot_threshold {
        q.append_pair("eot_threshold", &t.to_string());
    }
    if let Some(t) = cfg.eager_eot_threshold {
        q.append_pair("eager_eot_threshold", &t.to_string());
    }
    if let Some(t) = cfg.eot_timeout_ms {
        q.append_pair("eot_timeout_ms", &t.to_string());
    }
    for k in &cfg.keyterms {
        q.append_pair("keyterm", k);
    }
    Ok(format!("{base}/v2/listen?{}", q.finish()))
}

impl SttProvider for DeepgramFluxStt {
    fn ends_turns(&self) -> bool {
        true
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(256);
        let url = self.url.clone();
        let auth = format!("Token {}", self.cfg.api_key.expose());
        let call_id = ctx.call_id.clone();
        let task = tokio::spawn(async move {
            run(&url, &auth, &call_id, in_rx, &ev_tx).await;
            let _ = ev_tx.send(SttEvent::Closed).await;
        });
        SttStream {
            input: in_tx,
            events: ev_rx,
            guard: TaskGuard::new(task),
        }
    }
}

async fn run(
    url: &str,
    auth: &str,
    call_id: &str,
    mut input: mpsc::Receiver<SttInput>,
    ev: &mpsc::Sender<SttEvent>,
) {
    let fail = |message: String| SttEvent::Error {
        message,
        fatal: true,
    };
    let (ws, headers) =
        match ws_client::connect(url, &[("Authorization", auth)], CONNECT_TIMEOUT).await {
            Ok(x) => x,
            Err(e) => {
                let message = format!("Deepgram Flux: {}", handshake_message(&e));
                tracing::warn!(call = %call_id, error = %message, "Deepgram Flux connect failed");
                let _ = ev.send(fail(message)).await;
                return;
            }
        };
    let request_id = headers
        .get("dg-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    if ev.send(SttEvent::Connected).await.is_err() {
        return;
    }
    let (mut incoming, sender, _reader) = ws_pump::split(ws);
    let mut closing: Option<Instant> = None;
    loop {
        let drain_at = closing.unwrap_or_else(Instant::now) + DRAIN_TIMEOUT;
        tokio::select! {
            msg = input.recv(), if closing.is_none() => {
                let res = match msg {
                    Some(SttInput::Audio(b)) if !b.is_empty() => sender.binary(&b).await,
                    Some(SttInput::Audio(_)) | Some(SttInput::Finalize) => continue,
                    Some(SttInput::Close) | None => {
                        closing = Some(Instant::now());
                        sender.text(r#"{"type":"CloseStream"}"#).await
                    }
                };
                if let Err(e) = res {
                    let _ = ev.send(fail(format!("Deepgram Flux send failed: {e}"))).await;
                    return;
                }
            }
            _ = tokio::time::sleep_until(drain_at), if closing.is_some() => {
                let _ = sender.close(1000, "").await;
                return;
            }
            msg = incoming.recv() => match msg {
                Some(WsIn::Text(t)) => {
                    if let Some(e) = map_message(&t)
                        && ev.send(e).await.is_err()
                    {
                        return;
                    }
                }
                Some(WsIn::Binary(_)) => {}
                Some(WsIn::Close { code, reason }) => {
                    let code = code.unwrap_or(1005);
                    tracing::info!(call = %call_id, code, reason = %reason, request_id = %request_id, "Deepgram Flux closed the stream");
                    if code != 1000 || closing.is_none() {
                        let _ = ev.send(fail(format!(
                            "Deepgram Flux closed the stream: {code} {reason} (dg-request-id {request_id})"
                        ))).await;
                    }
                    return;
                }
                Some(WsIn::Failed(e)) => {
                    if closing.is_none() {
                        let _ = ev.send(fail(format!(
                            "Deepgram Flux connection lost: {e} (dg-request-id {request_id})"
                        ))).await;
                    }
                    return;
                }
                None => return,
            }
        }
    }
}

/// Maps one server text frame onto an event (none for `Connected`, configure answers and
/// unknown types). Public for the parser tests.
pub fn map_message(text: &str) -> Option<SttEvent> {
    let v: Value = serde_json::from_str(text).ok()?;
    let transcript = || {
        v.get("transcript")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string()
    };
    match v.get("type").and_then(Value::as_str)? {
        "TurnInfo" => match v.get("event").and_then(Value::as_str)? {
            "StartOfTurn" => Some(SttEvent::SpeechStarted),
            "Update" => {
                let t = transcript();
                (!t.is_empty()).then_some(SttEvent::Interim(t))
            }
            "EagerEndOfTurn" => Some(SttEvent::EagerEndOfTurn(transcript())),
            "TurnResumed" => Some(SttEvent::TurnResumed),
            "EndOfTurn" => Some(SttEvent::EndOfTurn(transcript())),
            _ => None,
        },
        "Error" => {
            let code = v.get("code").and_then(Value::as_str).unwrap_or("UNKNOWN");
            let desc = v
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("no description");
            Some(SttEvent::Error {
                message: format!("Deepgram Flux reported an error: {code}: {desc}"),
                fatal: true,
            })
        }
        _ => None,
    }
}

impl super::kinds::SttKindImpl for DeepgramFluxStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    fn credential_check(cfg: &SttConfig, client: &reqwest::Client) -> reqwest::RequestBuilder {
        super::deepgram::credential_check(cfg, client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_carries_model_encoding_and_thresholds() {
        let mut c: SttConfig = toml::from_str(r#"kind = "deepgram_flux""#).expect("config");
        assert_eq!(
            flux_url(&c).expect("url"),
            "wss://api.deepgram.com/v2/listen?model=flux-general-en&encoding=mulaw&sample_rate=8000"
        );
        c.eager_eot_threshold = Some(0.4);
        c.eot_threshold = Some(0.7);
        c.eot_timeout_ms = Some(3000);
        let u = flux_url(&c).expect("url");
        assert!(
            u.ends_with("&eot_threshold=0.7&eager_eot_threshold=0.4&eot_timeout_ms=3000"),
            "{u}"
        );
    }

    #[test]
    fn turn_events_map_onto_stt_events() {
        let ti = |e: &str, t: &str| {
            map_message(&format!(
                r#"{{"type":"TurnInfo","event":"{e}","turn_index":0,"transcript":"{t}","end_of_turn_confidence":0.8}}"#
            ))
        };
        assert_eq!(ti("StartOfTurn", ""), Some(SttEvent::SpeechStarted));
        assert_eq!(ti("Update", "hi"), Some(SttEvent::Interim("hi".into())));
        assert_eq!(ti("Update", ""), None);
        assert_eq!(
            ti("EagerEndOfTurn", "hi there"),
            Some(SttEvent::EagerEndOfTurn("hi there".into()))
        );
        assert_eq!(ti("TurnResumed", "hi"), Some(SttEvent::TurnResumed));
        assert_eq!(
            ti("EndOfTurn", "hi there"),
            Some(SttEvent::EndOfTurn("hi there".into()))
        );
        assert_eq!(
            map_message(r#"{"type":"Connected","request_id":"x","sequence_id":0}"#),
            None
        );
        assert_eq!(map_message("not json"), None);
        let Some(SttEvent::Error { message, fatal }) = map_message(
            r#"{"type":"Error","sequence_id":3,"code":"INTERNAL_SERVER_ERROR","description":"boom"}"#,
        ) else {
            panic!("error event");
        };
        assert!(fatal);
        assert!(message.contains("INTERNAL_SERVER_ERROR: boom"), "{message}");
    }
}
