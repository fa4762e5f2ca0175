//! Voicemail, for the [`Policy`]: a call we placed that the carrier's machine detection says a
//! machine answered ([`Input::Machine`]). The conversation stops for good (no greeting, no
//! brain, caller turns only written to the transcript — they are the machine's greeting — no
//! barge-in, no idle nudges) and the voicemail message is queued on the mouth at once, held,
//! so its synthesis is ready when the greeting ends. It is let go at the first of:
//!
//! - the greeting's beep, heard in-band by the caller-audio stage ([`Input::Beep`], reported
//!   once the tone has ended, so the message never starts during it);
//! - the carrier saying the greeting ended (`Input::Machine` with `greeting_over`);
//! - [`SILENCE_AFTER_GREETING`] of quiet after the greeting's speech (a greeting without a
//!   beep), [`NO_GREETING`] without hearing any speech at all, or [`LONGEST_WAIT`] in any case.
//!
//! The message then plays to its end (the goodbye phase with [`Closing::Voicemail`]) and the
//! call is hung up once its mark is back ([`EndReason::VoicemailLeft`]).

use std::time::Duration;

use tokio::time::Instant;

use super::acts::Closing;
use super::{Action, Phase, Policy};
use crate::call::event::{EndReason, EventKind};
use crate::call::mouth::{Mouth, UttKind};
use crate::call::transcript::{Speaker, TranscriptEntry};

/// Quiet after the greeting's last speech that counts as its end when no beep came.
pub(crate) const SILENCE_AFTER_GREETING: Duration = Duration::from_millis(3000);
/// How long to wait for a greeting when nothing has been heard at all.
pub(crate) const NO_GREETING: Duration = Duration::from_secs(8);
/// The longest wait for the end of a greeting, however it goes on.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(45);
/// The longest the message may take to play before the call is hung up anyway.
pub(crate) const LONGEST_MESSAGE: Duration = Duration::from_secs(120);

/// A call a machine answered.
#[derive(Debug)]
pub(super) struct Voicemail {
    /// When the machine was reported.
    since: Instant,
    /// The greeting's speech was heard.
    heard: bool,
    /// When the greeting last went quiet (`None` while it speaks).
    quiet_since: Option<Instant>,
    /// The message has been let go.
    started: bool,
}

/// Why the message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cue {
    Beep,
    Carrier,
    Silence,
    NoGreeting,
    Timeout,
}

impl Cue {
    fn as_str(self) -> &'static str {
        match self {
            Cue::Beep => "beep",
            Cue::Carrier => "carrier",
            Cue::Silence => "silence",
            Cue::NoGreeting => "no_greeting",
            Cue::Timeout => "timeout",
        }
    }
}

impl Policy {
    /// A machine answered (see the module docs); `greeting_over`: the carrier heard its
    /// greeting end.
    pub(super) fn on_machine(
        &mut self,
        message: &str,
        greeting_over: bool,
        now: Instant,
        mouth: &mut Mouth,
    ) {
        if self.voicemail.is_none() {
            if self.closing.is_some() {
                // Already ending or transferring: nothing to leave.
                return;
            }
            self.event(
                EventKind::MachineDetected,
                if greeting_over {
                    "greeting_ended"
                } else {
                    "greeting"
                },
            );
            self.leave_conversation(now, mouth);
            self.voicemail = Some(Voicemail {
                since: now,
                heard: false,
                quiet_since: Some(now),
                started: false,
            });
            self.enqueue(UttKind::Voicemail, message, now, mouth);
            mouth.hold();
        }
        if greeting_over {
            self.leave_message(Cue::Carrier, String::new(), now, mouth);
        }
    }

    /// Everything of the conversation goes: the greeting (and its transcript entry, when it
    /// never played), any reply, held turn or speculation.
    fn leave_conversation(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.brain {
            self.brain = false;
            self.out.push(Action::CancelBrain);
        }
        self.cancel_speculation("machine");
        self.turn = None;
        self.held_turn = None;
        self.burst.end_hold(false);
        let cleared = mouth.clear(now);
        if cleared.need_clear {
            self.out.push(Action::Clear);
        }
        if !self.greeting_sent
            && self
                .transcript
                .iter()
                .all(|e| e.speaker == Speaker::Agent && e.heard_text.is_empty())
        {
            self.transcript.clear();
        }
    }

