//! Periodicity of caller audio: whether a 20 ms frame carries a pitch (voiced speech, a laugh,
//! a hum) or is noise-like (a cough, a click, breath, a door). The barge-in hold uses it so a
//! burst with no pitch at all never stops the agent on its duration alone (coughs are
//! band-limited noise; every spoken interruption has voiced vowels within its first 100 ms).
//! Measured as the largest normalised autocorrelation over pitch lags 60–400 Hz of the frame
//! and the one before it (40 ms window), mean removed. Pure and allocation-free; run by the
//! caller-audio stage only while the caller speaks over the agent (≈ 9 k multiply-adds a frame,
//! at 4 kHz).

use super::g711::ULAW_DECODE;
use super::noise_floor::MIN_DB;

/// Samples in one 20 ms frame at 8 kHz.
const FRAME: usize = 160;
/// Shortest lag scored (400 Hz at 8 kHz; halved at the 4 kHz the score is taken at).
const MIN_LAG: usize = 20;
/// Longest lag scored (60 Hz at 8 kHz; halved likewise).
const MAX_LAG: usize = 133;
/// Normalised autocorrelation at or above which a frame is called pitched. Voiced speech scores
/// 0.6–0.95 (still ≥ 0.5 with noise 10 dB under it); band-limited noise 0.1–0.35.
pub(crate) const PITCHED: f32 = 0.5;
/// Frames quieter than this mean square (about −60 dBFS) are not scored.
const MIN_POWER: f32 = 1.0e3;

/// One frame's pitch score and level.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pitch {
    /// Largest normalised autocorrelation over the pitch lags (0.0–1.0).
    pub score: f32,
    /// The frame's level (dBFS; [`MIN_DB`] for an unscored frame).
    pub db: f32,
}

impl Pitch {
    /// A pitch at least `over_db` above the background `floor_db`: the caller's own voice, not
    /// the voices or hum of the room behind them.
    pub(crate) fn voiced_over(&self, floor_db: f32, over_db: f32) -> bool {
        self.score >= PITCHED && self.db >= floor_db + over_db
    }
}

/// Scores each frame against the one before it.
#[derive(Debug, Clone)]
pub struct Periodicity {
    /// The previous frame (μ-law), when there was one.
    prev: [u8; FRAME],
    primed: bool,
}

impl Default for Periodicity {
    fn default() -> Self {
        Self {
            prev: [0xFF; FRAME],
            primed: false,
        }
    }
}

impl Periodicity {
    /// Takes in one μ-law frame and returns its pitch (score 0.0 for a frame that is not 160
    /// bytes, is near silence, or follows no frame).
    pub fn push_ulaw(&mut self, frame: &[u8]) -> Pitch {
        if !self.primed || frame.len() != FRAME {
            self.remember(frame);
            return Pitch {
                score: 0.0,
                db: MIN_DB,
            };
        }
        let mut window = [0.0f32; 2 * FRAME];
        for (dst, &b) in window.iter_mut().zip(self.prev.iter().chain(frame)) {
            *dst = f32::from(ULAW_DECODE[usize::from(b)]);
        }
        self.remember(frame);
        let mean_square = window[FRAME..].iter().map(|v| v * v).sum::<f32>() / FRAME as f32;
        let db = if mean_square > 0.0 {
            (10.0 * (mean_square / (32768.0 * 32768.0)).log10()).max(MIN_DB)
        } else {
            MIN_DB
        };
        Pitch {
            score: score(&window),
            db,
        }
    }

    /// Keeps `frame` as the previous frame without scoring it (cheap: a copy); false (and
    /// unprimed) when it is not one 20 ms frame.
    pub(crate) fn remember(&mut self, frame: &[u8]) -> bool {
        if frame.len() != FRAME {
            self.primed = false;
            return false;
        }
        self.prev.copy_from_slice(frame);
        self.primed = true;
        true
    }

    /// Forgets the previous frame (a gap in the audio).
    pub fn reset(&mut self) {
        self.primed = false;
    }
}

