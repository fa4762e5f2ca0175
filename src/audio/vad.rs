//! Voice activity detection on the caller's audio, one [`Vad`] per call. It wraps earshot's
//! small pure-Rust network (its weights are a `static` compiled into the binary, so every call
//! shares one model and owns only about 10 KB of state): telephone μ-law is decoded, upsampled
//! 2× by linear interpolation (which, unlike a sharp anti-imaging filter, keeps noise bursts
//! from looking like speech; see docs/conversation.md) and cut into the 256-sample 16 kHz
//! frames earshot scores. A frame is *voiced* when earshot's score passes
//! [`VadConfig::threshold`] **and** its energy stands [`VadConfig::floor_margin_db`] above the
//! call's background level ([`NoiseFloor`], the 10th percentile of the last ~5 s): background talkers
//! (babble) score as speech to earshot, but a near caller is louder than the babble floor.
//! While the caller is speaking the babble part of that margin is lowered a little (a start
//! still needs all of it), so the quieter syllables of a caller already talking still count.
//! Frames too quiet to be voiced are not scored at all (the energy gate, [`VadConfig::gate`]),
//! except for a few frames after the energy drops and one frame of warm-up before it rises, so
//! the network's state around onsets and offsets is what it would have been. Voiced frames pass
//! through a small hysteresis: speech starts after [`VadConfig::start_ms`] of voiced frames and
//! ends after [`VadConfig::stop_ms`] without one. Times are audio milliseconds since the first
//! frame, so decisions do not depend on how busy the machine is.

use earshot::Detector;

use super::g711::ulaw_to_linear;
use super::noise_floor::{MAX_SPREAD, NoiseFloor, frame_db};

/// Samples per earshot frame (16 ms at 16 kHz).
const FRAME: usize = 256;
/// Milliseconds per earshot frame.
const FRAME_MS: u64 = 16;
/// The floor margin widens by this many dB per dB of the background's spread (babble swings,
/// hiss does not).
const SPREAD_GAIN: f32 = 2.0;
/// Frames still scored after the energy falls under the gate (≈ 96 ms).
const GATE_HANGOVER: u8 = 6;
/// While the caller is speaking, the spread part of the margin is lowered by up to this many
/// dB: a start needs the full margin, but the quieter syllables of a caller already talking
/// over babble still count (hysteresis on the energy; stationary noise has no spread, so
/// nothing changes there).
const SPEAKING_RELIEF_DB: f32 = 3.0;
/// Frames (≈ 1 s) during which the background's spread is taken as its maximum: a call that
/// opens on babble has no history yet to tell the babble's peaks from a caller.
const WARMUP_FRAMES: usize = 62;

/// Which network scores the frames (`[agents.NAME] vad_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VadEngine {
    /// earshot 1.2.2 on 16 ms frames of 2× upsampled audio (always built in).
    #[default]
    Earshot,
    /// Silero VAD v6, 8 kHz, 32 ms windows, through tract (cargo feature `silero`; without it
    /// [`Vad::new`] falls back to earshot, and config validation refuses the setting).
    Silero,
}

/// Per-agent thresholds (see `[agents.NAME] vad_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// The network scoring the frames.
    pub engine: VadEngine,
    /// A frame scoring at least this is voiced (0–1).
    pub threshold: f32,
    /// Voiced audio needed (within one run) before speech is declared.
    pub start_ms: u64,
    /// Unvoiced audio after the last voiced frame that ends speech.
    pub stop_ms: u64,
    /// A frame is voiced only when its energy is at least this far (dB), plus 2× the
    /// background's spread, above the tracked background floor; 0 turns the noise adaptation
    /// (and the energy gate) off.
    pub floor_margin_db: f32,
    /// Skip scoring frames whose energy is under the floor margin (they cannot be voiced).
    pub gate: bool,
}

