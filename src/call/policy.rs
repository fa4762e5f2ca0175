//! The conversation policy: who has the floor, as a pure state machine. It owns the call's
//! turn-taking state (the explicit agent [`Phase`], the [`Endpointer`], barge-in, held turns,
//! fillers, idle nudges and the goodbye) and what the conversation remembers (transcript,
//! chat history, the note for a brain that keeps its own history). The actor feeds it
//! [`Input`]s (caller speech from our detector, speech-to-text results, brain events, synthesis
//! events, playback marks, timers, DTMF, `say`) with the time they happened, and carries out
//! the [`Action`]s it queues (carrier `clear`, `Finalize`, start or cancel the brain, start or
//! cancel synthesis, events, persistence, hang up). The agent's mouth ([`Mouth`], itself pure
//! state: utterance ids, text, audio and timings, no provider streams) is lent to every step so
//! the policy can queue, pause, resume and clear it and see what is playing. Nothing here does
//! I/O, reads the clock, holds a channel or spawns a task.
//!
//! # The driving rule
//!
//! There is one way in and one way out, and the actor follows it for every event:
//!
//! 1. [`Policy::handle`]`(input, now, &mut mouth)` with whatever happened and the time;
//! 2. then [`Policy::poll_action`] until it returns `None`, carrying out each action in order;
//! 3. before waiting again, [`Policy::deadline`] says when to send [`Input::Timer`].
//!
//! Nothing else changes the policy's state: no side doors, no "settle" input, no queue of
//! inputs kept outside it. What a step leaves for later is the policy's own business: at the
//! end of every `handle` it takes a held turn whose time has come and ends a goodbye that has
//! played, and when something outside a step (the pacer sending the last of an utterance) makes
//! one due, [`Policy::deadline`] returns a time already passed, so the next [`Input::Timer`]
//! does it.
//!
//! Carrying out an action sometimes yields an input at once: the pacer pumped by
//! [`Action::Speak`] reports the utterances that started ([`Input::Started`]), the end-of-turn
//! model refuses a question ([`Action::AskTurnModel`] answered by [`Input::TurnModel`]), a
//! carrier action cannot be queued ([`Input::ActionDone`] with a failure). The actor hands that
//! input to `handle` right away, before polling on; the actions it queues come before those
//! still pending (depth first), so they run as if carried out inside the action that caused
//! them. The result of carrying out an action is thus always one more `handle` call in the same
//! loop, never a queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::event::{EventDetail, EventKind};
use super::heard;
use super::mouth::{Mouth, UttKind};
use super::transcript::{Speaker, TranscriptEntry};
use super::turn::{Decision, Endpointer, NumberShapes, TurnEnd, Words};
use crate::audio::vad::VadEvent;
use crate::carrier::ActionResult;
use crate::config::AgentConfig;
use crate::provider::chunker::SentenceChunker;
use crate::provider::{ChatMessage, LlmEvent, Role};

mod acts;
mod barge;
mod eot;
mod hold;
mod io;
mod keypad;
mod retry;
mod speaking;
mod speculate;
mod stt_turns;
#[cfg(test)]
mod tests;
pub(crate) mod voicemail;

pub(crate) use eot::TurnModelTiming;
pub(crate) use io::Action;
pub use io::Input;

/// Longest wait for the idle goodbye to play before hanging up anyway.
pub(crate) const GOODBYE_GRACE: Duration = Duration::from_secs(15);

