//! Caller audio against the wall clock: every media socket's inbound audio passes a
//! [`CallerPace`] before the caller-audio stage sees it. A token bucket filled at
//! [`RATE_NUM`]/[`RATE_DEN`] (1.2×) real time, starting with [`BURST`] of audio and holding at
//! most [`JITTER`], lets a caller's frames through; a frame beyond it is dropped and counted.
//! A caller who sends 1× saves the 0.2× surplus, up to [`JITTER`] (after 4 s): frames that a
//! stalled network — or this process, starved of CPU, not reading its socket — held up and
//! that then arrive together pass, up to a second of them. Saving never raises the total:
//! every token comes from the 1.2× refill or the first [`BURST`]. A socket that keeps sending more than
//! [`FLOOD_FACTOR`]× real time for [`FLOOD_WINDOWS`] windows of [`FLOOD_WINDOW`] in a row
//! is told to close. A carrier sends 1× (20 ms frames every 20 ms): only a client that sends
//! faster than it speaks — a forged or broken browser phone, a flooder — is paced, and what
//! it cannot send is what the STT vendor would have billed, the recording would have held and
//! the process's memory would have buffered.
//!
//! What passes is at most 1.2 × the time since the stream started plus [`BURST`]; a flood
//! is closed no sooner than [`FLOOD_WINDOWS`] seconds in, so a flooded call's STT audio stays
//! under 1.2 + 0.2 / 6 ≈ 1.23 × its duration.
//!
//! The bucket reads no clock: each frame comes with its arrival time (`tokio::time::Instant`,
//! so it runs on tokio's paused clock in tests).

use std::time::Duration;

use tokio::time::Instant;

/// Audio admitted per unit of real time: 6/5 = 1.2×.
pub(crate) const RATE_NUM: u64 = 6;
pub(crate) const RATE_DEN: u64 = 5;
/// Audio the bucket starts with: what a caller may send ahead of real time from the start.
pub(crate) const BURST: Duration = Duration::from_millis(200);
/// Audio the bucket holds at most: how much held-up audio may arrive at once and still pass,
/// once the caller has saved it by sending at real time.
pub(crate) const JITTER: Duration = Duration::from_secs(1);
/// Received audio over this many times real time, window after window, is a flood.
pub(crate) const FLOOD_FACTOR: u64 = 2;
/// The windows the received rate is judged over.
pub(crate) const FLOOD_WINDOW: Duration = Duration::from_secs(1);
/// Flooded windows in a row that close the socket.
pub(crate) const FLOOD_WINDOWS: u32 = 6;
/// μ-law 8 kHz: one byte is 125 µs of audio.
const US_PER_BYTE: u64 = 125;
/// Every frame costs at least this much audio (8 bytes, 1 ms): empty or one-byte frames are
/// not free.
const MIN_FRAME_US: u64 = 1000;

/// What becomes of one caller frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paced {
    /// Within the pace: the caller-audio stage takes it.
    Pass,
    /// Beyond the pace: dropped (and counted).
    Drop,
    /// The socket keeps flooding: dropped, and the socket is to be closed.
    Close,
}

/// One media socket's caller-audio pace (see the module docs).
#[derive(Debug)]
pub(crate) struct CallerPace {
    /// Audio the caller may still send (µs; below zero after a frame larger than what was
    /// left, repaid before the next one passes).
    tokens_us: i64,
    last: Instant,
    window_start: Instant,
    window_us: u64,
    flooded_windows: u32,
    dropped: u64,
}