impl Default for VadConfig {
    fn default() -> Self {
        Self {
            engine: VadEngine::Earshot,
            threshold: 0.5,
            start_ms: 48,
            stop_ms: 160,
            floor_margin_db: 5.0,
            gate: true,
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

/// The scoring network of one call.
enum Scorer {
    /// earshot, fed 16 kHz made by linear interpolation (`prev` is the last 8 kHz sample).
    Earshot { det: Box<Detector>, prev: i16 },
    #[cfg(feature = "silero")]
    Silero(Box<super::silero::Silero>),
}

impl Scorer {
    fn new(engine: VadEngine) -> Self {
        match engine {
            #[cfg(feature = "silero")]
            VadEngine::Silero => Scorer::Silero(Box::default()),
            _ => Scorer::Earshot {
                det: Detector::default_boxed(),
                prev: 0,
            },
        }
    }

    /// Audio milliseconds per frame of [`FRAME`] samples.
    fn frame_ms(&self) -> u64 {
        match self {
            Scorer::Earshot { .. } => FRAME_MS,
            #[cfg(feature = "silero")]
            Scorer::Silero(_) => super::silero::WINDOW_MS,
        }
    }

    fn predict(&mut self, frame: &[i16; FRAME]) -> f32 {
        match self {
            Scorer::Earshot { det, .. } => det.predict_i16(frame),
            #[cfg(feature = "silero")]
            Scorer::Silero(s) => s.predict(frame),
        }
    }
}

/// One call's detector and speaking state.
pub struct Vad {
    cfg: VadConfig,
    scorer: Scorer,
    frame_ms: u64,
    /// The frame being filled, and how many of its samples are in.
    pending: [i16; FRAME],
    pending_len: usize,
    /// Audio time at the end of the last scored frame.
    audio_ms: u64,
    speaking: bool,
    /// Start of the current run of (mostly) voiced frames.
    run_onset_ms: Option<u64>,
    run_voiced_ms: u64,
    last_voiced_ms: u64,
    last_score: f32,
    floor: NoiseFloor,
    /// Frames left to score after the energy fell under the gate.
    hot: u8,
    /// The last frame was not scored (it is kept to warm the network up on the next one).
    gated: bool,
    prev_frame: [i16; FRAME],
    /// Frames scored by the network / frames seen (for the gate's figures).
    scored: u64,
    /// [`SPEAKING_RELIEF_DB`] (tests sweep it).
    relief_db: f32,
}

impl Vad {
    pub fn new(cfg: VadConfig) -> Self {
        let scorer = Scorer::new(cfg.engine);
        let frame_ms = scorer.frame_ms();
        Self {
            cfg,
            scorer,
            frame_ms,
            pending: [0; FRAME],
            pending_len: 0,
            audio_ms: 0,
            speaking: false,
            run_onset_ms: None,
            run_voiced_ms: 0,
            last_voiced_ms: 0,
            last_score: 0.0,
            floor: NoiseFloor::new(),
            hot: 0,
            gated: false,
            prev_frame: [0; FRAME],
            scored: 0,
            relief_db: SPEAKING_RELIEF_DB,
        }
    }

    /// Feeds 8 kHz μ-law; returns the state changes it caused, in order.
    pub fn push_ulaw(&mut self, ulaw: &[u8]) -> Vec<VadEvent> {
        let mut out = Vec::new();
        for &b in ulaw {
            let x = ulaw_to_linear(b);
            let n = self.pending_len;
            match &mut self.scorer {
                Scorer::Earshot { prev, .. } => {
                    // FRAME is even: a sample and the one interpolated before it never
                    // straddle two frames.
                    self.pending[n] = ((i32::from(*prev) + i32::from(x)) / 2) as i16;
                    self.pending[n + 1] = x;
                    self.pending_len = n + 2;
                    *prev = x;
                }
                #[cfg(feature = "silero")]
                Scorer::Silero(_) => {
                    self.pending[n] = x;
                    self.pending_len = n + 1;
                }
            }
            if self.pending_len == FRAME {
                self.pending_len = 0;
                let frame = self.pending;
                let voiced = self.score(&frame);
                self.step(voiced, &mut out);
            }
        }
        out
    }

    /// Scores one frame (or gates it) and says whether it is voiced.
    fn score(&mut self, frame: &[i16; FRAME]) -> bool {
        let db = frame_db(frame);
        self.floor.push(db);
        let spread = if self.floor.frames() < WARMUP_FRAMES {
            MAX_SPREAD
        } else {
            self.floor.spread_db()
        };
        let mut margin = self.cfg.floor_margin_db + SPREAD_GAIN * spread;
        if self.speaking {
            margin -= self.relief_db.min(SPREAD_GAIN * spread);
        }
        let loud = self.cfg.floor_margin_db <= 0.0 || db >= self.floor.floor_db() + margin;
        if loud {
            self.hot = GATE_HANGOVER;
        }
        let score = if !self.cfg.gate || loud || self.hot > 0 {
            if self.gated {
                // Warm up on the frame before the onset, as if it had been scored.
                self.scorer.predict(&self.prev_frame);
                self.scored += 1;
            }
            self.gated = false;
            self.scored += 1;
            self.scorer.predict(frame)
        } else {
            self.gated = true;
            0.0
        };
        if !loud {
            self.hot = self.hot.saturating_sub(1);
        }
        self.prev_frame = *frame;
        self.last_score = score;
        loud && score >= self.cfg.threshold
    }

    fn step(&mut self, voiced: bool, out: &mut Vec<VadEvent>) {
        let start = self.audio_ms;
        self.audio_ms += self.frame_ms;
        if voiced {
            let onset = *self.run_onset_ms.get_or_insert(start);
            self.run_voiced_ms += self.frame_ms;
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

    /// Audio time fed so far (in whole frames: 16 ms for earshot, 32 ms for Silero).
    pub fn audio_ms(&self) -> u64 {
        self.audio_ms
    }

    /// Voiced audio in the current speech run (short gaps between words do not count); 0 when
    /// not speaking.
    pub(crate) fn speech_run_ms(&self) -> u64 {
        if self.speaking { self.run_voiced_ms } else { 0 }
    }

    /// Audio time since the current run's onset, voiced frames and the gaps between them;
    /// 0 when not speaking.
    pub(crate) fn speech_span_ms(&self) -> u64 {
        match self.run_onset_ms {
            Some(onset) if self.speaking => self.audio_ms.saturating_sub(onset),
            _ => 0,
        }
    }

    /// True once a frame was voiced (before that [`Vad::silence_ms`] is the call's length).
    pub(crate) fn heard_voice(&self) -> bool {
        self.last_voiced_ms > 0
    }

    /// Audio milliseconds since the last voiced frame.
    pub fn silence_ms(&self) -> u64 {
        self.audio_ms.saturating_sub(self.last_voiced_ms)
    }

    /// The tracked background level (dBFS).
    pub(crate) fn floor_db(&self) -> f32 {
        self.floor.floor_db()
    }

    /// Frames the network scored (including warm-ups) since the call began.
    pub fn frames_scored(&self) -> u64 {
        self.scored
    }

    /// Frames seen since the call began (scored or skipped by the energy gate).
    pub fn frames_seen(&self) -> u64 {
        self.audio_ms / self.frame_ms
    }
}

#[cfg(test)]
mod babble;

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
        // A sound from the very first frame is the background until something quieter is
        // heard (the floor starts at the first frame); calls start with line noise or silence.
        let mut audio = ulaw_silence(100);
        audio.extend(ulaw_tone(440.0, 700, 8000));
        let ev = events(&audio);
        assert!(
            matches!(ev.first(), Some(VadEvent::SpeechStart { .. })),
            "{ev:?}"
        );
    }
}
