//! The Telnyx Call Control webhook envelope: `{"data": {"event_type", "id",
//! "occurred_at", "payload": {...}, "record_type"}, "meta": {...}}`. Parsed leniently: only
//! `data.event_type` and `payload.call_control_id` are required, unknown fields and event types
//! are kept as they are, and nothing in a body can make the parser panic.

use serde::Deserialize;

/// Why a webhook body could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("Telnyx webhook body is not JSON: {0}")]
    BadJson(String),
    #[error(
        "Telnyx webhook is missing `{0}`; is this URL the webhook of a Call Control application?"
    )]
    MissingField(&'static str),
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RawEnvelope {
    data: Option<RawData>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RawData {
    event_type: Option<String>,
    id: Option<String>,
    occurred_at: Option<String>,
    #[serde(default)]
    payload: Option<serde_json::Value>,
}

/// The payload fields patterd uses (every event has some of them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallEvent {
    /// The command handle, e.g. `v3:…`; used raw in REST paths.
    pub call_control_id: String,
    pub call_leg_id: String,
    pub call_session_id: String,
    pub connection_id: String,
    pub from: String,
    pub to: String,
    /// `incoming` or `outgoing` (`call.initiated`).
    pub direction: String,
    /// `parked`, `answered`, `hangup`, ...
    pub state: String,
    /// Base64 string we passed on a command, echoed back.
    pub client_state: Option<String>,
    /// `call.dtmf.received`.
    pub digit: Option<String>,
    /// `call.hangup`.
    pub hangup_cause: Option<String>,
    /// `call.hangup`: `caller`, `callee`, `unknown`.
    pub hangup_source: Option<String>,
    /// `streaming.*`.
    pub stream_url: Option<String>,
    /// `streaming.failed`.
    pub(crate) failure_reason: Option<String>,
    /// `call.machine.detection.ended`: `human`, `machine`, `not_sure`;
    /// `call.machine.greeting.ended`: `ended`, `beep_detected`, `not_sure`.
    pub result: Option<String>,
}

/// A parsed webhook.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WebhookEnvelope {
    /// `call.initiated`, `call.answered`, `call.hangup`, `streaming.started`, ...
    pub event_type: String,
    /// Event id, for de-duplication of retries.
    pub id: String,
    pub occurred_at: String,
    pub call: CallEvent,
}

impl WebhookEnvelope {
    /// Parses a raw webhook body.
    pub fn parse(body: &[u8]) -> Result<Self, WebhookError> {
        let raw: RawEnvelope =
            serde_json::from_slice(body).map_err(|e| WebhookError::BadJson(e.to_string()))?;
        let data = raw.data.ok_or(WebhookError::MissingField("data"))?;
        let event_type = data
            .event_type
            .filter(|e| !e.is_empty())
            .ok_or(WebhookError::MissingField("data.event_type"))?;
        let payload = data.payload.unwrap_or(serde_json::Value::Null);
        let s = |name: &str| {
            payload
                .get(name)
                .and_then(|v| v.as_str())
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let call_control_id = s("call_control_id")
            .ok_or(WebhookError::MissingField("data.payload.call_control_id"))?;
        Ok(Self {
            event_type,
            id: data.id.unwrap_or_default(),
            occurred_at: data.occurred_at.unwrap_or_default(),
            call: CallEvent {
                call_control_id,
                call_leg_id: s("call_leg_id").unwrap_or_default(),
                call_session_id: s("call_session_id").unwrap_or_default(),
                connection_id: s("connection_id").unwrap_or_default(),
                from: s("from").unwrap_or_default(),
                to: s("to").unwrap_or_default(),
                direction: s("direction").unwrap_or_default(),
                state: s("state").unwrap_or_default(),
                client_state: s("client_state"),
                digit: s("digit"),
                hangup_cause: s("hangup_cause"),
                hangup_source: s("hangup_source"),
                stream_url: s("stream_url"),
                failure_reason: s("failure_reason"),
                result: s("result"),
            },
        })
    }
}
