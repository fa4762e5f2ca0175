//! The policy's vocabulary: the [`Input`]s the actor hands
//! [`Policy::handle`](super::Policy::handle) and the [`Action`]s it takes back from
//! [`Policy::poll_action`](super::Policy::poll_action) (see the driving rule in [`super`]).

use super::super::action::{ActionOutcome, CallAction};
use super::super::event::{EndReason, EventDetail, EventKind};
use super::super::mouth::UttKind;
use crate::audio::vad::VadEvent;
use crate::carrier::ActionResult;
use crate::provider::{ChatMessage, LlmEvent, TtsEvent};

/// Something that happened on the call, as the policy needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The call was created: queue the greeting (synthesised while the phone rings).
    Start,
    /// The carrier's media stream started: the call is answered.
    Answered,
    /// The carrier's machine detection says a machine answered the call we placed: leave
    /// `message` after its greeting (`greeting_over`: the carrier heard the greeting end).
    Machine {
        message: String,
        greeting_over: bool,
    },
    /// The caller-audio stage heard a machine's beep end (while the call waited for it).
    Beep { freq_hz: u32, length_ms: u64 },
    /// Our detector heard the caller start or stop speaking; `audio_ms` is the audio time it
    /// has judged so far (the event's audio times become wall times by their lag behind it).
    Vad { event: VadEvent, audio_ms: u64 },
    /// A caller audio frame went through the detector (after its speech events);
    /// `speech_run_ms` is the voiced audio in the current run (0 when not speaking),
    /// `span_ms` the audio time since the run's onset (voiced and gaps), `pitched_ms` how
    /// much of it carried a pitch (`audio::pitch`; 0 for a cough), `echo_ms` how much of it
    /// the agent's own echo explains (`audio::echo`).
    CallerAudio {
        speech_run_ms: u64,
        span_ms: u64,
        pitched_ms: u64,
        echo_ms: u64,
    },
    /// A speech-to-text interim transcript.
    Interim(String),
    /// A speech-to-text final transcript.
    Final {
        text: String,
        speech_final: bool,
        from_finalize: bool,
    },
    /// The speech-to-text's `UtteranceEnd`.
    UtteranceEnd,
    /// The speech-to-text thinks the turn probably ended with this text: start the brain
    /// speculatively, holding its reply back.
    EagerEndOfTurn(String),
    /// The caller went on: cancel the speculation.
    TurnResumed,
    /// The speech-to-text's own turn model ended the turn with this text.
    EndOfTurn(String),
    /// An event of the brain's reply stream (a stream that ends early arrives as an error).
    Llm(LlmEvent),
    /// The carrier played everything up to this mark.
    Mark(String),
    /// Utterances whose first audio frame just went out (the pacer's `started`).
    Started(Vec<(u64, UttKind)>),
    /// The caller pressed a key.
    Dtmf(char),
    /// Speak this text (a handle's `say`).
    Say(String),
    /// An agent action (tool, MCP, REST) numbered `id`; answered by [`Action::Reply`].
    Act { id: u64, action: CallAction },
    /// The carrier's answer to [`Action::Transfer`] / [`Action::SendDtmf`] number `id`.
    ActionDone { id: u64, result: ActionResult },
    /// The carrier ended the media stream (the actor ends the call; a transfer in flight
    /// takes it as the carrier carrying the transfer out).
    StreamStopped,
    /// A time returned by [`Policy::deadline`](super::Policy::deadline) has come.
    Timer,
    /// An event of the synthesis [`Action::Synthesize`] number `id` started (`None`: its
    /// stream ended).
    Synthesis { id: u64, event: Option<TtsEvent> },
    /// The speech-to-text changed mid-call (a fallback chain switched): whether the new one
    /// ends turns itself.
    SttChanged { ends_turns: bool },
    /// The end-of-turn model's answer about a pause ([`Action::AskTurnModel`]).
    TurnModel(crate::call::eot::TurnModelAnswer),
}

/// What the actor must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Tell the carrier to drop the audio it has queued.
    Clear,
    /// An utterance was queued on the mouth: pump (its synthesis is asked for apart).
    Speak { kind: UttKind, text: String },
    /// Start synthesising utterance `id`'s text; its events come back as
    /// [`Input::Synthesis`].
    Synthesize { id: u64, text: String },
    /// Cancel these utterances' synthesis (dropped from the mouth before it finished).
    CancelSynthesis(Vec<u64>),
    /// The mouth was resumed after a barge-in: pump.
    Resume,
    /// Ask the speech-to-text to finalize the current utterance now.
    Finalize,
    /// Start the brain on this history (replacing any reply stream in flight).
    StartBrain { history: Vec<ChatMessage> },
    /// Drop the brain's reply stream (cancelling it if it is still running).
    CancelBrain,
    /// Record an event on the call's timeline.
    Event(EventKind, EventDetail),
    /// Persist transcript entry `i` (see [`Policy::transcript`](super::Policy::transcript)).
    Persist(usize),
    /// The first audio of the reply to a caller turn went out this many µs after the turn ended.
    ReplyLatency(u64),
    /// Hang up and end the call for this reason.
    HangUp(EndReason),
    /// End the call for this reason without hanging up (the carrier carries the caller on,
    /// e.g. after a transfer).
    End(EndReason),
    /// Tell whoever asked for action `id` what came of it.
    Reply { id: u64, outcome: ActionOutcome },
    /// Ask the carrier to cold-transfer the call to `to` (E.164, allowed).
    Transfer { id: u64, to: String },
    /// Ask the carrier to send these (checked) DTMF digits.
    SendDtmf { id: u64, digits: String },
    /// Have the end-of-turn model judge pause number `pause` on the caller's last 8 s.
    AskTurnModel { pause: u64 },
}
