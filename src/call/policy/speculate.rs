//! Speculative replies, for the [`Policy`]: on an eager end of turn (the STT's early signal,
//! before the turn is committed) the brain is started on the words so far with its reply held
//! back; the committed turn either adopts it (same words) or cancels it.

use super::*;

impl Policy {
    /// An eager end of turn: start the brain on `text` now, holding its reply back. Only when
    /// the agent is free and the brain does not keep its own history (a cancelled request
    /// would leave a turn the caller never finished in a Hermes session).
    pub(super) fn speculate(&mut self, text: String, mouth: &Mouth) {
        // The rest of a turn whose head our rules held: the reply is to the whole of it.
        let text = self.with_held_words(text.trim());
        if text.is_empty()
            || self.brain_keeps_history
            || self.voicemail.is_some()
            || self.brain_note.is_some()
            || !matches!(self.overlap(mouth), Overlap::Free)
            || !matches!(self.phase, Phase::Idle)
        {
            return;
        }
        let mut history = self.history.clone();
        history.push(ChatMessage {
            role: Role::User,
            content: text.clone(),
        });
        self.out.push(Action::StartBrain { history });
        self.event(EventKind::SpeculationStart, text.clone());
        self.speculation = Some(Speculation {
            text,
            events: Vec::new(),
        });
    }

    pub(super) fn cancel_speculation(&mut self, why: &str) {
        if self.speculation.take().is_some() {
            self.out.push(Action::CancelBrain);
            self.event(EventKind::SpeculationCancelled, why);
        }
    }
}
