//! What a call remembers: the transcript (who said what, and what the caller actually heard of
//! the agent) and the timeline of decisions. Kept in memory by the actor and handed to the
//! registry when the call ends; the store persists the same shapes as the call goes.

use serde::Serialize;

use super::event::{EndReason, EventKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Speaker {
    Caller,
    Agent,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TranscriptEntry {
    pub speaker: Speaker,
    /// What was said (for the agent: everything it meant to say).
    pub text: String,
    /// What the caller heard of it (for the agent: sentences whose playback mark came back).
    pub heard_text: String,
    /// The agent was cut off before finishing.
    pub interrupted: bool,
    /// Milliseconds since the call was answered.
    pub start_ms: u64,
    pub end_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallEvent {
    /// Milliseconds since the call was created (webhook time).
    pub t_ms: u64,
    pub kind: EventKind,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A call's full record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    pub call_id: String,
    pub carrier: String,
    pub agent: String,
    /// Masked numbers only.
    pub from_masked: String,
    pub(crate) to_masked: String,
    pub ended_reason: EndReason,
    pub transcript: Vec<TranscriptEntry>,
    pub events: Vec<CallEvent>,
}

impl CallRecord {
    /// Events of one kind (an [`EventKind`] or its stored name), in order.
    pub fn events_of<'a, K>(&'a self, kind: K) -> impl Iterator<Item = &'a CallEvent> + 'a
    where
        EventKind: PartialEq<K>,
        K: 'a,
    {
        self.events.iter().filter(move |e| e.kind == kind)
    }
}
