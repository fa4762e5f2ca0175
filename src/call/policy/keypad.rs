//! The caller's keypad, for the [`Policy`]: DTMF digits are collected into one caller turn
//! (until `#`, `dtmf_inter_digit_ms` without a key, or `dtmf_max_digits` keys), so a string of
//! digits is one brain request, not one per key. Keys are rate-limited per call (a token
//! bucket of `dtmf_max_per_s`, one second's worth deep): a key beyond it is counted
//! ([`Keypad::dropped`]) and not acted on. While the brain is still working on the previous
//! keypad turn, a finished collection waits for it (keys still join it up to the maximum),
//! so the keypad never has more than one brain request in flight. The inter-digit pause is a
//! deadline the policy reports ([`Policy::deadline`]); the time is always handed in.

use super::*;

/// The keypad's state on one call.
#[derive(Debug)]
pub(super) struct Keypad {
    /// Keys collected for the next keypad turn.
    digits: String,
    /// When the collection ends without another key (the inter-digit pause).
    due_at: Option<Instant>,
    /// The collection is complete (`#` or the maximum) and waits for the brain.
    ready: bool,
    /// The rate limit's tokens and when they were last refilled.
    tokens: f64,
    refilled: Instant,
    /// Keys not acted on (over the rate limit, or past the maximum while a turn waits).
    dropped: u64,
}

impl Keypad {
    pub(super) fn new(agent: &AgentConfig, now: Instant) -> Self {
        Self {
            digits: String::new(),
            due_at: None,
            ready: false,
            tokens: bucket_depth(agent),
            refilled: now,
            dropped: 0,
        }
    }

    /// Keys not acted on so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Keys are being collected (no idle nudge meanwhile).
    pub(super) fn collecting(&self) -> bool {
        !self.digits.is_empty()
    }

    /// When the inter-digit pause ends the collection.
    pub(super) fn deadline(&self) -> Option<Instant> {
        if self.ready { None } else { self.due_at }
    }

    /// Takes one token at `now` if the rate limit allows a key.
    fn admit(&mut self, agent: &AgentConfig, now: Instant) -> bool {
        let rate = agent.dtmf_max_per_s.max(1) as f64;
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(bucket_depth(agent));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// 1, 10, 100, …
fn power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

/// The bucket holds one second of keys.
fn bucket_depth(agent: &AgentConfig) -> f64 {
    agent.dtmf_max_per_s.max(1) as f64
}

impl Policy {
    /// The caller pressed `d` at `now`.
    pub(super) fn on_dtmf(&mut self, d: char, now: Instant, mouth: &mut Mouth) {
        let max = self.agent.dtmf_max_digits.max(1) as usize;
        let full = self.keypad.digits.len() >= max;
        if !self.keypad.admit(&self.agent, now) || (self.keypad.ready && full) {
            self.keypad.dropped += 1;
            let n = self.keypad.dropped;
            // 1, 10, 100, …: the timeline notes the excess without growing with it.
            if power_of_ten(n) {
                self.event(EventKind::DtmfDropped, n.to_string());
            }
            return;
        }
        self.last_activity = now;
        self.event(EventKind::Dtmf, d.to_string());
        self.keypad.digits.push(d);
        if d == '#' || self.keypad.digits.len() >= max {
            self.keypad.ready = true;
            self.keypad.due_at = None;
        } else if !self.keypad.ready {
            let pause = Duration::from_millis(self.agent.dtmf_inter_digit_ms);
            self.keypad.due_at = Some(now + pause);
        }
        self.keypad_turn(now, mouth);
    }

    /// The inter-digit pause ended at `now`: the collection is complete.
    pub(super) fn keypad_timer(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.keypad.deadline().is_some_and(|t| t <= now) {
            self.keypad.ready = true;
            self.keypad.due_at = None;
            self.keypad_turn(now, mouth);
        }
    }

    /// The brain is still on the previous keypad turn (its reply stream is open).
    fn keypad_in_flight(&self) -> bool {
        self.brain && self.turn.as_ref().is_some_and(|t| t.keypad)
    }

    /// A complete collection waits for the previous keypad turn's reply stream to end.
    pub(super) fn keypad_due(&self) -> bool {
        self.keypad.ready && !self.keypad_in_flight()
    }

    /// Sends the complete collection as one caller turn, unless the brain is still on the
    /// previous one (then [`Policy::settle`] sends it when that reply stream ends).
    pub(super) fn keypad_turn(&mut self, now: Instant, mouth: &mut Mouth) {
        if !self.keypad_due() {
            return;
        }
        let digits = std::mem::take(&mut self.keypad.digits);
        self.keypad.ready = false;
        self.keypad.due_at = None;
        if digits.is_empty() {
            return;
        }
        self.caller_turn(
            format!("The caller pressed {digits}."),
            TurnEnd::Dtmf,
            now,
            mouth,
        );
    }
}
