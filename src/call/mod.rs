//! Calls: one actor per call ([`actor`]) owning all of the call's state and I/O, a cheap
//! cloneable [`CallHandle`] to talk to it, and the [`CallRegistry`] of live calls keyed by the
//! carrier's call id. Turn-taking is decided by pure parts the actor drives: the conversation
//! [`policy`] (agent phase, barge-in, held turns, fillers, idle nudges, transcript and history),
//! the endpointer and word checks in [`turn`], and the mouth (utterance queue and pacer) in
//! [`mouth`]; [`event`] is the typed timeline. The actor sees only carrier-neutral media events
//! and provider traits, so it does not know which carrier or vendor it talks to. A traced call
//! (`[telemetry]`) makes its OpenTelemetry spans in [`trace`].

pub mod action;
pub mod actor;
pub(crate) mod driver;
pub mod echo;
pub mod eot;
pub mod event;
pub mod heard;
pub mod ingress;
pub mod log;
pub mod mouth;
pub mod policy;
pub mod recording;
pub(crate) mod registry;
pub mod timeline;
pub mod trace;
pub mod transcript;
pub mod turn;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::carrier::{CarrierKind, Leg, MediaCommand, StreamStart};
use crate::config::AgentConfig;
use crate::provider::AgentProviders;

pub use action::{ActionOutcome, CallAction};
pub use event::{EndReason, EventDetail, EventKind};
pub use log::{CallLog, Dropped, Usage};
pub use registry::CallRegistry;
pub use timeline::{ProgressCursor, ProgressDelta};
pub use transcript::{CallEvent, CallRecord, Speaker, TranscriptEntry};

/// Everything an actor needs to know about its call when it is created (at webhook time).
#[derive(Clone)]
pub struct CallSetup {
    pub call_id: String,
    pub carrier: CarrierKind,
    /// Name of the `[carriers.NAME]` account the call came through.
    pub carrier_account: String,
    /// Caller's number (inbound) as the carrier gave it; only ever logged masked.
    pub from: String,
    /// The number that was dialled.
    pub to: String,
    /// We placed this call: the other party is `to`, not `from`.
    pub outbound: bool,
    pub(crate) agent_name: String,
    pub agent: Arc<AgentConfig>,
    pub providers: AgentProviders,
    /// How long to wait for the carrier's media stream before giving up on the call.
    pub(crate) attach_timeout: Duration,
    /// A call with no media at all for this long is ended.
    pub(crate) media_timeout: Duration,
    /// Where turns and events are persisted as the call goes (never waited on).
    pub log: Option<std::sync::Arc<dyn log::CallLog>>,
    /// The tools this call's brain may use (built per call by the composition root).
    pub tools: Option<crate::provider::Tools>,
    /// Where to write the call's recording (`None`: not recorded).
    pub recording: Option<std::path::PathBuf>,
    /// The agent's end-of-turn model (`[agents.X] turn_model`; `None`: silence decides).
    pub turn_model: Option<eot::TurnModelWorker>,
    /// The call's own API token (scope `call`), sent to the brain in `X-Patterd-Call-Token`
    /// (`None` in token-less mode).
    pub(crate) call_token: Option<crate::util::secret::Secret>,
    /// Where the call's spans go and its trace context (`None`: not traced, `[telemetry]` off).
    pub tracing: Option<trace::CallTracing>,
}

impl CallSetup {
    /// The call span's `traceparent` when the call is traced: what a request about the call
    /// (a webhook delivery) carries so it joins the call's trace
    /// ([`crate::net::http::with_traceparent`]).
    pub fn traceparent(&self) -> Option<crate::util::traceparent::TraceParent> {
        self.tracing.as_ref().map(|t| t.call)
    }

    /// The number of the person on the other end (the caller, or whom we called).
    pub(crate) fn remote_party(&self) -> &str {
        if self.outbound { &self.to } else { &self.from }
    }

    /// The agent's `system_prompt` with `{call_id}`, `{caller}` (who placed the call),
    /// `{callee}` (who was called) and `{agent}` filled in, so a brain that runs its own tools
    /// (Hermes with patterd's MCP server) knows which call it is in. Caller and callee ids come
    /// from the carrier unauthenticated: they are filled in as a normalised E.164 number or
    /// `unknown` ([`crate::util::phone::for_prompt`]), never as the carrier's text.
    pub fn system_prompt(&self) -> String {
        use crate::util::phone::for_prompt;
        render_prompt(
            &self.agent.system_prompt,
            &[
                ("call_id", &self.call_id),
                ("caller", &for_prompt(&self.from)),
                ("callee", &for_prompt(&self.to)),
                ("agent", &self.agent_name),
            ],
        )
    }
}

