//! A DTMF receiver for the simulators: Goertzel filters at the eight Q.23 frequencies over
//! 20 ms blocks of the agent audio a carrier simulator receives, so tests check which digits
//! patterd played in-band, not just that audio arrived. A block holds a digit when one low and
//! one high frequency together carry most of its energy, each clearly above the rest of its
//! group, with a twist inside Q.24's limits (8 dB normal, 4 dB reverse); a digit is reported
//! once it has lasted at least two blocks (40 ms) and again only after a block without it.

use patterd::audio::g711::ulaw_to_linear;

const RATE: f64 = 8000.0;
/// 20 ms blocks.
const BLOCK: usize = 160;
const LOW: [f64; 4] = [697.0, 770.0, 852.0, 941.0];
const HIGH: [f64; 4] = [1209.0, 1336.0, 1477.0, 1633.0];
const KEYS: [[char; 4]; 4] = [
    ['1', '2', '3', 'A'],
    ['4', '5', '6', 'B'],
    ['7', '8', '9', 'C'],
    ['*', '0', '#', 'D'],
];
/// Blocks quieter than this (mean square, i16 domain) hold no digit.
const MIN_POWER: f64 = 300.0 * 300.0;

/// The power of `samples` at `freq` (Goertzel), normalised so that a sine of amplitude `a`
/// at `freq` gives about `a² / 2`, like the block's mean square.
fn goertzel(samples: &[f64], freq: f64) -> f64 {
    let w = std::f64::consts::TAU * freq / RATE;
    let coeff = 2.0 * w.cos();
    let (mut s1, mut s2) = (0.0, 0.0);
    for &x in samples {
        let s0 = x + coeff * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    let power = s1 * s1 + s2 * s2 - coeff * s1 * s2;
    let n = samples.len() as f64;
    2.0 * power / (n * n)
}

/// The digit one block holds, if any.
pub fn block_digit(samples: &[f64]) -> Option<char> {
    let mean_sq = samples.iter().map(|x| x * x).sum::<f64>() / samples.len().max(1) as f64;
    if mean_sq < MIN_POWER {
        return None;
    }
    let best = |freqs: &[f64; 4]| {
        let p: Vec<f64> = freqs.iter().map(|&f| goertzel(samples, f)).collect();
        let (i, &max) = p.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1))?;
        let second = p
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, &v)| v)
            .fold(0.0, f64::max);
        Some((i, max, second))
    };
    let (row, lo, lo2) = best(&LOW)?;
    let (col, hi, hi2) = best(&HIGH)?;
    let twist_db = 10.0 * (hi / lo.max(1e-9)).log10();
    let strong = lo + hi >= 0.8 * mean_sq;
    let clear = lo >= 8.0 * lo2 && hi >= 8.0 * hi2;
    (strong && clear && (-4.0..=8.0).contains(&twist_db)).then_some(KEYS[row][col])
}

/// A streaming receiver: feed it μ-law as it arrives, read the digits it heard.
#[derive(Debug, Default, Clone)]
pub struct DtmfReceiver {
    buf: Vec<f64>,
    /// The digit of the current run of blocks and its length.
    run: Option<(char, u32)>,
    reported: bool,
    digits: Vec<char>,
}

impl DtmfReceiver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds μ-law audio; returns the digits completed by it.
    pub fn push_ulaw(&mut self, audio: &[u8]) -> Vec<char> {
        let mut out = Vec::new();
        for &b in audio {
            self.buf.push(f64::from(ulaw_to_linear(b)));
            if self.buf.len() == BLOCK {
                let d = block_digit(&self.buf);
                self.buf.clear();
                match (d, self.run) {
                    (Some(d), Some((r, n))) if d == r => {
                        self.run = Some((r, n + 1));
                        if n + 1 >= 2 && !self.reported {
                            self.reported = true;
                            self.digits.push(d);
                            out.push(d);
                        }
                    }
                    (Some(d), _) => {
                        self.run = Some((d, 1));
                        self.reported = false;
                    }
                    (None, _) => {
                        self.run = None;
                        self.reported = false;
                    }
                }
            }
        }
        out
    }

    /// Every digit heard so far.
    pub fn digits(&self) -> String {
        self.digits.iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd::audio::dtmf::ulaw_tones;

    #[test]
    fn hears_every_digit_patterd_generates() {
        let all = "123A456B789C*0#D";
        let mut rx = DtmfReceiver::new();
        // Some speech-like noise first (a single tone is never a digit), then the tones.
        let tone = patterd::audio::g711::ulaw_tone(440.0, 200, 8000);
        assert!(rx.push_ulaw(&tone).is_empty());
        rx.push_ulaw(&ulaw_tones(all));
        assert_eq!(rx.digits(), all);
        // Repeated digits are separated by their gaps.
        let mut rx = DtmfReceiver::new();
        rx.push_ulaw(&ulaw_tones("11"));
        assert_eq!(rx.digits(), "11");
    }

    #[test]
    fn silence_single_tones_and_short_blips_are_not_digits() {
        let mut rx = DtmfReceiver::new();
        rx.push_ulaw(&[0xFF; 1600]);
        rx.push_ulaw(&patterd::audio::g711::ulaw_tone(697.0, 200, 8000));
        rx.push_ulaw(&patterd::audio::g711::ulaw_tone(1209.0, 200, 8000));
        // 20 ms of a real digit is too short (Q.24 rejects <= 23 ms).
        rx.push_ulaw(&ulaw_tones("5")[..160]);
        rx.push_ulaw(&[0xFF; 320]);
        assert_eq!(rx.digits(), "");
    }
}
