//! The outbound call lifecycle, in one place: what we asked for when placing a call
//! ([`OutboundCall`]), where it is ([`Phase`]: ringing, waiting for machine detection, speaking
//! the voicemail message, connected), the carrier's own id for the leg when it differs from
//! ours (Plivo's `CallUUID` for our `request_uuid`), and the typed status and outcome carriers
//! report ([`CallStatus`], [`CallOutcome`], written to the store as the strings served today).
//! The composition root places calls and creates the actor; carrier routes move calls through
//! their phases here and say what machine detection heard ([`Machine`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{CarrierError, CarrierKind};

/// How long an ended call stays known (for its leg id and late callbacks, e.g. Plivo's hangup
/// callback, which follows the end of the call).
pub(crate) const KEEP_ENDED: Duration = Duration::from_secs(120);

/// A call's status as stored and served (`calls.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallStatus {
    Queued,
    Ringing,
    InProgress,
    Completed,
    Busy,
    Failed,
    NoAnswer,
    Canceled,
}

impl CallStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Queued => "queued",
            CallStatus::Ringing => "ringing",
            CallStatus::InProgress => "in-progress",
            CallStatus::Completed => "completed",
            CallStatus::Busy => "busy",
            CallStatus::Failed => "failed",
            CallStatus::NoAnswer => "no-answer",
            CallStatus::Canceled => "canceled",
        }
    }

    /// The status named `s` (Twilio's `CallStatus` values use the same words).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => CallStatus::Queued,
            "ringing" => CallStatus::Ringing,
            "in-progress" => CallStatus::InProgress,
            "completed" => CallStatus::Completed,
            "busy" => CallStatus::Busy,
            "failed" => CallStatus::Failed,
            "no-answer" => CallStatus::NoAnswer,
            "canceled" => CallStatus::Canceled,
            _ => return None,
        })
    }
}

/// How an outbound call turned out (`calls.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    Answered,
    Voicemail,
    Busy,
    NoAnswer,
    Failed,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Answered => "answered",
            CallOutcome::Voicemail => "voicemail",
            CallOutcome::Busy => "busy",
            CallOutcome::NoAnswer => "no_answer",
            CallOutcome::Failed => "failed",
        }
    }

    /// The status a call ends with when this outcome ends it before anyone answered.
    pub(crate) fn unanswered_status(self) -> Option<CallStatus> {
        match self {
            CallOutcome::Busy => Some(CallStatus::Busy),
            CallOutcome::NoAnswer => Some(CallStatus::NoAnswer),
            CallOutcome::Failed => Some(CallStatus::Failed),
            CallOutcome::Answered | CallOutcome::Voicemail => None,
        }
    }
}

/// A carrier's report about a call: every field that is `Some` is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUpdate {
    pub call_id: String,
    pub status: Option<CallStatus>,
    pub outcome: Option<CallOutcome>,
    pub answered_by: Option<String>,
    pub carrier_duration_s: Option<u64>,
}

impl StatusUpdate {
    /// An outcome (and who answered, when known).
    pub fn outcome(call_id: &str, outcome: CallOutcome, answered_by: Option<String>) -> Self {
        Self {
            call_id: call_id.to_string(),
            status: None,
            outcome: Some(outcome),
            answered_by,
            carrier_duration_s: None,
        }
    }

    /// A call that ended with `outcome` before anyone answered: the outcome and its status.
    pub fn unanswered(call_id: &str, outcome: CallOutcome) -> Self {
        Self {
            status: outcome.unanswered_status(),
            ..Self::outcome(call_id, outcome, None)
        }
    }
}

/// Where a live outbound call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Placed; not answered yet.
    Ringing,
    /// Answered; waiting for the carrier's machine detection before connecting media.
    Detecting,
    /// A machine answered and the call has a voicemail message: media is connected to the
    /// call, which waits for the end of the greeting and leaves the message.
    Voicemail,
    /// Answered by a person (or a machine without detection): media is connected.
    Connected,
    /// Over: hung up, or the voicemail message was spoken.
    Ended,
}

/// What a carrier's machine detection says about a call we placed that a machine answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// A machine answered and its greeting is (or may still be) playing: Twilio's
    /// `machine_start` (`MachineDetection=Enable`), Telnyx's `call.machine.detection.ended`,
    /// Plivo's `Machine=true`. The call waits for the greeting's beep.
    Greeting,
    /// The carrier heard the greeting end: Twilio's `machine_end_beep`, `machine_end_silence`,
    /// `machine_end_other`; Telnyx's `call.machine.greeting.ended`. The message goes now.
    GreetingEnded,
    /// A fax machine: nothing to say to it.
    Fax,
}

/// What we know about a call we placed.
#[derive(Debug, Clone)]
pub struct OutboundCall {
    /// `[carriers.NAME]` that placed it.
    pub account: String,
    pub kind: CarrierKind,
    pub machine_detection: bool,
    pub voicemail_message: Option<String>,
    /// The carrier's id for the leg, when it differs from our call id.
    pub(crate) leg_id: Option<String>,
    pub phase: Phase,
}

struct Entry {
    call: OutboundCall,
    ended: Option<Instant>,
}

/// Every outbound call we placed, live or recently ended, by our call id.
#[derive(Default)]
pub struct Outbound {
    calls: Mutex<HashMap<String, Entry>>,
}

