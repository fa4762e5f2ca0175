//! Telnyx Call Control REST commands patterd issues: `dial` (`POST
//! /v2/calls`, outbound calls), `answer`, `streaming_start` (bidirectional RTP, PCMU 8 kHz,
//! inbound track only), `reject` and `hangup`,
//! as `POST {api_base_url}/v2/calls/{call_control_id}/actions/{command}` with a Bearer API key
//! and JSON bodies shaped exactly like the official SDK's (`rest_requests.json`). A command on a
//! call that has already ended (HTTP 422, error code 90018) counts as done for `hangup`.

use serde_json::{Value, json};

use crate::carrier::CarrierError;
use crate::carrier::rest_client::{build_client, path_safe, send_error};
use super::Config;
use crate::carrier::AccountConfig;

/// How long a transfer's destination rings (`timeout_secs`, 5–600).
pub(crate) const TRANSFER_RING_S: u32 = 30;
/// Tone length per DTMF digit (`duration_millis`, 100–500).
pub(crate) const DTMF_DURATION_MS: u32 = 250;

/// A fresh `command_id` suffix: Telnyx de-duplicates commands by id per call, and two
/// transfers or digit strings asked for in one call are two commands.
fn next_command() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

const CARRIER: &str = "Telnyx";
/// Telnyx's public API root (the `/v2` is appended).
pub(crate) const DEFAULT_API_BASE: &str = "https://api.telnyx.com";
/// `client_state` of the calls patterd dials: base64 of `outbound`.
pub(crate) const OUTBOUND_CLIENT_STATE: &str = "b3V0Ym91bmQ=";
/// Telnyx's error code for "Call has already ended".
pub(crate) const ALREADY_ENDED: &str = "90018";

/// The media stream patterd asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamParams {
    /// `wss://…/telnyx/media/{token}`.
    pub stream_url: String,
    /// Sent back by Telnyx as `x-telnyx-streaming-auth-token` (optional second factor).
    pub stream_auth_token: Option<String>,
    /// Delivered in the socket's `start.custom_parameters`.
    pub custom_parameters: Vec<(String, String)>,
}

fn stream_fields(m: &mut serde_json::Map<String, Value>, stream_url: &str) {
    m.insert("stream_url".into(), json!(stream_url));
    m.insert("stream_track".into(), json!("inbound_track"));
    m.insert("stream_codec".into(), json!("PCMU"));
    m.insert("stream_bidirectional_mode".into(), json!("rtp"));
    m.insert("stream_bidirectional_codec".into(), json!("PCMU"));
    m.insert("stream_bidirectional_target_legs".into(), json!("self"));
}

/// Body of `actions/answer`; with `stream_url` the stream starts with the answer.
pub fn answer_body(
    command_id: &str,
    client_state: Option<&str>,
    stream_url: Option<&str>,
) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("command_id".into(), json!(command_id));
    if let Some(cs) = client_state {
        m.insert("client_state".into(), json!(cs));
    }
    if let Some(url) = stream_url {
        stream_fields(&mut m, url);
    }
    Value::Object(m)
}

/// Body of `actions/streaming_start`: bidirectional RTP, PCMU both ways at 8 kHz.
pub fn streaming_start_body(command_id: &str, p: &StreamParams) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("command_id".into(), json!(command_id));
    stream_fields(&mut m, &p.stream_url);
    m.insert("stream_bidirectional_sampling_rate".into(), json!(8000));
    if let Some(t) = &p.stream_auth_token {
        m.insert("stream_auth_token".into(), json!(t));
    }
    if !p.custom_parameters.is_empty() {
        let params: Vec<Value> = p
            .custom_parameters
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        m.insert("custom_parameters".into(), Value::Array(params));
    }
    Value::Object(m)
}

/// An outbound call to place (`POST /v2/calls`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dial {
    pub connection_id: String,
    /// E.164 with `+`.
    pub from: String,
    pub to: String,
    /// Where this call's webhooks go (`…/telnyx/webhook`).
    pub webhook_url: String,
    /// Base64, echoed in the call's webhooks.
    pub client_state: Option<String>,
    pub timeout_secs: Option<u32>,
    /// `detect` asks for `call.machine.detection.ended`.
    pub answering_machine_detection: Option<String>,
    /// Stream from the answer on; patterd leaves it empty and calls `streaming_start` on
    /// `call.answered`, because the media token is bound to the `call_control_id` that only
    /// exists once the dial has returned.
    pub stream_url: Option<String>,
}

