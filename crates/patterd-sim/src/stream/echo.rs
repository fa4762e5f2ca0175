//! A live line echo for the simulated carrier: the agent audio the carrier actually played
//! comes back in the caller's frames `delay_ms` later, attenuated by `gain_db` and
//! band-limited (a one-pole high-pass at ~300 Hz and low-pass at ~3.4 kHz, as a hybrid's
//! leakage is). Unlike a fixed clip pushed as caller audio, it follows what was played: a
//! `clear` or a pause silences it `delay_ms` later, exactly as on a real line. Pure: fed the
//! played 20 ms frames ([`EchoPath::played`]) and mixed into the caller's ([`EchoPath::mix`]).

use std::collections::VecDeque;

use patterd::audio::g711::{linear_to_ulaw, ulaw_to_linear};
use patterd::carrier::{FRAME_BYTES, FRAME_MS};

/// How the line echoes the agent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EchoConfig {
    /// Round-trip delay (rounded to 20 ms frames; 20–300 ms on real lines).
    pub delay_ms: u64,
    /// Level of the echo against the played audio (e.g. −20 or −6).
    pub gain_db: f32,
}

/// The echo path's state: the played frames still in flight and the filters.
#[derive(Debug)]
pub struct EchoPath {
    cfg: EchoConfig,
    gain: f32,
    /// Played frames (linear PCM), oldest first; `delay + 1` frames long once full (the
    /// oldest, played `delay` frames ago, is the one coming back now).
    line: VecDeque<Vec<i16>>,
    delay_frames: usize,
    /// High-pass state (previous input and output) and low-pass state (previous output).
    hp_x: f32,
    hp_y: f32,
    lp_y: f32,
}

/// One-pole coefficients at 8 kHz: high-pass ~300 Hz, low-pass ~3.4 kHz.
const HP_A: f32 = 0.79;
const LP_A: f32 = 0.93;

impl EchoPath {
    pub fn new(cfg: EchoConfig) -> Self {
        let delay_frames = (cfg.delay_ms / FRAME_MS).max(1) as usize;
        Self {
            cfg,
            gain: 10f32.powf(cfg.gain_db / 20.0),
            line: VecDeque::with_capacity(delay_frames + 2),
            delay_frames,
            hp_x: 0.0,
            hp_y: 0.0,
            lp_y: 0.0,
        }
    }

    pub fn config(&self) -> EchoConfig {
        self.cfg
    }

    /// The carrier played this 20 ms of agent audio (μ-law; `None`: nothing, silence).
    pub fn played(&mut self, ulaw: Option<&[u8]>) {
        let pcm = match ulaw {
            Some(b) => {
                let mut v: Vec<i16> = b.iter().map(|&u| ulaw_to_linear(u)).collect();
                v.resize(FRAME_BYTES, 0);
                v
            }
            None => vec![0; FRAME_BYTES],
        };
        self.line.push_back(pcm);
        while self.line.len() > self.delay_frames + 1 {
            self.line.pop_front();
        }
    }

    /// The caller's frame (μ-law) with the echo of what was played `delay_ms` ago added.
    pub fn mix(&mut self, frame: &[u8]) -> Vec<u8> {
        let echo = if self.line.len() > self.delay_frames {
            self.line.front().cloned()
        } else {
            None
        };
        frame
            .iter()
            .enumerate()
            .map(|(i, &u)| {
                let x = echo.as_ref().map_or(0.0, |e| f32::from(e[i]) * self.gain);
                let hp = HP_A * (self.hp_y + x - self.hp_x);
                self.hp_x = x;
                self.hp_y = hp;
                self.lp_y = LP_A * hp + (1.0 - LP_A) * self.lp_y;
                let s = f32::from(ulaw_to_linear(u)) + self.lp_y;
                linear_to_ulaw(s.clamp(-32768.0, 32767.0) as i16)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd::audio::g711::{SILENCE_ULAW, ulaw_tone};

    fn rms(ulaw: &[u8]) -> f64 {
        let sum: f64 = ulaw
            .iter()
            .map(|&u| f64::from(ulaw_to_linear(u)).powi(2))
            .sum();
        (sum / ulaw.len() as f64).sqrt()
    }

    /// Plays `tone` frames of a 1 kHz tone then silence through a path; returns the caller
    /// frames (silence plus echo), one per tick.
    fn run(cfg: EchoConfig, tone: usize, ticks: usize) -> (Vec<Vec<u8>>, f64) {
        let mut path = EchoPath::new(cfg);
        let played = ulaw_tone(1000.0, FRAME_MS * tone as u64, 8000);
        let level = rms(&played);
        let frames = (0..ticks)
            .map(|t| {
                let chunk = played.get(t * FRAME_BYTES..(t + 1) * FRAME_BYTES);
                path.played(chunk);
                path.mix(&[SILENCE_ULAW; FRAME_BYTES])
            })
            .collect();
        (frames, level)
    }

    #[test]
    fn the_played_audio_comes_back_delayed_and_attenuated() {
        let cfg = EchoConfig {
            delay_ms: 100,
            gain_db: -6.0,
        };
        let (frames, level) = run(cfg, 10, 20);
        // Nothing before the delay (5 frames: the frame played at tick 0 returns at tick 5).
        for f in &frames[..5] {
            assert!(rms(f) < 10.0, "{}", rms(f));
        }
        // Then about half the level (−6 dB, a little less through the band filter).
        let mid = rms(&frames[8]);
        let ratio = mid / level;
        assert!((0.35..0.6).contains(&ratio), "ratio {ratio}");
        // And silence again once the played audio has ended and its echo has passed.
        assert!(rms(&frames[19]) < 10.0);
    }

    #[test]
    fn minus_twenty_db_is_a_tenth_of_the_level() {
        let cfg = EchoConfig {
            delay_ms: 60,
            gain_db: -20.0,
        };
        let (frames, level) = run(cfg, 20, 20);
        let ratio = rms(&frames[10]) / level;
        assert!((0.06..0.12).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn nothing_played_means_no_echo() {
        let mut path = EchoPath::new(EchoConfig {
            delay_ms: 20,
            gain_db: -6.0,
        });
        for _ in 0..10 {
            path.played(None);
            let out = path.mix(&[SILENCE_ULAW; FRAME_BYTES]);
            assert!(rms(&out) < 10.0);
        }
    }
}