/// What the agent is doing, as far as turn-taking is concerned. `Idle`, `Thinking` and
/// `Speaking` follow the mouth and the brain (refreshed on every step); `BargeIn` and
/// `Goodbye` are entered and left only by the policy's own decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing queued or playing and no reply coming: listening.
    Idle,
    /// The brain is working on a reply and nothing is queued or playing yet.
    Thinking,
    /// Agent audio is queued, being sent or not yet confirmed played (the brain may still be
    /// streaming the rest of the reply).
    Speaking,
    /// Caller speech stopped the agent (carrier `clear`, mouth paused with its audio kept);
    /// enough real words commit the interruption, otherwise the agent resumes at `deadline`.
    BargeIn {
        /// When the agent was stopped.
        at: Instant,
        /// Resume unless confirmed by then.
        deadline: Instant,
        /// `hold_max_ms` after the agent's audio was first held back (the hold, or this stop):
        /// by then it has resumed or the caller's turn has been taken, whatever else waits.
        bound: Instant,
    },
    /// The idle goodbye is playing; the call is hung up when it is done or at `until`.
    Goodbye { until: Instant },
}

/// The reply to one caller turn.
struct Turn {
    id: u64,
    /// When the caller's turn ended.
    ended_at: Instant,
    /// Some reply (or filler) audio has gone out for this turn.
    audio_started: bool,
    filler_done: bool,
    /// Transcript entry of the agent's reply, created with its first sentence.
    entry: Option<usize>,
    reply_text: String,
    /// The turn came from the keypad (a keypad turn waits for its reply stream).
    keypad: bool,
    /// Tool calling: when the model's latest tool call arrived, whether a tool result is
    /// waiting for the reply's next sentence, and that sentence's utterance.
    tools: TurnTools,
    /// Some of the reply came (text, a tool call or its progress): a failure is not retried.
    streamed: bool,
    /// The brain was unavailable for this turn: its retries (`retry.rs`).
    retry: Option<retry::Retrying>,
}

/// A turn's tool-call bookkeeping (for the `tool_reply_first_frame` latency).
#[derive(Debug, Default)]
struct TurnTools {
    called_at: Option<Instant>,
    result_in: bool,
    reply_utt: Option<u64>,
}

/// How to treat a caller turn that ends while the agent is busy.
enum Overlap {
    /// Nothing to cut: take the turn.
    Free,
    /// Cut the agent and take the turn.
    Cut,
    /// Take the turn without cutting (the uninterruptible greeting plays on; the reply follows).
    Queue,
    /// Keep the turn until the agent is done (`barge_in = false`).
    Hold,
}

/// One call's conversation policy.
pub(crate) struct Policy {
    agent: Arc<AgentConfig>,
    /// The brain keeps its own copy of its replies (tell it what the caller heard instead).
    brain_keeps_history: bool,
    phase: Phase,
    /// A reply stream is open.
    brain: bool,
    answered: Option<Instant>,
    endpointer: Endpointer,
    /// When the endpointer wants to be asked again.
    eot_at: Option<Instant>,
    words: Words,
    /// Between our detector's speech start and end.
    caller_speaking: bool,
    /// A caller turn waiting for the agent to finish (`barge_in = false`).
    held_turn: Option<(String, TurnEnd)>,
    /// Last time either side made a sound (for idle nudges).
    last_activity: Instant,
    nudges: u64,
    turn: Option<Turn>,
    turns: u64,
    chunker: SentenceChunker,
    history: Vec<ChatMessage>,
    transcript: Vec<TranscriptEntry>,
    /// For a brain that keeps its own history: what to tell it about the last interruption.
    brain_note: Option<String>,
    /// What the caller had heard of the unconfirmed utterances when barge-in stopped the agent
    /// (used if the interruption is committed).
    heard_cut: Option<heard::Cut>,
    greeting_sent: bool,
    /// What the goodbye phase ends in (none: the idle goodbye's hang-up).
    closing: Option<acts::Closing>,
    /// The policy ended the call ([`Action::HangUp`] or [`Action::End`]): nothing is settled
    /// after it.
    ended: bool,
    /// A DTMF action waiting for the carrier.
    dtmf_pending: Option<(u64, String)>,
    /// The caller's keys being collected into one turn, and their rate limit.
    keypad: keypad::Keypad,
    /// The speech-to-text ends turns itself ([`Input::EndOfTurn`]): our endpointer only
    /// listens.
    stt_turns: bool,
    /// A brain request started on an eager end of turn, whose reply is held back.
    speculation: Option<Speculation>,
    /// The speech-to-text's end of turn on words that cannot end there, waiting for the rest.
    stt_held: Option<stt_turns::SttHeld>,
    /// The end-of-turn model's judgement of the current pause (none without a model).
    gate: eot::TurnGate,
    /// The caller's current voiced run over agent audio, for the barge-in hold.
    burst: hold::Burst,
    /// Words of a caller turn that ended while the agent was stopped, too few to decide
    /// ("wait," before a pause and "stop"): they count with the next words and start the next
    /// turn; a resume forgets them.
    barge_words: String,
    /// The actions of the input being handled, in order.
    out: Vec<Action>,
    /// Actions queued for the actor ([`Policy::poll_action`]).
    pending: VecDeque<Action>,
    /// The time of the last input handled.
    last_now: Instant,
    /// The brain's first failure since it last answered (`brain_down_hangup_s`).
    brain_down_since: Option<Instant>,
    /// The jitter of the brain's retry backoff.
    jitter: retry::Jitter,
    /// A machine answered: the voicemail message waits for its greeting to end
    /// (`voicemail.rs`).
    voicemail: Option<voicemail::Voicemail>,
}