    /// The greeting's beep ended (`freq_hz`, `length_ms`): the message goes.
    pub(super) fn on_beep(
        &mut self,
        freq_hz: u32,
        length_ms: u64,
        now: Instant,
        mouth: &mut Mouth,
    ) {
        let detail = format!("freq_hz={freq_hz} length_ms={length_ms}");
        if self.voicemail.as_ref().is_some_and(|v| !v.started) {
            self.leave_message(Cue::Beep, detail, now, mouth);
        } else {
            self.event(EventKind::Beep, detail);
        }
    }

    /// Lets the held message go and ends the call once it has played.
    fn leave_message(&mut self, cue: Cue, detail: String, now: Instant, mouth: &mut Mouth) {
        let Some(vm) = self.voicemail.as_mut().filter(|v| !v.started) else {
            return;
        };
        vm.started = true;
        let waited = now.saturating_duration_since(vm.since).as_millis();
        if cue == Cue::Beep {
            self.event(EventKind::Beep, detail);
        }
        self.event(
            EventKind::VoicemailMessage,
            format!("cue={} waited_ms={waited}", cue.as_str()),
        );
        mouth.release();
        self.out.push(Action::Resume);
        self.closing = Some(Closing::Voicemail);
        self.phase = Phase::Goodbye {
            until: now + LONGEST_MESSAGE,
        };
    }

    /// True while the call waits for a machine's greeting to end (the caller-audio stage
    /// listens for the beep).
    pub(crate) fn awaits_beep(&self) -> bool {
        self.voicemail.as_ref().is_some_and(|v| !v.started)
    }

    /// True once a machine answered (the conversation is over).
    pub(crate) fn in_voicemail(&self) -> bool {
        self.voicemail.is_some()
    }

    /// The greeting's speech started or stopped at `at`.
    pub(super) fn voicemail_speech(&mut self, speaking: bool, at: Instant) {
        if let Some(vm) = self.voicemail.as_mut() {
            vm.heard |= speaking;
            vm.quiet_since = (!speaking).then_some(at);
        }
    }

    /// Words of the greeting: written to the transcript as the caller's, never a turn.
    pub(super) fn greeting_words(&mut self, text: String, now: Instant) {
        let start = self.endpointer.started().unwrap_or(now).min(now);
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Caller,
            heard_text: text.clone(),
            text,
            interrupted: false,
            start_ms: self.answered_ms(start),
            end_ms: self.answered_ms(now),
        });
        self.persist(self.transcript.len() - 1);
    }

    /// When the message goes without a beep (see the module docs).
    pub(super) fn voicemail_deadline(&self) -> Option<Instant> {
        let vm = self.voicemail.as_ref().filter(|v| !v.started)?;
        let quiet = match (vm.heard, vm.quiet_since) {
            (true, Some(q)) => Some(q + SILENCE_AFTER_GREETING),
            (false, _) => Some(vm.since + NO_GREETING),
            (true, None) => None,
        };
        [Some(vm.since + LONGEST_WAIT), quiet]
            .into_iter()
            .flatten()
            .min()
    }

    /// The message goes if its time has come.
    pub(super) fn voicemail_timer(&mut self, now: Instant, mouth: &mut Mouth) {
        let Some(at) = self.voicemail_deadline().filter(|t| *t <= now) else {
            return;
        };
        let Some(vm) = self.voicemail.as_ref() else {
            return;
        };
        let cue = if at >= vm.since + LONGEST_WAIT {
            Cue::Timeout
        } else if vm.heard {
            Cue::Silence
        } else {
            Cue::NoGreeting
        };
        self.leave_message(cue, String::new(), now, mouth);
    }

    /// The message has played: hang up.
    pub(super) fn voicemail_left(&mut self) {
        self.event(EventKind::HangUp, EndReason::VoicemailLeft.text());
        self.out.push(Action::HangUp(EndReason::VoicemailLeft));
    }
}
