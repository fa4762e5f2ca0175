//! Agent actions, for the [`Policy`]: what an `end_call`, `transfer_call`, `send_dtmf` or `say`
//! (from the brain's tools, MCP or REST) does to the conversation. The checks are here, so they
//! apply whoever asks: transfers only to the agent's `transfer_allowed` numbers or prefixes after
//! E.164 normalisation (empty: none), DTMF only `0-9 * # A-D` and at most
//! [`dtmf::MAX_DIGITS`]. A refused action never reaches the carrier. Ending and transferring
//! use the goodbye phase: the brain is stopped, what is being said finishes (for a transfer,
//! then the `transfer_message`), caller turns are no longer taken, and then the call is hung up
//! or the carrier is asked to transfer it. DTMF goes through the carrier's command, or when the
//! carrier has none while streaming, as in-band tones queued on the mouth.

use std::time::Duration;

use tokio::time::Instant;

use super::{Action, GOODBYE_GRACE, Phase, Policy};
use crate::audio::dtmf;
use crate::call::action::{ActionOutcome, CallAction};
use crate::call::event::{EndReason, EventKind};
use crate::call::mouth::{Mouth, UttKind};
use crate::carrier::ActionResult;
use crate::security::mask_number;

/// Longest wait for the carrier to answer a transfer request before the call goes on.
pub(crate) const TRANSFER_WAIT: Duration = Duration::from_secs(15);

/// What the goodbye phase ends in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Closing {
    /// `end_call`: hang up once the current sentence has played.
    End { reason: String },
    /// `transfer_call`: once the handoff line has played, ask the carrier (`requested`), then
    /// wait for its answer.
    Transfer {
        id: u64,
        to: String,
        requested: bool,
    },
    /// The brain has been down for `brain_down_hangup_s`: hang up once `brain_down_message`
    /// has played (`retry.rs`).
    BrainDown,
    /// A machine answered: hang up once the voicemail message has played (`voicemail.rs`).
    Voicemail,
}

fn refused(reason: impl Into<String>) -> ActionOutcome {
    ActionOutcome::Refused {
        reason: reason.into(),
    }
}

impl Policy {
    fn reply(&mut self, id: u64, outcome: ActionOutcome) {
        if let ActionOutcome::Refused { reason } = &outcome {
            self.event(EventKind::ActionRefused, reason.clone());
        }
        self.out.push(Action::Reply { id, outcome });
    }

