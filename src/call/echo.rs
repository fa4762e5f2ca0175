//! Where the agent's played audio meets the caller's audio for echo detection
//! ([`crate::audio::echo`]). The pacer ([`super::speech`]) writes the level of every frame it
//! sends into the call's [`EchoReference`] at the moment the carrier will play it (its pacing
//! clock), and takes back what a `clear` drops; the caller-audio stage
//! ([`super::ingress`]) reads the levels played 0–800 ms before each caller frame was
//! captured. Both sides use one base instant, in 20 ms slots. Caller frames arrive with
//! network jitter, so their capture time is reckoned by [`CallerClock`] from their count and
//! the earliest arrival seen (frames come exactly every 20 ms at the source).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::audio::echo::{LAGS, MAX_LAG, PLAYED_MIN_DB, ulaw_db};
use crate::audio::noise_floor::MIN_DB;
use crate::carrier::FRAME_MS;

/// Slots remembered: 2.56 s (the pacer's one second of lead plus the 800 ms looked back).
const SLOTS: usize = 128;

/// The levels of the agent audio played, by 20 ms slot since the call's base instant; shared
/// by the call's pacer (writer) and caller-audio stage (reader).
#[derive(Clone)]
pub struct EchoReference(Arc<Mutex<Ring>>);

struct Ring {
    base: Instant,
    /// (slot number + 1, mean power relative to full scale); 0: empty.
    slots: Box<[(u64, f32)]>,
    /// The last slot written with audio louder than [`PLAYED_MIN_DB`] (+1; 0: none yet).
    last_loud: u64,
}

impl EchoReference {
    pub fn new(base: Instant) -> Self {
        Self(Arc::new(Mutex::new(Ring {
            base,
            slots: vec![(0, 0.0); SLOTS].into_boxed_slice(),
            last_loud: 0,
        })))
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pacer sent `frame` (μ-law, 20 ms) to be played from `at`.
    pub fn played(&self, at: Instant, frame: &[u8]) {
        let db = ulaw_db(frame);
        let power = if db > MIN_DB {
            10f32.powf(db / 10.0)
        } else {
            0.0
        };
        let mut r = self.ring();
        let slot = r.slot(at);
        r.slots[(slot % SLOTS as u64) as usize] = (slot + 1, power);
        if db >= PLAYED_MIN_DB {
            r.last_loud = r.last_loud.max(slot + 1);
        }
    }

    /// The carrier dropped what it had not played at `at` (a `clear`).
    pub fn cut(&self, at: Instant) {
        let mut r = self.ring();
        let from = r.slot(at) + 1;
        for s in r.slots.iter_mut() {
            if s.0 > from {
                *s = (0, 0.0);
            }
        }
        r.last_loud = r.last_loud.min(from);
    }

    /// Fills `played[k]` with the level played `k` to `k + 1` slots before `at` (the mean
    /// power of the two; [`MIN_DB`] where nothing was); false (and nothing filled) when nothing audible was played in the
    /// [`MAX_LAG`] slots before it.
    pub fn levels(&self, at: Instant, played: &mut [f32; LAGS]) -> bool {
        let r = self.ring();
        let now = r.slot(at);
        if r.last_loud == 0 || r.last_loud + (MAX_LAG as u64) < now + 1 {
            return false;
        }
        let power = |k: usize| -> f32 {
            now.checked_sub(k as u64)
                .map(|slot| r.slots[(slot % SLOTS as u64) as usize])
                .filter(|(tag, _)| *tag == slot_tag(now, k))
                .map_or(0.0, |(_, power)| power)
        };
        // A caller frame's 20 ms overlap two played slots (the clocks are not in phase):
        // lag k is the mean power of slots k and k + 1 before it.
        let mut newer = power(0);
        for (k, p) in played.iter_mut().enumerate() {
            let older = power(k + 1);
            let mean = (newer + older) / 2.0;
            *p = if mean > 0.0 {
                (10.0 * mean.log10()).max(MIN_DB)
            } else {
                MIN_DB
            };
            newer = older;
        }
        true
    }
}

fn slot_tag(now: u64, k: usize) -> u64 {
    now - k as u64 + 1
}

impl Ring {
    fn slot(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.base).as_millis() as u64) / FRAME_MS
    }
}

/// When each caller frame was captured, reckoned from the frame count and the earliest
/// arrival: `capture(n) = anchor + 20 ms × n`, the anchor being the smallest `arrival − 20 ms ×
/// n` seen, creeping 1 ms a second later (clock drift, frames lost on the way). The times only
/// need to be consistent: a constant error is part of the echo delay the estimate learns.
#[derive(Debug, Default)]
pub(crate) struct CallerClock {
    frames: u64,
    anchor: Option<Instant>,
}