/// Replaces each `{name}` of `vars` in `template` (one pass: values are never re-expanded;
/// other braces are left alone).
pub(crate) fn render_prompt(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let var = after.find('}').and_then(|close| {
            vars.iter()
                .find(|(n, _)| *n == &after[..close])
                .map(|v| (close, v.1))
        });
        match var {
            Some((close, value)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod prompt_tests {
    use super::render_prompt;

    #[test]
    fn placeholders_are_filled_once_and_other_braces_kept() {
        let vars = [
            ("call_id", "CA1"),
            ("caller", "+1555{agent}"),
            ("agent", "desk"),
        ];
        assert_eq!(
            render_prompt(
                "In call {call_id} from {caller} as {agent}; {json: 1} {nope} {",
                &vars
            ),
            "In call CA1 from +1555{agent} as desk; {json: 1} {nope} {"
        );
    }
}

/// The media stream the carrier opened for this call, handed to the actor.
pub struct MediaAttach {
    pub start: StreamStart,
    /// Carrier events for the actor, and the notes of the caller-audio stage.
    pub events: mpsc::Receiver<ingress::MediaInput>,
    /// Commands for the media stream (audio, marks, clear); the actor closes the stream by
    /// dropping it.
    pub commands: mpsc::Sender<MediaCommand>,
    /// The call's leg at its carrier: hang-up, transfer and DTMF go through it.
    pub leg: Leg,
    /// Where the actor hands the call's caller-audio stage ([`ingress::CallerIngress`]) to
    /// the reader of the media socket, which runs it on every frame; `None`: the actor runs
    /// it on the raw `Audio` events itself.
    pub ingress: Option<oneshot::Sender<ingress::CallerIngress>>,
}

/// Messages a [`CallHandle`] sends to its actor.
pub(crate) enum CallMsg {
    Attach(MediaAttach),
    /// End the call (agent, operator or shutdown); the carrier is told to hang up.
    HangUp {
        reason: String,
    },
    /// Speak this text now (queued after what is already being said).
    Say(String),
    /// A machine answered the call we placed: leave `message` after its greeting.
    Machine {
        message: String,
        machine: crate::carrier::dial::Machine,
    },
    /// A copy of the call's record so far.
    Snapshot(oneshot::Sender<CallRecord>),
    /// What is new for a progress reader at this cursor.
    Progress(ProgressCursor, oneshot::Sender<ProgressDelta>),
    /// Carry out an action (tools, MCP, REST) and say what came of it.
    Act {
        action: CallAction,
        reply: oneshot::Sender<ActionOutcome>,
    },
}

/// Why a message could not reach a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("the call has ended")]
    Ended,
    #[error("the call is busy; try again")]
    Busy,
}

/// A cheap, cloneable way to reach a call's actor.
#[derive(Clone)]
pub struct CallHandle {
    pub call_id: Arc<str>,
    /// The `[carriers.NAME]` account the call belongs to (for REST hang-up).
    pub carrier_account: Arc<str>,
    tx: mpsc::Sender<CallMsg>,
    /// Counts the call's events; bumped by the actor, never waited on by it.
    changes: watch::Receiver<u64>,
}

impl CallHandle {
    pub(crate) fn new(
        call_id: &str,
        carrier_account: &str,
        tx: mpsc::Sender<CallMsg>,
        changes: watch::Receiver<u64>,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            carrier_account: carrier_account.into(),
            tx,
            changes,
        }
    }

    /// A receiver that changes whenever the call records an event (its value is the number
    /// of events so far). `changed()` fails once the actor has gone; the final record is then
    /// in the registry. For tests and operators that wait on a call instead of polling it.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    fn send(&self, msg: CallMsg) -> Result<(), CallError> {
        self.tx.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => CallError::Busy,
            mpsc::error::TrySendError::Closed(_) => CallError::Ended,
        })
    }

    /// Hands the carrier's media stream to the call.
    pub fn attach(&self, media: MediaAttach) -> Result<(), CallError> {
        self.send(CallMsg::Attach(media))
    }

    /// Ends the call.
    pub fn hang_up(&self, reason: &str) -> Result<(), CallError> {
        self.send(CallMsg::HangUp {
            reason: reason.to_string(),
        })
    }

    /// Speaks `text` to the caller.
    pub fn say(&self, text: &str) -> Result<(), CallError> {
        self.send(CallMsg::Say(text.to_string()))
    }

    /// A machine answered the call (what the carrier's machine detection said): the call
    /// stops the conversation and leaves `message` after the greeting's beep.
    pub fn machine_answered(
        &self,
        message: &str,
        machine: crate::carrier::dial::Machine,
    ) -> Result<(), CallError> {
        self.send(CallMsg::Machine {
            message: message.to_string(),
            machine,
        })
    }

    /// The call's transcript and timeline so far.
    pub async fn snapshot(&self) -> Result<CallRecord, CallError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(CallMsg::Snapshot(tx))
            .await
            .map_err(|_| CallError::Ended)?;
        rx.await.map_err(|_| CallError::Ended)
    }

    /// What is new in the call's timeline and transcript since `cursor` (a delta, never the
    /// whole record; see [`timeline`]).
    pub async fn progress(&self, cursor: ProgressCursor) -> Result<ProgressDelta, CallError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(CallMsg::Progress(cursor, tx))
            .await
            .map_err(|_| CallError::Ended)?;
        rx.await.map_err(|_| CallError::Ended)
    }

    /// Asks the call to carry out `action`; resolves with what came of it.
    pub async fn act(&self, action: CallAction) -> Result<ActionOutcome, CallError> {
        let (reply, rx) = oneshot::channel();
        self.send(CallMsg::Act { action, reply })?;
        rx.await.map_err(|_| CallError::Ended)
    }

    /// True once the actor has gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}
