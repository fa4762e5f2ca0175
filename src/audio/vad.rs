//! Voice activity detection on the caller's audio, one [`Vad`] per call. It wraps earshot's
//! small pure-Rust network (its weights are a `static` compiled into the binary, so every call
//! shares one model and owns only about 10 KB of state): telephone μ-law is decoded, upsampled
//! 2× by linear interpolation (which, unlike a sharp anti-imaging filter, keeps noise bursts
//! from looking like speech; see docs/conversation.md) and cut into the 256-sample 16 kHz
//! frames earshot scores. Frame scores pass through a small hysteresis: speech starts after
//! [`VadConfig::start_ms`] of voiced frames and ends after [`VadConfig::stop_ms`] without one.
//! Times are audio milliseconds since the first frame, so decisions do not depend on how busy
//! the machine is.

use earshot::Detector;

use super::g711::ulaw_to_linear;

/// Samples per earshot frame (16 ms at 16 kHz).
const FRAME: usize = 256;
/// Milliseconds per earshot frame.
const FRAME_MS: u64 = 16;

/// Per-agent thresholds (see `[agents.NAME] vad_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// A frame scoring at least this is voiced (0–1).
    pub threshold: f32,
    /// Voiced audio needed (within one run) before speech is declared.
    pub start_ms: u64,
    /// Unvoiced audio after the last voiced frame that ends speech.
    pub stop_ms: u64,
}

impl Default for VadConfig {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            start_ms: 48,
            stop_ms: 160,
        }
    }
}

/// A change of the caller's speaking state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech began; `onset_ms` is the audio time of its first voiced frame.
    SpeechStart { onset_ms: u64 },
    /// Speech ended; `last_voiced_ms` is the audio time just after its last voiced frame.
    SpeechEnd { onset_ms: u64, last_voiced_ms: u64 },
}

/// One call's detector and speaking state.
pub struct Vad {
    cfg: VadConfig,
    det: Box<Detector>,
    prev: i16,
    pending: Vec<i16>,
    /// Audio time at the end of the last scored frame.
    audio_ms: u64,
    speaking: bool,
    /// Start of the current run of (mostly) voiced frames.
    run_onset_ms: Option<u64>,
    run_voiced_ms: u64,
    last_voiced_ms: u64,
    last_score: f32,
}

impl Vad {
    pub fn new(cfg: VadConfig) -> Self {
        Self {
            cfg,
            det: Detector::default_boxed(),
            prev: 0,
            pending: Vec::with_capacity(FRAME * 2),
            audio_ms: 0,
            speaking: false,
            run_onset_ms: None,
            run_voiced_ms: 0,
            last_voiced_ms: 0,
            last_score: 0.0,
        }
    }

    /// Feeds 8 kHz μ-law; returns the state changes it caused, in order.
    pub fn push_ulaw(&mut self, ulaw: &[u8]) -> Vec<VadEvent> {
        let mut out = Vec::new();
        for &b in ulaw {
            let x = ulaw_to_linear(b);
            let mid = ((i32::from(self.prev) + i32::from(x)) / 2) as i16;
            self.pending.push(mid);
            self.pending.push(x);
            self.prev = x;
            if self.pending.len() >= FRAME {
                let frame: Vec<i16> = self.pending.drain(..FRAME).collect();
                let score = self.det.predict_i16(&frame);
                self.step(score, &mut out);
            }
        }
        out
    }

    fn step(&mut self, score: f32, out: &mut Vec<VadEvent>) {
        let start = self.audio_ms;
        self.audio_ms += FRAME_MS;
        self.last_score = score;
        if score >= self.cfg.threshold {
            let onset = *self.run_onset_ms.get_or_insert(start);
            self.run_voiced_ms += FRAME_MS;
            self.last_voiced_ms = self.audio_ms;
            if !self.speaking && self.run_voiced_ms >= self.cfg.start_ms {
                self.speaking = true;
                out.push(VadEvent::SpeechStart { onset_ms: onset });
            }
        } else if let Some(onset) = self.run_onset_ms
            && self.audio_ms.saturating_sub(self.last_voiced_ms) >= self.cfg.stop_ms
        {
            if self.speaking {
                out.push(VadEvent::SpeechEnd {
                    onset_ms: onset,
                    last_voiced_ms: self.last_voiced_ms,
                });
            }
            self.speaking = false;
            self.run_onset_ms = None;
            self.run_voiced_ms = 0;
        }
    }

    /// True between a `SpeechStart` and its `SpeechEnd`.
    pub fn is_speaking(&self) -> bool {
        self.speaking
    }

    /// Audio time fed so far (in whole earshot frames).
    pub fn audio_ms(&self) -> u64 {
        self.audio_ms
    }

    /// Voiced audio in the current speech run (short gaps between words do not count); 0 when
    /// not speaking.
    pub fn speech_run_ms(&self) -> u64 {
        if self.speaking { self.run_voiced_ms } else { 0 }
    }

    /// Audio milliseconds since the last voiced frame.
    pub fn silence_ms(&self) -> u64 {
        self.audio_ms.saturating_sub(self.last_voiced_ms)
    }

    /// The last frame's score.
    pub fn last_score(&self) -> f32 {
        self.last_score
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::{ulaw_silence, ulaw_tone};

    fn clip(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/speech/{name}.ulaw",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn events(audio: &[u8]) -> Vec<VadEvent> {
        let mut v = Vad::new(VadConfig::default());
        let mut out = Vec::new();
        for frame in audio.chunks(160) {
            out.extend(v.push_ulaw(frame));
        }
        out
    }

    #[test]
    fn speech_starts_and_ends_around_an_utterance() {
        let mut audio = ulaw_silence(500);
        audio.extend(clip("book_table"));
        audio.extend(ulaw_silence(800));
        let ev = events(&audio);
        let Some(VadEvent::SpeechStart { onset_ms }) = ev.first().copied() else {
            panic!("no speech start: {ev:?}");
        };
        assert!((400..900).contains(&onset_ms), "{ev:?}");
        let Some(VadEvent::SpeechEnd { last_voiced_ms, .. }) = ev.last().copied() else {
            panic!("no speech end: {ev:?}");
        };
        let speech_end = 500 + clip("book_table").len() as u64 / 8;
        assert!(last_voiced_ms + 600 > speech_end, "{ev:?}");
    }

    #[test]
    fn silence_is_not_speech() {
        assert!(events(&ulaw_silence(2000)).is_empty());
    }

    #[test]
    fn a_click_is_not_speech() {
        let mut audio = ulaw_silence(300);
        audio.extend(clip("click"));
        audio.extend(ulaw_silence(300));
        let ev = events(&audio);
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn a_steady_tone_counts_as_speech() {
        // The simulators' stand-in for a voice; real deployments see DTMF handled separately.
        let ev = events(&ulaw_tone(440.0, 700, 8000));
        assert!(
            matches!(ev.first(), Some(VadEvent::SpeechStart { .. })),
            "{ev:?}"
        );
    }
}