/// Body of `POST /v2/calls`, with the fields the SDK's `calls.dial` sends.
pub fn dial_body(d: &Dial) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("connection_id".into(), json!(d.connection_id));
    m.insert("from".into(), json!(d.from));
    m.insert("to".into(), json!(d.to));
    if let Some(a) = &d.answering_machine_detection {
        m.insert("answering_machine_detection".into(), json!(a));
    }
    if let Some(cs) = &d.client_state {
        m.insert("client_state".into(), json!(cs));
    }
    if let Some(url) = &d.stream_url {
        m.insert("stream_bidirectional_codec".into(), json!("PCMU"));
        m.insert("stream_bidirectional_mode".into(), json!("rtp"));
        m.insert("stream_track".into(), json!("inbound_track"));
        m.insert("stream_url".into(), json!(url));
    }
    if let Some(t) = d.timeout_secs {
        m.insert("timeout_secs".into(), json!(t));
    }
    m.insert("webhook_url".into(), json!(d.webhook_url));
    Value::Object(m)
}

/// Client for Telnyx's Call Control commands.
#[derive(Clone)]
pub(crate) struct TelnyxRest {
    pub client: reqwest::Client,
    /// API root without trailing slash and without `/v2`.
    pub base: String,
    api_key: String,
}

impl std::fmt::Debug for TelnyxRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelnyxRest")
            .field("base", &self.base)
            .field("api_key", &"***")
            .finish()
    }
}