impl Outbound {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call was placed (phase [`Phase::Ringing`]).
    pub(crate) fn register(&self, call_id: &str, call: OutboundCall) {
        let mut map = self.map();
        map.retain(|_, e| e.ended.is_none_or(|t| t.elapsed() < KEEP_ENDED));
        map.insert(call_id.to_string(), Entry { call, ended: None });
    }

    /// The call ended; it stays known for [`KEEP_ENDED`] for late carrier callbacks.
    pub fn ended(&self, call_id: &str) {
        if let Some(e) = self.map().get_mut(call_id) {
            e.ended.get_or_insert_with(Instant::now);
        }
    }

    /// Forgets a call at once (it never started).
    pub fn remove(&self, call_id: &str) {
        self.map().remove(call_id);
    }

    /// The call `call_id`, if we placed it and it is live.
    pub fn live(&self, call_id: &str) -> Option<OutboundCall> {
        self.map()
            .get(call_id)
            .filter(|e| e.ended.is_none())
            .map(|e| e.call.clone())
    }

    /// Live outbound calls.
    pub(crate) fn live_count(&self) -> usize {
        self.map().values().filter(|e| e.ended.is_none()).count()
    }

    /// Records the carrier's leg id of our call `call_id`.
    pub(crate) fn set_leg(&self, call_id: &str, leg_id: &str) {
        if let Some(e) = self.map().get_mut(call_id) {
            e.call.leg_id = Some(leg_id.to_string());
        }
    }

    /// The carrier's leg id of our call `call_id`, once known.
    pub fn leg(&self, call_id: &str) -> Option<String> {
        self.map().get(call_id).and_then(|e| e.call.leg_id.clone())
    }

    /// Our call id for the carrier's leg `leg_id` (live or recently ended calls).
    pub(crate) fn call_id_for_leg(&self, leg_id: &str) -> Option<String> {
        let map = self.map();
        map.iter()
            .find(|(_, e)| {
                e.call.leg_id.as_deref() == Some(leg_id)
                    && e.ended.is_none_or(|t| t.elapsed() < KEEP_ENDED)
            })
            .map(|(id, _)| id.clone())
    }

    /// Moves the call to `phase`.
    pub(crate) fn set_phase(&self, call_id: &str, phase: Phase) {
        if let Some(e) = self.map().get_mut(call_id) {
            e.call.phase = phase;
        }
    }

    /// If the call is in phase `from`, moves it to `to` and returns true (each transition
    /// happens once, whichever event or timer gets there first).
    pub fn advance(&self, call_id: &str, from: Phase, to: Phase) -> bool {
        match self.map().get_mut(call_id) {
            Some(e) if e.call.phase == from => {
                e.call.phase = to;
                true
            }
            _ => false,
        }
    }
}

/// An outbound call for a carrier to place.
#[derive(Debug, Clone)]
pub struct PlaceCall {
    pub from: String,
    pub to: String,
    pub machine_detection: bool,
    /// Seconds the destination rings.
    pub ring_timeout_s: u32,
    /// The agent's maximum call duration.
    pub(crate) time_limit_s: u64,
    /// `server.public_url`, for the carrier's webhook URLs.
    pub public_url: String,
}

/// Why a carrier did not place a call.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// The account lacks what placing needs; `what` says which keys to set.
    #[error("[carriers.{account}] has no credentials; set {what}")]
    Unconfigured { account: String, what: &'static str },
    #[error(transparent)]
    Carrier(#[from] CarrierError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> OutboundCall {
        OutboundCall {
            account: "p".into(),
            kind: CarrierKind::Plivo,
            machine_detection: true,
            voicemail_message: None,
            leg_id: None,
            phase: Phase::Ringing,
        }
    }

    #[test]
    fn lifecycle_and_legs() {
        let o = Outbound::default();
        o.register("req-1", call());
        assert_eq!(o.live_count(), 1);
        o.set_leg("req-1", "uuid-1");
        assert_eq!(o.call_id_for_leg("uuid-1").as_deref(), Some("req-1"));
        assert!(o.advance("req-1", Phase::Ringing, Phase::Detecting));
        assert!(!o.advance("req-1", Phase::Ringing, Phase::Detecting));
        o.ended("req-1");
        assert_eq!(o.live_count(), 0);
        assert!(o.live("req-1").is_none());
        // Still known by its leg for late callbacks.
        assert_eq!(o.call_id_for_leg("uuid-1").as_deref(), Some("req-1"));
        assert_eq!(o.leg("req-1").as_deref(), Some("uuid-1"));
    }

    #[test]
    fn strings_are_the_stored_ones() {
        assert_eq!(CallStatus::NoAnswer.as_str(), "no-answer");
        assert_eq!(
            serde_json::to_value(CallStatus::InProgress).ok(),
            Some(serde_json::json!("in-progress"))
        );
        assert_eq!(CallOutcome::NoAnswer.as_str(), "no_answer");
        assert_eq!(
            serde_json::to_value(CallOutcome::NoAnswer).ok(),
            Some(serde_json::json!("no_answer"))
        );
        assert_eq!(CallStatus::parse("canceled"), Some(CallStatus::Canceled));
    }
}
