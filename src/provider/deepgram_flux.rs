//! Deepgram Flux, turn-based speech-to-text (`/v2/listen`), kind
//! `deepgram_flux`. One WebSocket per call: caller μ-law 8 kHz goes up unchanged as binary
//! frames; `CloseStream` ends it. The model decides the turns: `TurnInfo` events become
//! [`SttEvent`]s — `StartOfTurn` → `SpeechStarted`, `Update` → an interim transcript (barge-in
//! words), `EagerEndOfTurn` → [`SttEvent::EagerEndOfTurn`] (the policy starts the brain
//! speculatively; only sent when `eager_eot_threshold` is set), `TurnResumed` →
//! [`SttEvent::TurnResumed`] (the speculation is dropped unheard), `EndOfTurn` →
//! [`SttEvent::EndOfTurn`]. Our endpointer only listens ([`SttProvider::ends_turns`]), except
//! that the policy may veto an `EndOfTurn` on words that cannot end a sentence and, when its
//! hold runs out while the caller talks, end Flux's turn itself: our `Finalize` is Flux's
//! `ForceEndTurn` (Flux then sends `EndOfTurn` on what it has). Flux has no message that keeps
//! a turn open. An `Error` message or a close other than the answer to our `CloseStream` is a
//! fatal error naming the code, the description and the request id.

use serde_json::Value;

use super::deepgram::{handshake_message, request_id, ws_base};
use super::error::SetupError;
use super::stt_session::{self, Frame, Step, SttWire};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::config::schema::SttConfig;
use crate::net::ws_client::WsConnectError;

pub(crate) struct DeepgramFluxStt {
    cfg: SttConfig,
    url: String,
}

impl DeepgramFluxStt {
    pub(crate) fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        Ok(Self {
            cfg: cfg.clone(),
            url: flux_url(cfg)?,
        })
    }
}

/// The `/v2/listen` URL: model, μ-law 8 kHz, and the turn thresholds that are set.
pub(crate) fn flux_url(cfg: &SttConfig) -> Result<String, SetupError> {
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
        let wire = Wire {
            url: self.url.clone(),
            auth: format!("Token {}", self.cfg.api_key.expose()),
            request_id: "-".into(),
        };
        stt_session::open(wire, &ctx.call_id)
    }
}

/// Flux's framing: audio as binary frames, `Finalize` as `ForceEndTurn`, `CloseStream`
/// (drained); `TurnInfo` through [`map_message`].
struct Wire {
    url: String,
    auth: String,
    request_id: String,
}

impl SttWire for Wire {
    const NAME: &'static str = "Deepgram Flux";

    fn url(&self) -> &str {
        &self.url
    }
    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![("Authorization", self.auth.clone())]
    }
    fn handshake_message(&self, e: &WsConnectError) -> String {
        format!("Deepgram Flux: {}", handshake_message(e))
    }
    fn connected(&mut self, headers: &http::HeaderMap) {
        self.request_id = request_id(headers);
    }
    fn input(&mut self, input: SttInput, out: &mut Vec<Step>) {
        match input {
            SttInput::Audio(b) if !b.is_empty() => out.push(Step::Send(Frame::Binary(b))),
            SttInput::Audio(_) => {}
            SttInput::Finalize => {
                out.push(Step::Send(Frame::Text(r#"{"type":"ForceEndTurn"}"#.into())));
            }
            SttInput::Close => {
                out.push(Step::Close { drain: true });
                out.push(Step::Send(Frame::Text(r#"{"type":"CloseStream"}"#.into())));
            }
        }
    }
    fn text(&mut self, text: &str, out: &mut Vec<Step>) {
        out.extend(map_message(text).map(Step::Event));
    }
    fn close_message(&self, code: u16, reason: &str) -> String {
        format!(
            "Deepgram Flux closed the stream: {code} {reason} (dg-request-id {})",
            self.request_id
        )
    }
    fn lost_message(&self, error: &str) -> String {
        format!(
            "Deepgram Flux connection lost: {error} (dg-request-id {})",
            self.request_id
        )
    }
    fn log_id(&self) -> &str {
        &self.request_id
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
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(super::deepgram::credential_check(cfg, client))
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
    fn finalize_is_force_end_turn() {
        let mut w = Wire {
            url: String::new(),
            auth: String::new(),
            request_id: "-".into(),
        };
        let mut out = Vec::new();
        w.input(SttInput::Finalize, &mut out);
        assert_eq!(
            out,
            vec![Step::Send(Frame::Text(r#"{"type":"ForceEndTurn"}"#.into()))]
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
