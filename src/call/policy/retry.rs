//! The brain's outages, for the [`Policy`]: a turn whose brain request failed before any of
//! the reply came, in a way that may pass ([`LlmEvent::Unavailable`]: no connection, a stream
//! cut before the reply, 429/502/503), is asked again — after a backoff of 250 ms doubling to
//! 2 s, with jitter, or the server's `Retry-After` when that is longer, never past the turn's
//! budget (`brain_retry_s` from the turn's first failure) — while the long-turn filler is
//! spoken once for the turn (not once per retry). Only a turn whose budget is spent hears
//! `llm_error_message`; the next turn tries again. A brain that has answered nothing for
//! `brain_down_hangup_s` (from its first failure since it last answered, across turns) ends the
//! call with `brain_down_message` and [`EndReason::BrainDown`] instead of one more apology. A
//! reply that had started (text, a tool call or its progress) is never asked again: the caller
//! would hear it twice and a tool would run twice.
//!
//! Everything here is decided from the inputs and the time handed to the policy; the jitter
//! comes from a seed the actor gives ([`Policy::with_jitter_seed`]).
//!
//! [`LlmEvent::Unavailable`]: crate::provider::LlmEvent::Unavailable
//! [`EndReason::BrainDown`]: crate::call::event::EndReason::BrainDown

use std::time::Duration;

use tokio::time::Instant;

use super::acts::Closing;
use super::{Action, GOODBYE_GRACE, Phase, Policy};
use crate::call::event::EventKind;
use crate::call::mouth::{Mouth, UttKind};

/// The wait before the first retry of a turn; it doubles with each retry.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest backoff between two retries (a `Retry-After` may ask for more).
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// A turn whose brain request is being retried.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retrying {
    /// The turn's first failure: its budget runs from here.
    since: Instant,
    /// Retries scheduled so far.
    attempts: u32,
    /// When the next request goes out (none while one is in flight).
    next_at: Option<Instant>,
}

/// The backoff's jitter: a small deterministic generator (splitmix64) on the actor's seed.
#[derive(Debug, Clone)]
pub(super) struct Jitter(u64);

impl Jitter {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The wait before retry number `attempt` (0 first): [`RETRY_FIRST`] doubling up to
    /// [`RETRY_MAX`], of which a random half to all ("equal jitter": calls that failed together
    /// do not come back together, and no retry is instant).
    pub(super) fn backoff(&mut self, attempt: u32) -> Duration {
        let base = RETRY_FIRST
            .saturating_mul(1u32 << attempt.min(16))
            .min(RETRY_MAX);
        let half = base / 2;
        let spread = half.as_micros() as u64;
        half + Duration::from_micros(self.next() % (spread + 1))
    }
}

impl Policy {
    /// The brain answered something (text, a tool call or its progress, the end of a reply):
    /// it is up.
    pub(super) fn brain_answered(&mut self) {
        self.brain_down_since = None;
    }

    /// Something of the current turn's reply came: a failure from now on is not retried.
    pub(super) fn reply_streamed(&mut self) {
        if let Some(t) = self.turn.as_mut() {
            t.streamed = true;
        }
    }

    /// When a brain down since `since` ends the call (none: never).
    fn hang_up_at(&self, since: Instant) -> Option<Instant> {
        let after = self.agent.brain_down_hangup_s;
        (after > 0.0).then(|| since + Duration::from_secs_f64(after))
    }

    /// When the next retry of the current turn goes out (none once the turn is no longer the
    /// brain's: the call is ending or being transferred).
    pub(super) fn retry_deadline(&self) -> Option<Instant> {
        if !self.brain || self.closing.is_some() {
            return None;
        }
        self.turn.as_ref()?.retry?.next_at
    }

    /// The brain is unavailable for the current turn: retry within the budget, else give up.
    pub(super) fn brain_unavailable(
        &mut self,
        message: String,
        retry_after: Option<Duration>,
        now: Instant,
        mouth: &mut Mouth,
    ) {
        let fresh = self.turn.as_ref().is_some_and(|t| !t.streamed);
        if !fresh {
            // Part of the reply was said (or there is no turn): asking again would repeat it.
            return self.brain_failed(message, now, mouth);
        }
        let down_since = *self.brain_down_since.get_or_insert(now);
        let hang_up_at = self.hang_up_at(down_since);
        let budget = Duration::from_secs_f64(self.agent.brain_retry_s.max(0.0));
        let backoff_attempt = self
            .turn
            .as_ref()
            .and_then(|t| t.retry)
            .map_or(0, |r| r.attempts);
        let backoff = self.jitter.backoff(backoff_attempt);
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let retry = turn.retry.get_or_insert(Retrying {
            since: now,
            attempts: 0,
            next_at: None,
        });
        let end = match hang_up_at {
            Some(h) => h.min(retry.since + budget),
            None => retry.since + budget,
        };
        if now >= end {
            return self.brain_failed(message, now, mouth);
        }
        // Honour the server's hint, but never past the budget: the last try is at its end.
        let wait = retry_after.map_or(backoff, |r| r.max(backoff));
        let at = (now + wait).min(end);
        retry.attempts += 1;
        retry.next_at = Some(at);
        let attempt = retry.attempts;
        // The dead stream goes; the turn is still the brain's (phase `Thinking`).
        self.out.push(Action::CancelBrain);
        self.event(
            EventKind::LlmRetry,
            format!(
                "attempt={attempt} in_ms={}: {message}",
                at.saturating_duration_since(now).as_millis()
            ),
        );
        self.filler("brain_retry", now, mouth);
    }

    /// A retry whose time has come: the same history goes to the brain again.
    pub(super) fn retry_due(&mut self, now: Instant) {
        if self.retry_deadline().is_none_or(|t| t > now) {
            return;
        }
        let Some(retry) = self.turn.as_mut().and_then(|t| t.retry.as_mut()) else {
            return;
        };
        if retry.next_at.is_none_or(|t| t > now) {
            return;
        }
        retry.next_at = None;
        self.out.push(Action::StartBrain {
            history: self.history.clone(),
        });
    }

    /// The brain failed the turn and will not be asked again for it. Before any of the reply
    /// the brain counts as down; down for `brain_down_hangup_s`, the call ends politely.
    /// Returns true when the call is ending.
    pub(super) fn brain_down_ends_call(&mut self, now: Instant, mouth: &mut Mouth) -> bool {
        let fresh = self.turn.as_ref().is_some_and(|t| !t.streamed);
        if !fresh {
            return false;
        }
        let since = *self.brain_down_since.get_or_insert(now);
        if self.hang_up_at(since).is_none_or(|h| now < h) {
            return false;
        }
        let down_ms = now.saturating_duration_since(since).as_millis();
        self.event(EventKind::BrainDown, format!("down_ms={down_ms}"));
        self.brain = false;
        mouth.drop_unstarted(|k| matches!(k, UttKind::Filler { .. }));
        self.wind_down(now, mouth);
        let turn_id = self.turn.as_ref().map_or(0, |t| t.id);
        let msg = self.agent.brain_down_message.clone();
        if !msg.trim().is_empty() {
            self.enqueue(UttKind::Error { turn: turn_id }, &msg, now, mouth);
        }
        self.closing = Some(Closing::BrainDown);
        self.phase = Phase::Goodbye {
            until: now + GOODBYE_GRACE,
        };
        true
    }
}