/// The largest normalised autocorrelation of `x` (mean removed) over the pitch lags, taken at
/// 4 kHz (pairs of samples averaged: a pitch is far below 2 kHz, and it costs a quarter).
fn score(x: &[f32; 2 * FRAME]) -> f32 {
    const N: usize = FRAME;
    let mut y = [0.0f32; N];
    for (d, pair) in y.iter_mut().zip(x.chunks_exact(2)) {
        *d = (pair[0] + pair[1]) * 0.5;
    }
    let mean = y.iter().sum::<f32>() / N as f32;
    for v in &mut y {
        *v -= mean;
    }
    let power = y.iter().map(|v| v * v).sum::<f32>() / N as f32;
    if power < MIN_POWER {
        return 0.0;
    }
    // Prefix sums of squares give both spans' energies for every lag: only the cross term
    // is summed per lag.
    let mut prefix = [0.0f32; N + 1];
    for (i, v) in y.iter().enumerate() {
        prefix[i + 1] = prefix[i] + v * v;
    }
    let mut best = 0.0f32;
    for lag in MIN_LAG / 2..=MAX_LAG / 2 {
        let cross: f32 = y[..N - lag].iter().zip(&y[lag..]).map(|(p, q)| p * q).sum();
        let denom = (prefix[N - lag] * (prefix[N] - prefix[lag])).sqrt();
        if denom > 0.0 {
            best = best.max(cross / denom);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::linear_to_ulaw;

    fn frames(samples: &[f32]) -> Vec<Vec<u8>> {
        samples
            .chunks(FRAME)
            .map(|c| c.iter().map(|&s| linear_to_ulaw(s as i16)).collect())
            .collect()
    }

    fn scores(samples: &[f32]) -> Vec<f32> {
        let mut p = Periodicity::default();
        frames(samples)
            .iter()
            .map(|f| p.push_ulaw(f).score)
            .collect()
    }

    /// A small deterministic noise source (xorshift), uniform in −1..1.
    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// A vowel-like buzz: a 140 Hz pulse train through two resonances (700 and 1200 Hz).
    fn buzz(n: usize, f0: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        let (mut y1, mut y2, mut z1, mut z2) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
        let period = (8000.0 / f0) as usize;
        let res = |f: f32| {
            let r = 0.95f32;
            let w = 2.0 * std::f32::consts::PI * f / 8000.0;
            (2.0 * r * w.cos(), -r * r)
        };
        let (a1, a2) = res(700.0);
        let (b1, b2) = res(1200.0);
        for i in 0..n {
            let x = if i % period == 0 { 1.0 } else { 0.0 };
            let y = x + a1 * y1 + a2 * y2;
            (y2, y1) = (y1, y);
            let z = y + b1 * z1 + b2 * z2;
            (z2, z1) = (z1, z);
            out.push(z);
        }
        let peak = out.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        out.iter().map(|v| v / peak * 8000.0).collect()
    }

    /// Band-limited noise like the suite's coughs: white noise through a one-pole high-pass and
    /// low-pass pair (about 300–2500 Hz).
    fn band_noise(n: usize, seed: u32) -> Vec<f32> {
        let w = noise(n, seed);
        let (mut hp, mut prev, mut lp) = (0.0f32, 0.0f32, 0.0f32);
        let a_hp = 0.79; // ~300 Hz
        let a_lp = 0.86; // ~2500 Hz
        w.iter()
            .map(|&x| {
                hp = a_hp * (hp + x - prev);
                prev = x;
                lp += a_lp * (hp - lp);
                lp * 12000.0
            })
            .collect()
    }

    #[test]
    fn a_voiced_buzz_is_pitched_from_its_second_frame() {
        for f0 in [110.0, 140.0, 220.0, 300.0] {
            let s = scores(&buzz(FRAME * 10, f0));
            assert_eq!(s[0], 0.0, "the first frame has nothing before it");
            assert!(s[1..].iter().all(|&v| v >= PITCHED), "{f0} Hz: {s:?}");
        }
    }

    #[test]
    fn noise_bursts_are_not_pitched() {
        for seed in [1, 7, 99, 12345] {
            let s = scores(&band_noise(FRAME * 16, seed));
            assert!(s.iter().all(|&v| v < PITCHED), "seed {seed}: {s:?}");
            let s = scores(
                &noise(FRAME * 16, seed)
                    .iter()
                    .map(|v| v * 9000.0)
                    .collect::<Vec<_>>(),
            );
            assert!(s.iter().all(|&v| v < PITCHED), "white, seed {seed}: {s:?}");
        }
    }

    #[test]
    fn voiced_speech_under_noise_10_db_down_is_still_pitched() {
        let n = FRAME * 12;
        let v = buzz(n, 140.0);
        let w = band_noise(n, 3);
        let pv = v.iter().map(|x| x * x).sum::<f32>();
        let pw = w.iter().map(|x| x * x).sum::<f32>();
        let g = (pv / pw / 10.0).sqrt();
        let mixed: Vec<f32> = v.iter().zip(&w).map(|(a, b)| a + g * b).collect();
        let s = scores(&mixed);
        let pitched = s.iter().filter(|&&v| v >= PITCHED).count();
        assert!(pitched >= 10, "{s:?}");
    }

    #[test]
    fn silence_and_odd_frames_score_zero() {
        let mut p = Periodicity::default();
        assert_eq!(p.push_ulaw(&[0xFF; FRAME]).score, 0.0);
        assert_eq!(p.push_ulaw(&[0xFF; FRAME]).score, 0.0);
        assert_eq!(p.push_ulaw(&[0x80; 7]).score, 0.0);
        let b = frames(&buzz(FRAME * 2, 140.0));
        assert_eq!(p.push_ulaw(&b[0]).score, 0.0, "a short frame unprimes it");
        let pitch = p.push_ulaw(&b[1]);
        assert!(pitch.score >= PITCHED);
        assert!(pitch.voiced_over(-40.0, 6.0), "{pitch:?}");
        assert!(
            !pitch.voiced_over(pitch.db - 3.0, 6.0),
            "not 6 dB over the room"
        );
        p.reset();
        assert_eq!(p.push_ulaw(&b[0]).score, 0.0);
    }
}