/// A speculative brain request: the text it was started on and the reply events held back
/// until the turn really ends. None of it is ever spoken unless the turn ends on that text.
struct Speculation {
    text: String,
    events: Vec<LlmEvent>,
}

impl Policy {
    /// A policy for a call created at `now`; `stt_endpointing_ms` is the speech-to-text's own
    /// endpointing silence (see [`Endpointer::with_stt_endpointing`]).
    pub(crate) fn new(
        agent: Arc<AgentConfig>,
        stt_endpointing_ms: u64,
        brain_keeps_history: bool,
        now: Instant,
    ) -> Self {
        let keypad = keypad::Keypad::new(&agent, now);
        Self {
            keypad,
            endpointer: Endpointer::new(agent.min_endpointing_ms, agent.max_endpointing_ms)
                .with_stt_endpointing(stt_endpointing_ms)
                .with_stt_eou_override(agent.stt_eou_override_ms)
                .with_unfinished_hold(agent.unfinished_hold_ms)
                .with_number_shapes(NumberShapes::new(
                    agent.phone_country.as_deref(),
                    &agent.expected_number_lengths,
                    &agent.system_prompt,
                )),
            words: Words::new(&agent.backchannel_words),
            agent,
            brain_keeps_history,
            phase: Phase::Idle,
            brain: false,
            answered: None,
            eot_at: None,
            caller_speaking: false,
            held_turn: None,
            last_activity: now,
            nudges: 0,
            turn: None,
            turns: 0,
            chunker: SentenceChunker::new(),
            history: Vec::new(),
            transcript: Vec::new(),
            brain_note: None,
            heard_cut: None,
            greeting_sent: false,
            closing: None,
            ended: false,
            dtmf_pending: None,
            stt_turns: false,
            speculation: None,
            stt_held: None,
            gate: eot::TurnGate::new(None),
            burst: hold::Burst::default(),
            barge_words: String::new(),
            out: Vec::new(),
            pending: VecDeque::new(),
            last_now: now,
            brain_down_since: None,
            jitter: retry::Jitter::new(0x5EED),
            voicemail: None,
        }
    }

