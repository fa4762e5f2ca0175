//! Test audio for the simulators, on top of [`patterd::audio::g711`]: a μ-law 440 Hz tone that the
//! fake Deepgram hears as speech, μ-law silence, and the mean absolute level it uses to tell
//! speech from silence.

use patterd::audio::g711;

/// `ms` of a 440 Hz tone at about -12 dBFS, μ-law 8 kHz: "speech" to the fake Deepgram.
pub fn mulaw_tone(ms: u32) -> Vec<u8> {
    g711::ulaw_tone(440.0, u64::from(ms), 8000)
}

/// `ms` of digital silence, μ-law 8 kHz.
pub fn mulaw_silence(ms: u32) -> Vec<u8> {
    g711::ulaw_silence(u64::from(ms))
}

/// Mean absolute PCM level of μ-law bytes (0 for empty input).
pub fn mulaw_level(b: &[u8]) -> f64 {
    f64::from(g711::ulaw_energy(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tone_is_loud_and_silence_is_quiet() {
        assert_eq!(mulaw_tone(20).len(), 160);
        assert!(mulaw_level(&mulaw_tone(100)) > 3000.0);
        assert_eq!(mulaw_silence(20), vec![0xFF; 160]);
        assert!(mulaw_level(&mulaw_silence(100)) < 10.0);
        assert_eq!(mulaw_level(&[]), 0.0);
    }
}