impl TelnyxRest {
    pub(crate) fn new(base: &str, api_key: &str) -> Result<Self, CarrierError> {
        if api_key.trim().is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: "api_key must be set".into(),
            });
        }
        Ok(Self {
            client: build_client(CARRIER)?,
            base: base.trim_end_matches('/').to_string(),
            api_key: api_key.trim().to_string(),
        })
    }

    /// The `Authorization` header value.
    pub(crate) fn authorization(&self) -> String {
        format!("Bearer {}", self.api_key)
    }

    /// From a `[carriers.*]` entry of kind telnyx.
    pub(crate) fn from_config(cfg: &Config) -> Result<Self, CarrierError> {
        Self::new(cfg.api_base(), cfg.api_key.expose())
    }

    /// `POST /v2/calls/{id}/actions/{action}` with `body`.
    pub(crate) async fn command(
        &self,
        call_control_id: &str,
        action: &str,
        body: &Value,
    ) -> Result<Value, CarrierError> {
        if !path_safe(call_control_id) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", call_control_id.escape_default()),
            });
        }
        let url = format!("{}/v2/calls/{call_control_id}/actions/{action}", self.base);
        self.post(&url, call_control_id, body).await
    }

    /// Places an outbound call; returns its `call_control_id`.
    pub(crate) async fn dial(&self, d: &Dial) -> Result<String, CarrierError> {
        let url = format!("{}/v2/calls", self.base);
        let v = self.post(&url, "(dial)", &dial_body(d)).await?;
        v.get("data")
            .and_then(|d| d.get("call_control_id"))
            .and_then(Value::as_str)
            .filter(|id| path_safe(id))
            .map(str::to_string)
            .ok_or_else(|| CarrierError::Http {
                carrier: CARRIER,
                status: 200,
                message: "the dial response has no usable data.call_control_id".into(),
            })
    }

    async fn post(
        &self,
        url: &str,
        call_control_id: &str,
        body: &Value,
    ) -> Result<Value, CarrierError> {
        self.post_raw(url, &format!("call {call_control_id}"), body.to_string())
            .await
    }

    /// `POST url` with a JSON body already serialised; `what` names the resource in a 404.
    pub(crate) async fn post_raw(
        &self,
        url: &str,
        what: &str,
        body: String,
    ) -> Result<Value, CarrierError> {
        let req = self
            .client
            .post(url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .body(body);
        self.send(req, url, what).await
    }

    /// `GET url` (its query already encoded), answered with JSON.
    pub(crate) async fn get(&self, url: &str, what: &str) -> Result<Value, CarrierError> {
        let req = self
            .client
            .get(url)
            .header("Authorization", self.authorization())
            .header("Accept", "application/json");
        self.send(req, url, what).await
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
        what: &str,
    ) -> Result<Value, CarrierError> {
        let resp = req
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match status {
            200..=299 => Ok(v),
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            404 => Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: what.to_string(),
            }),
            _ => {
                let first = v.get("errors").and_then(|e| e.get(0));
                let code = first
                    .and_then(|e| e.get("code"))
                    .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string));
                let detail = first
                    .and_then(|e| e.get("detail").or_else(|| e.get("title")))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| text.chars().take(200).collect());
                Err(CarrierError::Http {
                    carrier: CARRIER,
                    status,
                    message: match code {
                        Some(c) => format!("{detail} (Telnyx error {c})"),
                        None => detail,
                    },
                })
            }
        }
    }

    /// Answers a parked call, optionally starting the stream with it; with `webhook_url`, the call's later events go there (the
    /// instance that owns the call) instead of the application's URL.
    pub(crate) async fn answer(
        &self,
        call_control_id: &str,
        command_id: &str,
        stream_url: Option<&str>,
        webhook_url: Option<&str>,
    ) -> Result<(), CarrierError> {
        let mut body = answer_body(command_id, None, stream_url);
        if let (Some(url), Some(m)) = (webhook_url, body.as_object_mut()) {
            m.insert("webhook_url".into(), json!(url));
        }
        self.command(call_control_id, "answer", &body)
            .await
            .map(|_| ())
    }

    /// Starts the bidirectional media stream on an answered call.
    pub(crate) async fn streaming_start(
        &self,
        call_control_id: &str,
        command_id: &str,
        p: &StreamParams,
    ) -> Result<(), CarrierError> {
        let body = streaming_start_body(command_id, p);
        self.command(call_control_id, "streaming_start", &body)
            .await
            .map(|_| ())
    }

    /// Refuses a parked call without answering it; `cause` is `CALL_REJECTED` or `USER_BUSY`.
    pub(crate) async fn reject(&self, call_control_id: &str, cause: &str) -> Result<(), CarrierError> {
        let body = json!({"cause": cause, "command_id": format!("reject-{call_control_id}")});
        self.command(call_control_id, "reject", &body)
            .await
            .map(|_| ())
    }

    /// Cold-transfers a live call: `actions/transfer` with the
    /// destination, our caller id and a ring timeout.
    pub(crate) async fn transfer(
        &self,
        call_control_id: &str,
        to: &str,
        from: &str,
    ) -> Result<(), CarrierError> {
        let body = json!({
            "to": to,
            "from": from,
            "timeout_secs": TRANSFER_RING_S,
            "command_id": format!("transfer-{}", next_command()),
        });
        self.command(call_control_id, "transfer", &body)
            .await
            .map(|_| ())
    }

    /// Sends DTMF from this leg: `actions/send_dtmf`.
    pub(crate) async fn send_dtmf(&self, call_control_id: &str, digits: &str) -> Result<(), CarrierError> {
        let body = json!({
            "digits": digits,
            "duration_millis": DTMF_DURATION_MS,
            "command_id": format!("dtmf-{}", next_command()),
        });
        self.command(call_control_id, "send_dtmf", &body)
            .await
            .map(|_| ())
    }

    /// Hangs up; a call that has already ended counts as hung up.
    pub(crate) async fn hang_up(&self, call_control_id: &str) -> Result<(), CarrierError> {
        let body = json!({"command_id": format!("hangup-{call_control_id}")});
        match self.command(call_control_id, "hangup", &body).await {
            Ok(_) => Ok(()),
            Err(CarrierError::Http {
                status: 422,
                message,
                ..
            }) if message.contains(ALREADY_ENDED) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let a = answer_body("answer-1", Some("cs"), Some("wss://h/telnyx/media/t"));
        assert_eq!(a["stream_track"], "inbound_track");
        assert_eq!(a["stream_bidirectional_mode"], "rtp");
        assert_eq!(answer_body("x", None, None), json!({"command_id": "x"}));
        assert!(!path_safe("v3:a/b") && path_safe("v3:abc-DEF_1") && !path_safe(""));
        assert!(TelnyxRest::new(DEFAULT_API_BASE, " ").is_err());
    }
}
