//! DTMF out: the digits an agent may send (`0-9 * # A-D`, at most [`MAX_DIGITS`]) and their
//! in-band tones as 8 kHz μ-law (ITU-T Q.23 frequency pairs), generated as carriers play
//! them: per digit 100 ms of tone then 100 ms of silence, the low group at
//! −10 dBm0 and the high group at −8 dBm0 (2 dB twist), phase continuous within a tone. Pure
//! functions; the call actor queues the result on its mouth like speech.

use super::g711::linear_to_ulaw;

/// Longest digit string one action may send.
pub(crate) const MAX_DIGITS: usize = 32;
/// Tone and gap per digit.
pub(crate) const TONE_MS: u64 = 100;
pub(crate) const GAP_MS: u64 = 100;
/// Peak of the low-group sine (−10 dBm0 in the i16 domain of `linear_to_ulaw`).
pub(crate) const A_LOW: f64 = 7050.0;
/// Peak of the high-group sine (−8 dBm0).
pub(crate) const A_HIGH: f64 = 8880.0;
const RATE: f64 = 8000.0;
const SILENCE: u8 = 0xFF;

/// The low- and high-group frequencies (Hz) of a digit.
pub fn frequencies(digit: char) -> Option<(f64, f64)> {
    let (row, col) = match digit {
        '1' => (0, 0),
        '2' => (0, 1),
        '3' => (0, 2),
        'A' => (0, 3),
        '4' => (1, 0),
        '5' => (1, 1),
        '6' => (1, 2),
        'B' => (1, 3),
        '7' => (2, 0),
        '8' => (2, 1),
        '9' => (2, 2),
        'C' => (2, 3),
        '*' => (3, 0),
        '0' => (3, 1),
        '#' => (3, 2),
        'D' => (3, 3),
        _ => return None,
    };
    const LOW: [f64; 4] = [697.0, 770.0, 852.0, 941.0];
    const HIGH: [f64; 4] = [1209.0, 1336.0, 1477.0, 1633.0];
    Some((LOW[row], HIGH[col]))
}

/// Why a digit string cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DigitsError {
    #[error("no digits given; send one or more of 0-9, *, #, A-D")]
    Empty,
    #[error("{0:?} is not a DTMF digit; use only 0-9, *, # and A-D")]
    BadDigit(char),
    #[error("{0} digits is too many; send at most {MAX_DIGITS} at a time")]
    TooLong(usize),
}

/// Checks a digit string an agent asked to send; returns it with `a-d` upper-cased.
pub(crate) fn parse_digits(digits: &str) -> Result<String, DigitsError> {
    let digits = digits.trim();
    if digits.is_empty() {
        return Err(DigitsError::Empty);
    }
    let n = digits.chars().count();
    if n > MAX_DIGITS {
        return Err(DigitsError::TooLong(n));
    }
    digits
        .chars()
        .map(|c| {
            let c = c.to_ascii_uppercase();
            frequencies(c).map(|_| c).ok_or(DigitsError::BadDigit(c))
        })
        .collect()
}

/// The in-band tones of `digits` (already checked; anything else is skipped) as μ-law 8 kHz:
/// each digit [`TONE_MS`] of tone then [`GAP_MS`] of silence, a whole number of 20 ms frames.
pub fn ulaw_tones(digits: &str) -> Vec<u8> {
    let tone = (RATE as u64 * TONE_MS / 1000) as usize;
    let gap = (RATE as u64 * GAP_MS / 1000) as usize;
    let mut out = Vec::with_capacity(digits.len() * (tone + gap));
    for (lo, hi) in digits.chars().filter_map(frequencies) {
        let (w_lo, w_hi) = (
            std::f64::consts::TAU * lo / RATE,
            std::f64::consts::TAU * hi / RATE,
        );
        out.extend((0..tone).map(|n| {
            let n = n as f64;
            let s = (A_LOW * (w_lo * n).sin() + A_HIGH * (w_hi * n).sin()).round();
            linear_to_ulaw(s as i16)
        }));
        out.extend(std::iter::repeat_n(SILENCE, gap));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::ulaw_to_linear;

    #[test]
    fn digits_are_checked() {
        assert_eq!(parse_digits(" 12a#* "), Ok("12A#*".to_string()));
        assert_eq!(parse_digits(""), Err(DigitsError::Empty));
        assert_eq!(parse_digits("12w3"), Err(DigitsError::BadDigit('W')));
        assert_eq!(parse_digits("1-2"), Err(DigitsError::BadDigit('-')));
        let long = "1".repeat(MAX_DIGITS + 1);
        assert_eq!(
            parse_digits(&long),
            Err(DigitsError::TooLong(MAX_DIGITS + 1))
        );
        assert!(parse_digits(&"9".repeat(MAX_DIGITS)).is_ok());
    }

    #[test]
    fn tones_follow_the_recipe() {
        let audio = ulaw_tones("1#");
        // Two digits of 100 ms tone + 100 ms silence: 400 ms, twenty 20 ms frames.
        assert_eq!(audio.len(), 3200);
        assert!(audio[800..1600].iter().all(|&b| b == SILENCE));
        let pcm: Vec<i32> = audio[..800]
            .iter()
            .map(|&b| ulaw_to_linear(b) as i32)
            .collect();
        let peak = pcm.iter().map(|s| s.abs()).max().unwrap_or(0);
        // The two sines' peaks add up to at most 15 930 (no clipping) and come near it.
        assert!((14_000..=16_200).contains(&peak), "peak {peak}");
        // The first sample of a tone is at phase 0.
        assert!(pcm[0].abs() < 16, "first sample {}", pcm[0]);
    }
}