    /// Why no new action can start now, if it cannot.
    fn busy_closing(&self) -> Option<&'static str> {
        match self.closing {
            Some(Closing::End { .. } | Closing::BrainDown) => Some("the call is already ending"),
            Some(Closing::Voicemail) => Some("the call is leaving a voicemail message"),
            Some(Closing::Transfer { .. }) => Some("the call is already being transferred"),
            None => None,
        }
    }

    /// An action asked for by the agent (tools, MCP, REST).
    pub(super) fn act(&mut self, id: u64, action: CallAction, now: Instant, mouth: &mut Mouth) {
        match action {
            CallAction::EndCall { reason } => self.end_call(id, reason, now, mouth),
            CallAction::Transfer { to } => self.transfer(id, &to, now, mouth),
            CallAction::SendDtmf { digits } => self.send_dtmf(id, &digits),
            CallAction::Say { text } => {
                if let Some(why) = self.busy_closing() {
                    return self.reply(id, refused(format!("not said: {why}")));
                }
                if text.trim().is_empty() {
                    return self.reply(id, refused("there is nothing to say: the text is empty"));
                }
                self.enqueue(UttKind::Say, &text, now, mouth);
                self.reply(
                    id,
                    ActionOutcome::Done {
                        detail: "queued; it is spoken after what is being said".into(),
                    },
                );
            }
        }
    }

    /// Stops the reply in progress: the brain is cancelled and only what is being said (or,
    /// when nothing is, the next thing queued) is kept.
    pub(super) fn wind_down(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.brain {
            self.brain = false;
            self.out.push(Action::CancelBrain);
            if !mouth.is_speaking()
                && let Some(rest) = self.chunker.finish()
            {
                // A last sentence the brain had not finished with punctuation yet.
                self.reply_sentence(&rest, now, mouth);
            }
        }
        // A barge-in may have paused the mouth: what is kept plays (from its sentence's start).
        mouth.resume();
        mouth.keep_current();
        self.held_turn = None;
    }

    fn end_call(&mut self, id: u64, reason: String, now: Instant, mouth: &mut Mouth) {
        if let Some(Closing::Transfer { .. }) = self.closing {
            return self.reply(id, refused("the call is being transferred"));
        }
        let reason = match reason.trim() {
            "" => "the agent ended the call".to_string(),
            r => r.chars().take(200).collect(),
        };
        self.event(EventKind::EndCall, reason.clone());
        self.wind_down(now, mouth);
        self.closing = Some(Closing::End { reason });
        self.phase = Phase::Goodbye {
            until: now + GOODBYE_GRACE,
        };
        self.reply(
            id,
            ActionOutcome::Done {
                detail: "the call ends after the current sentence".into(),
            },
        );
    }

    fn transfer(&mut self, id: u64, to: &str, now: Instant, mouth: &mut Mouth) {
        if let Some(why) = self.busy_closing() {
            return self.reply(id, refused(format!("not transferred: {why}")));
        }
        if self.answered.is_none() {
            return self.reply(id, refused("the call has not been answered yet"));
        }
        let to = match self.agent.transfer_target(to) {
            Ok(to) => to,
            Err(e) => return self.reply(id, refused(format!("transfer refused: {e}"))),
        };
        self.event(EventKind::TransferStart, mask_number(&to));
        self.wind_down(now, mouth);
        // The handoff line comes at once: what was being said is cut.
        let cleared = mouth.clear(now);
        if cleared.need_clear {
            self.out.push(Action::Clear);
        }
        let handoff = self.agent.transfer_message.clone();
        if !handoff.trim().is_empty() {
            self.enqueue(UttKind::Say, &handoff, now, mouth);
        }
        self.closing = Some(Closing::Transfer {
            id,
            to,
            requested: false,
        });
        self.phase = Phase::Goodbye {
            until: now + GOODBYE_GRACE,
        };
    }

    fn send_dtmf(&mut self, id: u64, digits: &str) {
        if let Some(why) = self.busy_closing() {
            return self.reply(id, refused(format!("no digits sent: {why}")));
        }
        if self.answered.is_none() {
            return self.reply(id, refused("the call has not been answered yet"));
        }
        if self.dtmf_pending.is_some() {
            return self.reply(
                id,
                refused("digits are still being sent; wait for them to finish"),
            );
        }
        let digits = match dtmf::parse_digits(digits) {
            Ok(d) => d,
            Err(e) => return self.reply(id, refused(format!("no digits sent: {e}"))),
        };
        self.dtmf_pending = Some((id, digits.clone()));
        self.out.push(Action::SendDtmf { id, digits });
    }

    /// The goodbye phase is over (what was being said has played, or its time ran out).
    pub(super) fn close(&mut self, now: Instant, mouth: &mut Mouth) {
        match self.closing.take() {
            None => {
                self.event(EventKind::IdleHangUp, "");
                self.out.push(Action::HangUp(EndReason::CallerSilent));
            }
            Some(Closing::End { reason }) => {
                self.event(EventKind::HangUp, reason.clone());
                self.out.push(Action::HangUp(EndReason::HungUp(reason)));
            }
            Some(Closing::BrainDown) => {
                self.event(EventKind::HangUp, EndReason::BrainDown.text());
                self.out.push(Action::HangUp(EndReason::BrainDown));
            }
            Some(Closing::Voicemail) => self.voicemail_left(),
            Some(Closing::Transfer {
                id,
                to,
                requested: false,
            }) => {
                // The handoff line has played (or ran out of time): stop anything left and
                // hand the call to the carrier.
                let cleared = mouth.clear(now);
                if cleared.need_clear {
                    self.out.push(Action::Clear);
                }
                self.out.push(Action::Transfer { id, to: to.clone() });
                self.closing = Some(Closing::Transfer {
                    id,
                    to,
                    requested: true,
                });
                self.phase = Phase::Goodbye {
                    until: now + TRANSFER_WAIT,
                };
            }
            Some(Closing::Transfer {
                id,
                requested: true,
                ..
            }) => {
                let why = "the carrier did not confirm the transfer in time; the call goes on";
                self.event(EventKind::TransferFailed, why);
                self.reply(id, ActionOutcome::Failed { reason: why.into() });
                self.reopen(now, mouth);
            }
        }
    }

    /// Back to the conversation after a failed transfer.
    fn reopen(&mut self, now: Instant, mouth: &mut Mouth) {
        self.closing = None;
        self.phase = Phase::Idle;
        self.last_activity = now;
        self.refresh(mouth);
    }

    /// The id of the transfer the carrier has been asked for, if one is in flight.
    pub(super) fn transfer_requested(&self) -> Option<u64> {
        match self.closing {
            Some(Closing::Transfer {
                id,
                requested: true,
                ..
            }) => Some(id),
            _ => None,
        }
    }

    /// The carrier answered an action the policy asked for.
    pub(super) fn action_done(
        &mut self,
        id: u64,
        result: ActionResult,
        now: Instant,
        mouth: &mut Mouth,
    ) {
        if let Some((pending, digits)) = self.dtmf_pending.take() {
            if pending == id {
                return self.dtmf_done(id, digits, result, now, mouth);
            }
            self.dtmf_pending = Some((pending, digits));
        }
        let Some(Closing::Transfer {
            id: tid,
            to,
            requested: true,
        }) = self.closing.clone()
        else {
            return;
        };
        if tid != id {
            return;
        }
        match result {
            ActionResult::Done => {
                self.event(EventKind::Transferred, mask_number(&to));
                self.reply(
                    id,
                    ActionOutcome::Done {
                        detail: format!("the caller is being transferred to {to}"),
                    },
                );
                self.closing = None;
                self.out.push(Action::End(EndReason::Transferred(to)));
            }
            ActionResult::InBand | ActionResult::Failed(_) => {
                let why = match result {
                    ActionResult::Failed(why) => why,
                    _ => "the carrier cannot transfer this call".to_string(),
                };
                self.event(EventKind::TransferFailed, why.clone());
                self.reply(
                    id,
                    ActionOutcome::Failed {
                        reason: format!("the transfer failed: {why}; the call goes on"),
                    },
                );
                self.reopen(now, mouth);
            }
        }
    }

    fn dtmf_done(
        &mut self,
        id: u64,
        digits: String,
        result: ActionResult,
        now: Instant,
        mouth: &mut Mouth,
    ) {
        match result {
            ActionResult::Failed(why) => {
                self.event(EventKind::DtmfOut, format!("{digits} failed: {why}"));
                self.reply(
                    id,
                    ActionOutcome::Failed {
                        reason: format!("the digits were not sent: {why}"),
                    },
                );
            }
            ActionResult::Done => {
                self.event(EventKind::DtmfOut, format!("{digits} command"));
                self.reply(
                    id,
                    ActionOutcome::Done {
                        detail: format!("sent the digits {digits}"),
                    },
                );
            }
            ActionResult::InBand => {
                self.event(EventKind::DtmfOut, format!("{digits} in_band"));
                let label = format!("[DTMF {digits}]");
                let entry = self.agent_entry(&label, now);
                mouth.push_audio(
                    UttKind::Dtmf,
                    label.clone(),
                    entry,
                    &dtmf::ulaw_tones(&digits),
                );
                self.speak(UttKind::Dtmf, label, mouth);
                self.reply(
                    id,
                    ActionOutcome::Done {
                        detail: format!(
                            "sending the digits {digits} as tones after what is being said"
                        ),
                    },
                );
            }
        }
    }
}