/// How far the anchor creeps per frame (1 ms per second of audio).
const CREEP: Duration = Duration::from_micros(20);

impl CallerClock {
    /// A frame arrived at `arrival`; returns when it was captured.
    pub(crate) fn capture(&mut self, arrival: Instant) -> Instant {
        let offset = Duration::from_millis(FRAME_MS * self.frames);
        let candidate = arrival.checked_sub(offset).unwrap_or(arrival);
        let anchor = match self.anchor {
            Some(a) => (a + CREEP).min(candidate),
            None => candidate,
        };
        self.anchor = Some(anchor);
        self.frames += 1;
        anchor + offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::ulaw_tone;

    #[test]
    fn levels_are_read_back_by_lag_and_a_clear_cuts_the_future() {
        let base = Instant::now();
        let r = EchoReference::new(base);
        let ms = |n: u64| base + Duration::from_millis(n);
        let mut played = [0.0; LAGS];
        assert!(!r.levels(ms(100), &mut played), "nothing played yet");
        // Frames 0..10 loud (slots 0..10), then 10..20 silent.
        for i in 0..10 {
            r.played(ms(20 * i), &ulaw_tone(440.0, 20, 8000));
        }
        for i in 10..20 {
            r.played(ms(20 * i), &[0xFF; 160]);
        }
        assert!(r.levels(ms(20 * 12 + 5), &mut played));
        // Slot 12 now: slots 10..12 are silent frames, 0..9 the tone. Lag k covers slots
        // 12 - k and 11 - k: lags 0 and 1 silence, 2 half the tone's power (-3 dB), 3..11 the
        // tone, 12 half again, past that nothing.
        let tone = played[5];
        assert!(tone > -20.0, "{tone}");
        assert_eq!(played[0], MIN_DB);
        assert_eq!(played[1], MIN_DB);
        assert!((played[2] - (tone - 3.0)).abs() < 0.1, "{}", played[2]);
        assert!(played[3] == tone && played[11] == tone);
        assert!((played[12] - (tone - 3.0)).abs() < 0.1);
        assert_eq!(played[13], MIN_DB);
        // Long after the last loud frame nothing is read.
        assert!(!r.levels(ms(20 * (10 + MAX_LAG as u64 + 1)), &mut played));
        // Audio sent ahead and cleared at 500 ms never plays.
        for i in 30..50 {
            r.played(ms(20 * i), &ulaw_tone(440.0, 20, 8000));
        }
        r.cut(ms(20 * 35));
        assert!(r.levels(ms(20 * 45), &mut played));
        assert_eq!(played[0], MIN_DB, "slots 45 and 44 were cleared");
        assert_eq!(played[8], MIN_DB, "slots 37 and 36 were cleared");
        assert!(played[10] == tone, "slots 35 and 34 had played");
        // A slot written a ring's length ago does not pass for a recent one.
        r.played(ms(20 * 170), &ulaw_tone(440.0, 20, 8000));
        assert!(r.levels(ms(20 * 171), &mut played));
        assert!(played[0] < tone, "slots 171 (nothing) and 170");
        assert_eq!(
            played[10], MIN_DB,
            "slots 161 and 160 are not slots 33 and 32"
        );
    }

    #[test]
    fn the_caller_clock_ignores_jitter_and_catches_up_with_lost_frames() {
        let t0 = Instant::now();
        let mut c = CallerClock::default();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Frames 0..5 arrive late by 0..40 ms of jitter; the earliest (frame 0, on time) anchors.
        let jitter = [0, 30, 10, 40, 0];
        for (n, j) in jitter.iter().enumerate() {
            let at = c.capture(ms(20 * n as u64 + j));
            // On time, but for the creep (20 µs a frame).
            let off = at.duration_since(ms(20 * n as u64));
            assert!(off <= CREEP * n as u32, "frame {n}: {off:?}");
        }
        // Ten frames are lost on the way: the count is now 10 behind the source. Capture times
        // stay 20 ms apart (an echo delay 200 ms longer, which the estimate relearns) and
        // creep towards the arrivals by 1 ms a second.
        let mut prev = c.capture(ms(20 * 15));
        for n in 6..300u64 {
            let arrival = ms(20 * (n + 10));
            let at = c.capture(arrival);
            assert!(at <= arrival);
            let step = at.duration_since(prev);
            assert!(
                step >= Duration::from_millis(20) && step <= Duration::from_micros(20_020),
                "{step:?}"
            );
            prev = at;
        }
        assert!(prev > ms(20 * 299) + Duration::from_millis(5), "crept");
    }
}