impl CallerPace {
    /// A pace starting at `now` with a full bucket.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            tokens_us: BURST.as_micros() as i64,
            last: now,
            window_start: now,
            window_us: 0,
            flooded_windows: 0,
            dropped: 0,
        }
    }

    /// Judges a frame of `bytes` of μ-law audio that arrived at `now`.
    pub(crate) fn admit(&mut self, bytes: usize, now: Instant) -> Paced {
        let burst = BURST.as_micros() as i64;
        let capacity = JITTER.as_micros() as i64;
        let audio_us = (bytes as u64 * US_PER_BYTE).max(MIN_FRAME_US);
        let elapsed = now.saturating_duration_since(self.last).as_micros() as u64;
        self.last = now;
        let refill = elapsed.saturating_mul(RATE_NUM) / RATE_DEN;
        self.tokens_us = self
            .tokens_us
            .saturating_add(i64::try_from(refill).unwrap_or(i64::MAX))
            .min(capacity);
        // Whether the socket floods: what it sends, passed or not, over each window.
        self.window_us = self.window_us.saturating_add(audio_us);
        let window = now.saturating_duration_since(self.window_start);
        if window >= FLOOD_WINDOW {
            let flooded = self.window_us > FLOOD_FACTOR * window.as_micros() as u64;
            self.flooded_windows = if flooded { self.flooded_windows + 1 } else { 0 };
            self.window_start = now;
            self.window_us = 0;
        }
        // A frame larger than the first burst passes only once that much is saved.
        let need = (audio_us as i64).min(burst);
        let verdict = if self.tokens_us >= need {
            self.tokens_us -= audio_us as i64;
            Paced::Pass
        } else {
            self.dropped += 1;
            Paced::Drop
        };
        if self.flooded_windows >= FLOOD_WINDOWS {
            return Paced::Close;
        }
        verdict
    }

    /// Frames dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: usize = 160;

    /// Sends `frames` 20 ms frames at `speed`× real time from the pace's clock (paused), and
    /// returns how many passed and dropped, and whether a close was asked for (the first
    /// frame that asked).
    async fn send(
        pace: &mut CallerPace,
        frames: u32,
        speed: u32,
        bytes: usize,
    ) -> (u32, u32, Option<u32>) {
        let gap = Duration::from_micros(bytes as u64 * US_PER_BYTE / u64::from(speed));
        let (mut passed, mut dropped, mut closed) = (0, 0, None);
        for i in 0..frames {
            tokio::time::advance(gap).await;
            match pace.admit(bytes, Instant::now()) {
                Paced::Pass => passed += 1,
                Paced::Drop => dropped += 1,
                Paced::Close => {
                    dropped += 1;
                    closed.get_or_insert(i);
                }
            }
        }
        (passed, dropped, closed)
    }

    #[tokio::test(start_paused = true)]
    async fn real_time_and_a_little_faster_pass() {
        let mut pace = CallerPace::new(Instant::now());
        // A minute at 1× and a minute at 1.2×: everything passes, nothing is a flood.
        assert_eq!(send(&mut pace, 3000, 1, FRAME).await, (3000, 0, None));
        // 1.2× exactly, from a full bucket (60 ms frames, so the gap is whole microseconds).
        let (passed, dropped, closed) = send(&mut pace, 1000, 1, 480).await;
        assert_eq!((passed, dropped, closed), (1000, 0, None));
        let gap = Duration::from_micros(480 * US_PER_BYTE * 5 / 6);
        let mut dropped = 0;
        for _ in 0..1000 {
            tokio::time::advance(gap).await;
            if pace.admit(480, Instant::now()) != Paced::Pass {
                dropped += 1;
            }
        }
        assert_eq!(dropped, 0, "1.2× real time passes");
        assert_eq!(pace.dropped(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_after_a_stall_passes_up_to_the_allowance() {
        let mut pace = CallerPace::new(Instant::now());
        // 5 s at 1×: the caller has saved the whole jitter allowance (1 s).
        send(&mut pace, 250, 1, FRAME).await;
        // The network (or a starved reader) held 1.5 s of frames: they arrive at once. A second
        // of them (50 frames) passes; the rest is dropped.
        tokio::time::advance(Duration::from_millis(1500)).await;
        let now = Instant::now();
        let passed = (0..75)
            .filter(|_| pace.admit(FRAME, now) == Paced::Pass)
            .count();
        assert_eq!(passed, 50);
        assert_eq!(pace.dropped(), 25);
        // Right at the start nothing is saved yet: a 1 s burst after 100 ms passes only the
        // first 200 ms and the 120 ms the stall refilled.
        let mut pace = CallerPace::new(Instant::now());
        tokio::time::advance(Duration::from_millis(100)).await;
        let now = Instant::now();
        let passed = (0..50)
            .filter(|_| pace.admit(FRAME, now) == Paced::Pass)
            .count();
        assert_eq!(passed, 16);
    }

    /// Saving up never raises the total: 10 s at 1×, then a flood, passes at most 1.2 × the
    /// whole time plus the first burst.
    #[tokio::test(start_paused = true)]
    async fn saving_up_never_raises_the_total() {
        let mut pace = CallerPace::new(Instant::now());
        let start = Instant::now();
        let (calm, _, _) = send(&mut pace, 500, 1, FRAME).await;
        let (flood, _, _) = send(&mut pace, 3000, 10, FRAME).await;
        let passed_ms = u64::from(calm + flood) * 20;
        let elapsed_ms = start.elapsed().as_millis() as u64;
        let bound = elapsed_ms * RATE_NUM / RATE_DEN + BURST.as_millis() as u64;
        assert!(
            passed_ms <= bound + 20,
            "{passed_ms} ms passed in {elapsed_ms} ms (bound {bound})"
        );
        // The flood itself got what was saved (1 s) and 1.2× its own time.
        let flood_ms = u64::from(flood) * 20;
        let flood_time_ms = elapsed_ms - 10_000;
        let saved_and_refill = JITTER.as_millis() as u64 + flood_time_ms * RATE_NUM / RATE_DEN;
        assert!(
            flood_ms.abs_diff(saved_and_refill) <= 60,
            "the flood passed {flood_ms} ms, expected about {saved_and_refill}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ten_times_real_time_drops_the_excess() {
        let mut pace = CallerPace::new(Instant::now());
        // 4 s of wall clock at 10×: 40 s of audio sent, about 1.2 × 4 s + the burst passes.
        let (passed, dropped, closed) = send(&mut pace, 2000, 10, FRAME).await;
        assert_eq!(closed, None, "not yet closed: {passed} {dropped}");
        let passed_ms = u64::from(passed) * 20;
        let expected = 4000 * RATE_NUM / RATE_DEN + BURST.as_millis() as u64;
        assert!(
            passed_ms.abs_diff(expected) <= 40,
            "passed {passed_ms} ms of audio, expected about {expected}"
        );
        assert_eq!(u64::from(dropped), pace.dropped());
        assert_eq!(passed + dropped, 2000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sustained_flood_is_closed_and_a_short_one_is_not() {
        // 3× for 4 s: paced, not closed; back to 1× resets the count, so 3× for 4 s again is
        // not closed either.
        let mut pace = CallerPace::new(Instant::now());
        let (_, dropped, closed) = send(&mut pace, 600, 3, FRAME).await;
        assert!(dropped > 0);
        assert_eq!(closed, None);
        assert_eq!(send(&mut pace, 100, 1, FRAME).await.2, None);
        assert_eq!(send(&mut pace, 600, 3, FRAME).await.2, None);
        // Sustained: closed once six whole windows in a row were over 2×, at about 6 s.
        let mut pace = CallerPace::new(Instant::now());
        let (_, _, closed) = send(&mut pace, 1500, 3, FRAME).await;
        let at = closed.expect("a sustained flood is closed");
        let at_ms = u64::from(at + 1) * 20 / 3;
        assert!((5_900..=6_400).contains(&at_ms), "closed after {at_ms} ms");
        // 1.9× forever is paced, never closed.
        let mut pace = CallerPace::new(Instant::now());
        let gap = Duration::from_micros(20_000 * 10 / 19);
        for _ in 0..3000 {
            tokio::time::advance(gap).await;
            assert_ne!(pace.admit(FRAME, Instant::now()), Paced::Close);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_larger_than_the_burst_passes_from_a_full_bucket_only() {
        let mut pace = CallerPace::new(Instant::now());
        // A 1 s frame from a full bucket passes, leaving a debt...
        assert_eq!(pace.admit(8000, Instant::now()), Paced::Pass);
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(pace.admit(FRAME, Instant::now()), Paced::Drop);
        // ...repaid at 1.2× before anything else passes.
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(pace.admit(FRAME, Instant::now()), Paced::Drop);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(pace.admit(FRAME, Instant::now()), Paced::Pass);
        // Empty frames cost a millisecond each.
        let mut pace = CallerPace::new(Instant::now());
        let now = Instant::now();
        let passed = (0..1000)
            .filter(|_| pace.admit(0, now) == Paced::Pass)
            .count();
        assert_eq!(passed, 200);
    }
}
