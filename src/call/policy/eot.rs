//! The end-of-turn model gate, for the [`Policy`]: with a model (`[agents.X] turn_model`), each
//! candidate pause (our detector's silence with caller words pending: the detector has heard
//! `vad_stop_ms` of silence, about what pipecat's analyzer is given) is numbered and the actor
//! is asked to have the model judge it ([`Action::AskTurnModel`]); the answer comes back as
//! [`Input::TurnModel`](super::Input::TurnModel). Until it comes (at most
//! [`TurnModelTiming::answer_wait`]) no turn is committed short of `max_endpointing_ms`.
//! "Incomplete" holds the turn for [`TurnModelTiming::incomplete_hold`] of silence (bounded
//! by `max_endpointing_ms`; or until the caller goes on), then the silence rules decide.
//! "Complete" commits once `min_endpointing_ms` of silence passed, on the speech-to-text's end
//! signal or, after sending `Finalize`, at most [`TurnModelTiming::finalize_grace`] later with
//! the words there are — unless the words end on one that usually continues ("I need to"):
//! the speech-to-text's words outrank the audio model there, and the unfinished-word hold
//! applies as without a model. No answer in time, a full queue or a failed model fall back to
//! the [`Endpointer`](super::Endpointer)'s silence rules; an answer about an older pause (the
//! caller resumed) is recorded and ignored. Without a model the endpointer decides alone.

use std::time::Duration;

use tokio::time::Instant;

use super::{Action, Decision, Policy};
use crate::call::eot::{TurnModelAnswer, Verdict};
use crate::call::event::EventKind;
use crate::call::mouth::Mouth;

/// How long the policy waits on the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnModelTiming {
    /// Longest wait for an answer before the silence rules decide the pause.
    pub(crate) answer_wait: Duration,
    /// After "complete" and `min_endpointing_ms`, longest wait for the speech-to-text's end
    /// signal (the answer to our `Finalize`) before committing with the words there are.
    pub(crate) finalize_grace: Duration,
    /// Silence after the caller's speech that a pause judged "incomplete" is held (at most
    /// `max_endpointing_ms`) before the silence rules decide it.
    pub(crate) incomplete_hold: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// This pause has not been judged.
    Idle,
    /// Asked; waiting for the answer until then.
    Asked {
        until: Instant,
    },
    Complete,
    Incomplete,
    /// No judgement: silence decides.
    Silence,
}

/// One call's gate state.
pub(super) struct TurnGate {
    timing: Option<TurnModelTiming>,
    pause: u64,
    state: State,
}

impl TurnGate {
    pub(super) fn new(timing: Option<TurnModelTiming>) -> Self {
        Self {
            timing,
            pause: 0,
            state: State::Idle,
        }
    }

    /// The caller spoke again: the pause is over (a late answer about it is ignored).
    pub(super) fn on_speech_start(&mut self) {
        if self.timing.is_some() {
            self.pause += 1;
            self.state = State::Idle;
        }
    }

    fn turn_over(&mut self) {
        self.pause += 1;
        self.state = State::Idle;
    }
}

impl Policy {
    /// The endpointer's decision, shaped by the model's judgement of this pause.
    pub(super) fn decide_turn(&mut self, now: Instant) -> Decision {
        let d = self.gated(now);
        if matches!(d, Decision::Commit { .. }) {
            self.gate.turn_over();
        }
        d
    }

    fn gated(&mut self, now: Instant) -> Decision {
        let e = &mut self.endpointer;
        let Some(timing) = self.gate.timing else {
            return e.decide(now);
        };
        if !e.has_text() || e.is_speaking() {
            return e.decide(now);
        }
        let quiet = e.quiet_since().unwrap_or(now);
        let min_at = quiet + Duration::from_millis(self.agent.min_endpointing_ms);
        let max_at = quiet + Duration::from_millis(self.agent.max_endpointing_ms);
        if now >= max_at {
            return e.decide(now);
        }
        if self.gate.state == State::Idle {
            self.gate.state = State::Asked {
                until: now + timing.answer_wait,
            };
            self.out.push(Action::AskTurnModel {
                pause: self.gate.pause,
            });
        }
        match self.gate.state {
            State::Asked { until } if now < until => Decision::Wait(Some(until.min(max_at))),
            State::Asked { .. } => {
                self.gate.state = State::Silence;
                let pause = self.gate.pause;
                self.event(EventKind::TurnModel, format!("timeout pause={pause}"));
                self.endpointer.decide(now)
            }
            State::Idle | State::Silence => e.decide(now),
            State::Incomplete => {
                let hold_at = (quiet + timing.incomplete_hold).min(max_at);
                if now < hold_at {
                    Decision::Wait(Some(hold_at))
                } else {
                    e.decide(now)
                }
            }
            // Words that usually continue outrank the audio: the silence rules (with their
            // unfinished-word hold) decide.
            State::Complete if e.ending().holds() => e.decide(now),
            State::Complete => {
                if now < min_at {
                    return Decision::Wait(Some(min_at));
                }
                match e.decide(now) {
                    Decision::Wait(_) => {
                        let grace_at = min_at + timing.finalize_grace;
                        if now >= grace_at || e.stt_done().is_some() {
                            e.commit_now(now)
                        } else if e.take_finalize() {
                            Decision::Finalize
                        } else {
                            Decision::Wait(Some(grace_at))
                        }
                    }
                    d => d,
                }
            }
        }
    }

    /// The model's answer about a pause.
    pub(super) fn on_turn_model(&mut self, a: TurnModelAnswer, now: Instant, mouth: &mut Mouth) {
        if self.gate.timing.is_none() {
            return;
        }
        let current = a.pause == self.gate.pause && matches!(self.gate.state, State::Asked { .. });
        self.event(
            EventKind::TurnModel,
            format!(
                "{} pause={} infer_us={}{}",
                a.verdict,
                a.pause,
                a.micros,
                if current { "" } else { " ignored" }
            ),
        );
        if !current {
            return;
        }
        self.gate.state = match a.verdict {
            Verdict::Complete(_) => State::Complete,
            Verdict::Incomplete(_) => State::Incomplete,
            Verdict::Unavailable(_) => State::Silence,
        };
        self.check_end_of_turn(now, mouth);
    }
}

#[cfg(test)]
mod tests;
