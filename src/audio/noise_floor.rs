//! The background level of one call's caller audio: a running histogram of the last ~5 s of
//! frame energies (0.5 dB bins, one ring of bin numbers), from which the [`NoiseFloor::floor_db`]
//! (the 10th percentile) and its [`NoiseFloor::spread_db`] (10th minus 2nd percentile, capped
//! at 6 dB) are read. A near talker pauses between words, so the low percentiles stay on the background
//! under them, while steady noise or background talkers (babble) move the floor to their own
//! level within one window. The spread tells the two apart: stationary noise (hiss, white, pink)
//! has frame energies within a dB or so; babble swings several dB. The voice detector
//! ([`super::vad`]) counts a frame as speech only when it stands a margin (wider for a wide
//! spread) above the floor, and skips scoring frames under that margin. Each frame costs one
//! histogram update and one scan of its 194 bins.

/// Energies are clamped here (dBFS), so digital silence has a finite level.
pub(crate) const MIN_DB: f32 = -96.0;

/// Frames in the window (312 × 16 ms ≈ 5 s).
const WINDOW: usize = 312;
/// Percentile (of 100) read as the floor, and the lower one the spread is measured from.
const FLOOR_PCT: usize = 10;
const LOW_PCT: usize = 2;
/// The spread is capped here (dB): a window mostly of speech over digital silence would
/// otherwise read as a background swinging by tens of dB.
pub(crate) const MAX_SPREAD: f32 = 6.0;
/// Histogram bins per dB.
const PER_DB: f32 = 2.0;
const BINS: usize = (-MIN_DB * PER_DB) as usize + 2;

/// Mean energy of PCM16 samples in dBFS, clamped to [`MIN_DB`].
pub(crate) fn frame_db(samples: &[i16]) -> f32 {
    if samples.is_empty() {
        return MIN_DB;
    }
    let sum: i64 = samples.iter().map(|&s| i64::from(s) * i64::from(s)).sum();
    let mean = sum as f64 / samples.len() as f64;
    if mean <= 0.0 {
        return MIN_DB;
    }
    let db = 10.0 * (mean / (32768.0 * 32768.0)).log10();
    (db as f32).max(MIN_DB)
}

/// Percentile tracker over recent frame energies.
#[derive(Debug, Clone)]
pub(crate) struct NoiseFloor {
    ring: [u8; WINDOW],
    len: usize,
    next: usize,
    hist: [u16; BINS],
    floor: f32,
    spread: f32,
}

impl Default for NoiseFloor {
    fn default() -> Self {
        Self::new()
    }
}

fn bin(db: f32) -> u8 {
    (((db.clamp(MIN_DB, 0.0) - MIN_DB) * PER_DB).round() as usize).min(BINS - 1) as u8
}

fn level(bin: usize) -> f32 {
    MIN_DB + bin as f32 / PER_DB
}

impl NoiseFloor {
    pub(crate) fn new() -> Self {
        Self {
            ring: [0; WINDOW],
            len: 0,
            next: 0,
            hist: [0; BINS],
            floor: MIN_DB,
            spread: 0.0,
        }
    }

    /// Records one frame's energy (dBFS) and updates the floor and spread.
    pub(crate) fn push(&mut self, db: f32) {
        let b = bin(db);
        if self.len == WINDOW {
            let old = usize::from(self.ring[self.next]);
            self.hist[old] -= 1;
        } else {
            self.len += 1;
        }
        self.ring[self.next] = b;
        self.hist[usize::from(b)] += 1;
        self.next = (self.next + 1) % WINDOW;
        // Smallest bins holding at least LOW_PCT and FLOOR_PCT of the window.
        let n_low = (self.len * LOW_PCT).div_ceil(100);
        let n_floor = (self.len * FLOOR_PCT).div_ceil(100);
        let (mut seen, mut low) = (0usize, None);
        for (i, &c) in self.hist.iter().enumerate() {
            seen += usize::from(c);
            if low.is_none() && seen >= n_low {
                low = Some(i);
            }
            if seen >= n_floor {
                self.floor = level(i);
                self.spread = (self.floor - level(low.unwrap_or(i))).min(MAX_SPREAD);
                return;
            }
        }
    }

    /// The background level (dBFS): the 10th percentile of the window; [`MIN_DB`] before any
    /// frame.
    pub(crate) fn floor_db(&self) -> f32 {
        self.floor
    }

    /// Frames in the window so far (at most ~5 s of them).
    pub(crate) fn frames(&self) -> usize {
        self.len
    }

    /// How much the background's energy swings: 10th minus 2nd percentile (dB, at most 6).
    pub(crate) fn spread_db(&self) -> f32 {
        self.spread
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_db_of_full_scale_and_silence() {
        assert_eq!(frame_db(&[0; 256]), MIN_DB);
        let full = frame_db(&[32767, -32767].repeat(128));
        assert!(full.abs() < 0.01, "{full}");
        let quiet = frame_db(&[328, -328].repeat(128));
        assert!((quiet + 40.0).abs() < 0.1, "{quiet}");
    }

    #[test]
    fn floor_stays_under_a_talker_and_moves_to_a_steady_background() {
        let mut f = NoiseFloor::new();
        assert_eq!(f.floor_db(), MIN_DB);
        // Speech with pauses over a quiet line: the floor is the line.
        for i in 0..WINDOW * 2 {
            f.push(if i % 3 == 0 {
                -70.0
            } else {
                -20.0 - (i % 7) as f32
            });
        }
        assert_eq!(f.floor_db(), -70.0);
        assert_eq!(f.spread_db(), 0.0);
        // A steady loud background for a whole window becomes the floor.
        for _ in 0..WINDOW {
            f.push(-35.0);
        }
        assert_eq!(f.floor_db(), -35.0);
        // A swinging background (babble-like) has a wide spread.
        for i in 0..WINDOW {
            f.push(-30.0 + (i % 20) as f32);
        }
        assert_eq!(f.floor_db(), -29.0);
        assert_eq!(f.spread_db(), 1.0);
        // Speech over digital silence does not read as a wide swing.
        for i in 0..WINDOW {
            f.push(if i % 20 == 0 {
                MIN_DB
            } else {
                -40.0 + (i % 9) as f32
            });
        }
        assert_eq!(f.floor_db(), -40.0);
        assert_eq!(f.spread_db(), MAX_SPREAD);
    }
}
