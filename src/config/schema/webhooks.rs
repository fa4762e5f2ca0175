//! `[[webhooks]]`: where patterd posts what happened to calls (docs/integrations.md) — each
//! entry a URL, the events it wants ([`WebhookEvent`]), the Standard Webhooks signing secret
//! and an optional agent filter — `[webhook_delivery]`, how the outbox delivers them
//! (timeouts, concurrency, the retry schedule), and `[agents.X.summary]`, the summary a brain
//! writes after each call (stored with it, sent in `call.ended`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::util::secret::Secret;

/// What a webhook can be told about. The serde names are the payloads' `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WebhookEvent {
    /// The call's media started (the conversation began).
    #[serde(rename = "call.started")]
    CallStarted,
    /// The call ended: its record, transcript, turn latencies, cost (and summary, when the
    /// agent has one).
    #[serde(rename = "call.ended")]
    CallEnded,
    /// The agent transferred the caller and the carrier accepted it.
    #[serde(rename = "call.transferred")]
    CallTransferred,
    /// The call's recording is complete and can be downloaded.
    #[serde(rename = "recording.ready")]
    RecordingReady,
    /// A transcript entry is final (a caller turn as it ends, an agent turn once the next
    /// entry begins or the call ends).
    #[serde(rename = "turn.completed")]
    TurnCompleted,
}

impl WebhookEvent {
    /// Every event, in the order documented.
    pub const ALL: &'static [WebhookEvent] = &[
        WebhookEvent::CallStarted,
        WebhookEvent::CallEnded,
        WebhookEvent::CallTransferred,
        WebhookEvent::RecordingReady,
        WebhookEvent::TurnCompleted,
    ];

    /// The payload's `type` (and the config's name).
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::CallStarted => "call.started",
            WebhookEvent::CallEnded => "call.ended",
            WebhookEvent::CallTransferred => "call.transferred",
            WebhookEvent::RecordingReady => "recording.ready",
            WebhookEvent::TurnCompleted => "turn.completed",
        }
    }
}

/// `[[webhooks]]`: one receiver.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Receives `POST` with the event as JSON and the Standard Webhooks headers. The URL is
    /// the entry's identity: the outbox remembers it, and a delivery whose URL no entry has
    /// any more is dead-lettered.
    pub url: String,
    /// The events it wants (default: `call.ended`).
    #[serde(default = "default_events")]
    pub events: Vec<WebhookEvent>,
    /// The signing secret: `whsec_` + base64 of at least 24 random bytes (what the Standard
    /// Webhooks libraries take as is), or any other string of at least 24 bytes, used as its
    /// bytes.
    pub secret: Secret,
    /// During a rotation: the old secret, also signed with (a second `v1,` signature), so a
    /// receiver still on it keeps verifying.
    #[serde(default)]
    pub previous_secret: Option<Secret>,
    /// Only calls of these agents (default: every agent).
    #[serde(default)]
    pub agents: Vec<String>,
    /// Lets the URL be on loopback or a private network (the SSRF guard refuses them
    /// otherwise), for this entry only.
    #[serde(default)]
    pub allow_loopback: bool,
}

fn default_events() -> Vec<WebhookEvent> {
    vec![WebhookEvent::CallEnded]
}

impl WebhookConfig {
    /// Whether this entry wants `event` for a call of `agent`.
    pub fn wants(&self, event: WebhookEvent, agent: &str) -> bool {
        self.events.contains(&event)
            && (self.agents.is_empty() || self.agents.iter().any(|a| a == agent))
    }
}

/// `[webhook_delivery]`: how the outbox delivers (read at start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookDeliveryConfig {
    /// Each attempt gets this long to be answered (connecting included).
    pub timeout_s: u64,
    /// Attempts in flight at once, across every receiver.
    pub concurrency: usize,
    /// The wait after the first failed attempt; each further failure doubles it (with jitter:
    /// between half and all of it), up to `retry_max_ms`. A receiver's `Retry-After` is
    /// honoured when longer.
    pub retry_base_ms: u64,
    /// The longest wait between two attempts.
    pub retry_max_ms: u64,
    /// A delivery still failing this long after its event is dead-lettered.
    pub give_up_after_s: u64,
    /// How often the outbox looks for deliveries that are due.
    pub poll_ms: u64,
}

impl Default for WebhookDeliveryConfig {
    fn default() -> Self {
        Self {
            timeout_s: 15,
            concurrency: 16,
            retry_base_ms: 5_000,
            retry_max_ms: 3_600_000,
            give_up_after_s: 86_400,
            poll_ms: 1_000,
        }
    }
}

/// `[agents.X.summary]`: after each of the agent's calls, `llm` reads the transcript and writes a
/// summary — and, with `schema`, fills it (structured extraction). Stored with the call
/// (`summary` in `GET /v1/calls/{id}`) and sent in `call.ended`, which waits for it (at most
/// `timeout_s`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryConfig {
    /// The `[llm.NAME]` that writes it.
    pub llm: String,
    /// What to write (the instructions before the transcript).
    #[serde(default = "default_summary_prompt")]
    pub prompt: String,
    /// A JSON Schema (an object schema) the extracted `data` must match; none: a summary only.
    #[serde(default)]
    pub schema: Option<Value>,
    /// How long the brain gets; after it, `call.ended` goes without a summary.
    #[serde(default = "default_summary_timeout")]
    pub timeout_s: u64,
}

fn default_summary_prompt() -> String {
    "Summarise this phone call in two or three sentences for the records: who called, what \
     they wanted and what was agreed or left open."
        .into()
}

fn default_summary_timeout() -> u64 {
    60
}
