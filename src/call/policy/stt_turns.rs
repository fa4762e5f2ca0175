//! The speech-to-text's own end of turn (Deepgram Flux `EndOfTurn`, AssemblyAI's `Turn` with
//! `end_of_turn`), for the [`Policy`]: taken as it comes, unless its words cannot end there
//! ("I want to", "my number is four one five", "j o h n at"). Then our rules veto it: the
//! words are held and we keep listening, for the unfinished-word hold (`unfinished_hold_ms`)
//! or, for a number or an address under way, `max_endpointing_ms`. The next end of turn
//! brings the rest and the two are one turn (the vendor's transcript starts afresh with each
//! of its turns). When the hold runs out with the caller silent, the held words are the turn;
//! with the caller talking, the speech-to-text is asked to end its turn now (`Finalize`:
//! Flux's `ForceEndTurn`, AssemblyAI's `ForceEndpoint`), and whatever it ends on is taken
//! whole, within [`FORCE_GRACE`]. Neither vendor has a message that keeps a turn open, so the
//! veto is ours: a speculative reply on the head is dropped, one on the rest is started on the
//! whole turn.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// After asking the speech-to-text to end its turn, the longest wait for that end before the
/// words there are become the turn.
pub(super) const FORCE_GRACE: Duration = Duration::from_millis(1000);

/// A vetoed end of turn: its words, waiting for the rest.
pub(super) struct SttHeld {
    pub(super) text: String,
    /// When the hold ends.
    until: Instant,
    /// The speech-to-text was asked to end its turn: the next end is taken whole.
    forced: bool,
}

impl Policy {
    /// The speech-to-text ended its turn with `text`.
    pub(super) fn on_stt_end_of_turn(&mut self, text: String, now: Instant, mouth: &mut Mouth) {
        self.endpointer.reset();
        self.eot_at = None;
        let held = self.stt_held.take();
        let forced = held.as_ref().is_some_and(|h| h.forced);
        let text = join_words(held.as_ref().map_or("", |h| h.text.as_str()), text.trim());
        if text.is_empty() {
            self.cancel_speculation("text_changed");
            return;
        }
        let ending = self.endpointer.ending_of(&text);
        if ending.holds() && !forced {
            let until = now + self.endpointer.hold_for(ending);
            self.event(
                EventKind::TurnHeld,
                format!("end_of_turn {}", ending.as_str()),
            );
            self.stt_held = Some(SttHeld {
                text,
                until,
                forced: false,
            });
            self.eot_at = Some(until);
            // A reply started on the head would answer half a sentence.
            self.cancel_speculation("turn_held");
            return;
        }
        self.event(EventKind::TurnEnd, TurnEnd::SttEndOfTurn.as_str());
        self.caller_turn(text, TurnEnd::SttEndOfTurn, now, mouth);
        // A turn that was not taken (a backchannel, held) leaves no speculation.
        self.cancel_speculation("text_changed");
    }

    /// The held words' time has come (the end-of-turn timer with the speech-to-text ending
    /// turns): the turn, or, while the caller talks, ask the speech-to-text to end its turn.
    pub(super) fn stt_hold_due(&mut self, now: Instant, mouth: &mut Mouth) {
        let Some(held) = self.stt_held.as_mut() else {
            return;
        };
        if now < held.until {
            self.eot_at = Some(held.until);
            return;
        }
        let talking = self.caller_speaking || self.endpointer.has_text();
        if talking && !held.forced {
            held.forced = true;
            held.until = now + FORCE_GRACE;
            self.eot_at = Some(held.until);
            self.out.push(Action::Finalize);
            self.event(EventKind::FinalizeSent, "end_of_turn");
            return;
        }
        let Some(held) = self.stt_held.take() else {
            return;
        };
        let text = join_words(&held.text, &self.endpointer.text());
        self.endpointer.reset();
        self.eot_at = None;
        self.event(
            EventKind::TurnEnd,
            format!("{} held", TurnEnd::SttEndOfTurn.as_str()),
        );
        self.caller_turn(text, TurnEnd::SttEndOfTurn, now, mouth);
        self.cancel_speculation("text_changed");
    }

    /// The text a speculative reply on `text` would answer: the held words first.
    pub(super) fn with_held_words(&self, text: &str) -> String {
        match &self.stt_held {
            Some(h) => join_words(&h.text, text),
            None => text.to_string(),
        }
    }
}