    /// The seed of the brain retries' jitter (the actor gives each call its own, so calls
    /// that lost the brain together do not all retry at the same instants).
    pub(crate) fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter = retry::Jitter::new(seed);
        self
    }

    /// The speech-to-text decides the end of turns itself (see
    /// [`crate::provider::SttProvider::ends_turns`]).
    pub(crate) fn with_stt_turns(mut self, yes: bool) -> Self {
        self.stt_turns = yes;
        self
    }

    /// An end-of-turn model judges the caller's pauses (see `policy/eot.rs`).
    pub(crate) fn with_turn_model(mut self, timing: Option<TurnModelTiming>) -> Self {
        self.gate = eot::TurnGate::new(timing);
        self
    }

    #[cfg(test)]
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// The transcript so far (what was said, and what the caller heard of the agent).
    pub(crate) fn transcript(&self) -> &[TranscriptEntry] {
        &self.transcript
    }

    /// The chat history the brain is given.
    #[cfg(test)]
    pub(crate) fn history(&self) -> &[ChatMessage] {
        &self.history
    }

    /// Caller keys not acted on (over the keypad's rate limit).
    pub(crate) fn dtmf_dropped(&self) -> u64 {
        self.keypad.dropped()
    }

    /// Caller turns sent to the brain so far.
    pub(crate) fn turns(&self) -> u64 {
        self.turns
    }

    /// The brain works on a speculative reply (an eager end of turn, not yet committed).
    pub(crate) fn is_speculating(&self) -> bool {
        self.speculation.is_some()
    }

    /// Applies one input at `now` and queues what the actor must do, in order, before any
    /// actions still pending (see the driving rule in the module docs); take them with
    /// [`Policy::poll_action`].
    pub(crate) fn handle(&mut self, input: Input, now: Instant, mouth: &mut Mouth) {
        self.last_now = now;
        self.refresh(mouth);
        self.apply(input, now, mouth);
        self.refresh(mouth);
        self.note_end();
        if !self.ended {
            self.settle(now, mouth);
            self.refresh(mouth);
            self.note_end();
        }
        let cancelled = mouth.take_cancelled();
        if !cancelled.is_empty() {
            self.out.push(Action::CancelSynthesis(cancelled));
        }
        for action in self.out.drain(..).rev() {
            self.pending.push_front(action);
        }
    }

    /// The next action to carry out; `None` when there is none until the next input.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.pending.pop_front()
    }

    fn apply(&mut self, input: Input, now: Instant, mouth: &mut Mouth) {
        match input {
            Input::Start => {
                let greeting = self.agent.first_message.trim().to_string();
                if !greeting.is_empty() {
                    self.enqueue(UttKind::Greeting, &greeting, now, mouth);
                }
            }
            Input::Answered => self.answered = Some(now),
            Input::Machine {
                message,
                greeting_over,
            } => self.on_machine(&message, greeting_over, now, mouth),
            Input::Beep { freq_hz, length_ms } => self.on_beep(freq_hz, length_ms, now, mouth),
            Input::Vad { event, audio_ms } => self.on_vad(event, audio_ms, now, mouth),
            Input::CallerAudio {
                speech_run_ms,
                span_ms,
                pitched_ms,
                echo_ms,
            } => {
                let run = hold::Run {
                    voiced_ms: speech_run_ms,
                    span_ms,
                    pitched_ms,
                    echo_ms,
                };
                self.check_barge_in(run, now, mouth)
            }
            Input::Interim(text) => {
                self.endpointer.on_interim(&text, now);
                self.on_caller_words(now, mouth);
            }
            Input::Final {
                text,
                speech_final,
                from_finalize,
            } => {
                self.endpointer
                    .on_final(&text, speech_final, from_finalize, now);
                self.on_caller_words(now, mouth);
                // Only a backchannel so far: release the hold for the rest of this burst.
                let heard = self.endpointer.text();
                if self.burst.held_at().is_some()
                    && mouth.is_held()
                    && !heard.trim().is_empty()
                    && self.words.content_words(&heard) == 0
                {
                    self.release_hold("backchannel", now, mouth);
                }
            }
            Input::UtteranceEnd => {
                self.endpointer.on_utterance_end(now);
                self.check_end_of_turn(now, mouth);
            }
            Input::EagerEndOfTurn(text) => self.speculate(text, mouth),
            Input::TurnResumed => self.cancel_speculation("turn_resumed"),
            Input::EndOfTurn(text) => self.on_stt_end_of_turn(text, now, mouth),
            Input::Llm(ev) => match self.speculation.as_mut() {
                Some(spec) => {
                    if matches!(
                        ev,
                        LlmEvent::Done | LlmEvent::Error(_) | LlmEvent::Unavailable { .. }
                    ) {
                        self.out.push(Action::CancelBrain);
                    }
                    spec.events.push(ev);
                }
                None => self.on_llm(ev, now, mouth),
            },
            Input::Mark(name) => self.on_mark(&name, now, mouth),
            Input::Started(started) => self.on_started(&started, now),
            Input::Dtmf(d) => self.on_dtmf(d, now, mouth),
            Input::Say(text) => self.enqueue(UttKind::Say, &text, now, mouth),
            Input::Act { id, action } => self.act(id, action, now, mouth),
            Input::ActionDone { id, result } => self.action_done(id, result, now, mouth),
            Input::StreamStopped => {
                if let Some(id) = self.transfer_requested() {
                    self.action_done(id, ActionResult::Done, now, mouth);
                }
            }
            Input::Timer => self.on_timer(now, mouth),
            Input::Synthesis { id, event } => self.on_synthesis(id, event, mouth),
            Input::SttChanged { ends_turns } => {
                self.stt_turns = ends_turns;
                if !ends_turns && let Some(held) = self.stt_held.take() {
                    // The new speech-to-text knows nothing of the held words: they are a turn.
                    self.event(EventKind::TurnEnd, TurnEnd::SttEndOfTurn.as_str());
                    self.caller_turn(held.text, TurnEnd::SttEndOfTurn, now, mouth);
                }
            }
            Input::TurnModel(answer) => self.on_turn_model(answer, now, mouth),
        }
    }

    /// Our detector heard the caller start or stop speaking (`audio_ms`: the audio time it has
    /// judged, so the event's audio times become wall times by their lag behind it).
    fn on_vad(&mut self, event: VadEvent, audio_ms: u64, now: Instant, mouth: &mut Mouth) {
        let at = |t: u64| {
            let lag = Duration::from_millis(audio_ms.saturating_sub(t));
            now.checked_sub(lag).unwrap_or(now)
        };
        self.last_activity = now;
        match event {
            VadEvent::SpeechStart { onset_ms } => {
                self.caller_speaking = true;
                self.voicemail_speech(true, at(onset_ms));
                self.endpointer.on_speech_start(at(onset_ms));
                self.gate.on_speech_start();
                self.eot_at = None;
                self.event(EventKind::SpeechStart, format!("audio_ms={onset_ms}"));
            }
            VadEvent::SpeechEnd {
                onset_ms,
                last_voiced_ms,
            } => {
                self.caller_speaking = false;
                self.voicemail_speech(false, at(last_voiced_ms));
                self.endpointer.on_speech_end(at(last_voiced_ms));
                let length_ms = last_voiced_ms.saturating_sub(onset_ms);
                self.event(
                    EventKind::SpeechEnd,
                    format!("audio_ms={last_voiced_ms} length_ms={length_ms}"),
                );
                self.check_end_of_turn(now, mouth);
            }
        }
    }

    /// The earliest time the policy wants an [`Input::Timer`]: the filler, the brain's retry,
    /// the end of turn, the barge-in decision, the idle nudge or the end of the goodbye; the
    /// last input's time
    /// when a held turn or the goodbye's end became due outside a step.
    pub(crate) fn deadline(&self, mouth: &Mouth) -> Option<Instant> {
        let phase_at = match self.phase {
            Phase::BargeIn { deadline, .. } => Some(deadline),
            Phase::Goodbye { until } => Some(until),
            _ => None,
        };
        let hold_at = mouth
            .is_held()
            .then(|| self.burst.release_at(self.hold_limit()))
            .flatten();
        [
            self.settle_due(mouth).then_some(self.last_now),
            self.filler_deadline(mouth),
            self.retry_deadline(),
            self.eot_at,
            self.keypad.deadline(),
            phase_at,
            hold_at,
            self.idle_deadline(mouth),
            self.voicemail_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Follows the mouth and the brain in the phases the policy does not hold itself.
    fn refresh(&mut self, mouth: &Mouth) {
        if matches!(self.phase, Phase::BargeIn { .. } | Phase::Goodbye { .. }) {
            return;
        }
        self.phase = if mouth.is_speaking() {
            Phase::Speaking
        } else if self.brain {
            Phase::Thinking
        } else {
            Phase::Idle
        };
    }

    fn event(&mut self, kind: EventKind, detail: impl Into<EventDetail>) {
        self.out.push(Action::Event(kind, detail.into()));
    }

    fn persist(&mut self, i: usize) {
        self.out.push(Action::Persist(i));
    }

    fn answered_ms(&self, t: Instant) -> u64 {
        self.answered
            .map(|a| t.saturating_duration_since(a).as_millis() as u64)
            .unwrap_or(0)
    }

    fn on_mark(&mut self, name: &str, now: Instant, mouth: &mut Mouth) {
        let Some(sent) = mouth.mark_returned(name, now) else {
            return;
        };
        self.last_activity = now;
        let end = self.answered_ms(now);
        if let Some(e) = self.transcript.get_mut(sent.entry) {
            if !e.heard_text.is_empty() {
                e.heard_text.push(' ');
            }
            e.heard_text.push_str(&sent.text);
            e.end_ms = end;
        }
        self.persist(sent.entry);
        self.event(EventKind::MarkPlayed, name);
    }

    fn check_end_of_turn(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.stt_turns {
            // The speech-to-text's EndOfTurn decides (unless our rules held its words).
            self.stt_hold_due(now, mouth);
            return;
        }
        match self.decide_turn(now) {
            Decision::Wait(at) => self.eot_at = at,
            Decision::Finalize => {
                self.eot_at = None;
                self.out.push(Action::Finalize);
                self.event(EventKind::FinalizeSent, "");
                // The answer to Finalize (or the maximum) decides.
                if let Decision::Wait(at) = self.decide_turn(now) {
                    self.eot_at = at;
                }
            }
            Decision::Commit {
                text,
                reason,
                silence_ms,
            } => {
                self.eot_at = None;
                self.event(
                    EventKind::TurnEnd,
                    format!("{reason} silence_ms={silence_ms}"),
                );
                self.caller_turn(text, reason, now, mouth);
            }
        }
    }

    fn on_timer(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.filler_deadline(mouth).is_some_and(|t| t <= now) {
            self.filler("slow", now, mouth);
        }
        self.retry_due(now);
        if self.eot_at.is_some_and(|t| t <= now) {
            self.eot_at = None;
            self.check_end_of_turn(now, mouth);
        }
        self.keypad_timer(now, mouth);
        self.voicemail_timer(now, mouth);
        if let Phase::BargeIn {
            at,
            deadline,
            bound,
        } = self.phase
            && deadline <= now
        {
            // Held words of an interruption whose rest is being said (the caller spoke again
            // since, or the speech-to-text has new words): wait for it, once, up to twice the
            // window but never past the bound.
            let longest =
                (at + Duration::from_millis(2 * self.agent.barge_in_confirm_ms)).min(bound);
            let more_coming = !self.barge_words.is_empty()
                && (self.caller_speaking
                    || self.endpointer.has_text()
                    || self.endpointer.started().is_some());
            if more_coming && deadline < longest {
                self.phase = Phase::BargeIn {
                    at,
                    deadline: longest,
                    bound,
                };
            } else if more_coming {
                // The bound: a real word stopped the agent and the caller is still going.
                self.take_barge_turn(now, mouth);
            } else {
                self.resume("no_words", now, mouth);
            }
        }
        // The hold's own limit, when no caller audio came to judge it (the media stalled).
        if mouth.is_held()
            && self
                .burst
                .release_at(self.hold_limit())
                .is_some_and(|t| t <= now)
        {
            self.release_hold("too_long", now, mouth);
        }
        self.refresh(mouth);
        if self.idle_deadline(mouth).is_some_and(|t| t <= now) {
            self.idle(now, mouth);
        }
        // The goodbye's own deadline is checked by `settle`.
    }

    /// Notes that the actions so far end the call.
    fn note_end(&mut self) {
        self.ended |= self
            .out
            .iter()
            .any(|a| matches!(a, Action::HangUp(_) | Action::End(_)));
    }

    /// [`Policy::settle`] would act now.
    fn settle_due(&self, mouth: &Mouth) -> bool {
        if self.ended {
            return false;
        }
        let turn =
            (self.held_turn.is_some() && !self.brain && !mouth.is_speaking()) || self.keypad_due();
        let goodbye = matches!(self.phase, Phase::Goodbye { .. })
            && self.transfer_requested().is_none()
            && !mouth.is_speaking();
        turn || goodbye
    }

    /// A held turn whose time has come is taken; the goodbye ends when it has played (at the
    /// end of every step).
    fn settle(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.held_turn.is_some()
            && !self.brain
            && !mouth.is_speaking()
            && let Some((text, reason)) = self.held_turn.take()
        {
            self.caller_turn(text, reason, now, mouth);
        }
        self.keypad_turn(now, mouth);
        if let Phase::Goodbye { until } = self.phase {
            // A transfer the carrier was asked for waits for its answer (or the deadline).
            let waiting = self.transfer_requested().is_some();
            if now >= until || (!waiting && !mouth.is_speaking()) {
                self.close(now, mouth);
            }
        }
    }

    fn idle_deadline(&self, mouth: &Mouth) -> Option<Instant> {
        let after = self.agent.idle_nudge_after_s;
        if after <= 0.0
            || self.answered.is_none()
            || self.voicemail.is_some()
            || !matches!(self.phase, Phase::Idle)
            || mouth.is_speaking()
            || self.held_turn.is_some()
            || self.caller_speaking
            || self.endpointer.has_text()
            || self.keypad.collecting()
        {
            return None;
        }
        Some(self.last_activity + Duration::from_secs_f64(after))
    }

    /// How a caller turn relates to what the agent is doing.
    fn overlap(&self, mouth: &Mouth) -> Overlap {
        let agent = &self.agent;
        let replying = self.brain
            || mouth.any_audio_for(|k| !matches!(k, UttKind::Greeting))
            || mouth.queued().any(|u| !matches!(u.kind, UttKind::Greeting));
        let greeting = mouth.is_speaking() && !replying;
        if !replying && !greeting {
            return Overlap::Free;
        }
        if !agent.barge_in {
            return if replying {
                Overlap::Hold
            } else {
                Overlap::Queue
            };
        }
        if greeting && !agent.greeting_interruptible {
            return Overlap::Queue;
        }
        Overlap::Cut
    }

    /// The caller finished a turn (`reason` says how we knew). Backchannels and echo over a
    /// busy agent are dropped; otherwise the agent is cut (if allowed) and the brain asked.
    fn caller_turn(&mut self, text: String, reason: TurnEnd, now: Instant, mouth: &mut Mouth) {
        if self.awaits_beep() {
            // A machine's greeting: words for the transcript, never a turn.
            if reason != TurnEnd::Dtmf {
                self.greeting_words(text, now);
            }
            return;
        }
        if self.closing.is_some() {
            // The call is being ended or transferred: nothing the caller says changes that.
            self.event(EventKind::TurnHeld, "closing");
            return;
        }
        let dtmf = reason == TurnEnd::Dtmf;
        let text = if dtmf {
            text
        } else {
            join_words(&std::mem::take(&mut self.barge_words), &text)
        };
        let overlap = self.overlap(mouth);
        let barge = matches!(self.phase, Phase::BargeIn { .. });
        let busy = !matches!(overlap, Overlap::Free) || barge;
        if busy && !dtmf {
            let ignored = if self.words.is_echo(&text, &self.agent_said_lately(mouth)) {
                Some(EventKind::EchoIgnored)
            } else if self.words.content_words(&text) < self.agent.barge_in_min_words as usize {
                Some(EventKind::BackchannelIgnored)
            } else {
                None
            };
            if let Some(kind) = ignored {
                if kind == EventKind::BackchannelIgnored
                    && self.short_interruption(&text, barge, now, mouth)
                {
                    return;
                }
                self.event(kind, text);
                self.resume(kind.as_str(), now, mouth);
                return;
            }
        }
        match overlap {
            Overlap::Hold if !dtmf => {
                self.event(EventKind::TurnHeld, "");
                self.held_turn = Some((text, reason));
                return;
            }
            Overlap::Cut | Overlap::Hold => {
                if barge {
                    self.event(EventKind::BargeInCommit, "turn_end");
                }
                self.interrupt(now, mouth);
            }
            Overlap::Queue | Overlap::Free => {
                if barge {
                    self.interrupt(now, mouth);
                }
            }
        }
        self.settle_turn();
        self.nudges = 0;
        self.last_activity = now;
        let start = self.endpointer.started().unwrap_or(now);
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Caller,
            text: text.clone(),
            heard_text: text.clone(),
            interrupted: false,
            start_ms: self.answered_ms(start.min(now)),
            end_ms: self.answered_ms(now),
        });
        self.persist(self.transcript.len() - 1);
        self.turns += 1;
        let said = text.clone();
        let content = match self.brain_note.take() {
            Some(note) => format!("{note} {text}"),
            None => text,
        };
        self.history.push(ChatMessage {
            role: Role::User,
            content,
        });
        self.forget_old_turns();
        let speculated = match self.speculation.take() {
            Some(spec) if spec.text == said => Some(spec.events),
            Some(_) => {
                self.event(EventKind::SpeculationCancelled, "text_changed");
                None
            }
            None => None,
        };
        if speculated.is_none() {
            // Replaces any stream in flight (a speculation on other words).
            self.out.push(Action::StartBrain {
                history: self.history.clone(),
            });
        }
        self.brain = true;
        self.chunker = SentenceChunker::new();
        self.turn = Some(Turn {
            id: self.turns,
            ended_at: now,
            audio_started: false,
            filler_done: false,
            entry: None,
            reply_text: String::new(),
            keypad: dtmf,
            tools: TurnTools::default(),
            streamed: false,
            retry: None,
        });
        self.event(EventKind::LlmRequest, self.turns.to_string());
        if let Some(events) = speculated {
            self.event(EventKind::SpeculationUsed, events.len().to_string());
            for ev in events {
                self.on_llm(ev, now, mouth);
            }
        }
    }
}

impl Policy {
    /// Keeps the history to the newest `max_history_turns` caller turns (what a request may
    /// carry at most; the request itself is trimmed by `provider::history::bound`).
    fn forget_old_turns(&mut self) {
        let max = usize::try_from(self.agent.max_history_turns.max(1)).unwrap_or(usize::MAX);
        let users = self.history.iter().filter(|m| m.role == Role::User).count();
        if users <= max {
            return;
        }
        let cut = self
            .history
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::User)
            .nth(users - max)
            .map_or(0, |(i, _)| i);
        self.history.drain(..cut);
    }
}

/// `a` then `b`, one space between when both have words.
fn join_words(a: &str, b: &str) -> String {
    match (a.trim(), b.trim()) {
        ("", b) => b.to_string(),
        (a, "") => a.to_string(),
        (a, b) => format!("{a} {b}"),
    }
}
