//! The agent's own voice coming back in the caller's audio (line or speakerphone echo), told
//! apart from the caller by its level. Each caller frame is compared with the levels of the
//! agent audio played 0–800 ms earlier (one 20 ms frame per lag): where there is an echo path,
//! the caller frame's level minus the played frame's level at the path's delay is nearly
//! constant (the echo's return loss), while at every other lag, or without an echo path, it
//! swings with speech by 10 dB and more. [`EchoEstimator`] keeps a running mean and variance of
//! that difference for every lag, locks onto the steadiest one once it is steady enough, and
//! then calls a caller frame *explained by echo* when its level is no more than
//! a margin (2.5 standard deviations of the difference, 3–6 dB) over the level the path
//! predicts. A caller talking over the echo is louder than that, and frames over the
//! prediction are not learnt from (double talk would pull the estimate up); a second's worth
//! more of them than of frames under it drops the lock (the path changed, or the lock was
//! wrong) and learning starts again. One frame moves a lag's estimate by at most two of its
//! standard deviations, so the edges of words do not pull it. Pure and cheap: a few hundred
//! additions per 20 ms frame, and only while the agent has been heard in the last 800 ms.

use super::g711::ulaw_to_linear;
use super::noise_floor::MIN_DB;

/// Lags compared, in 20 ms frames: 0 to 800 ms (round trip of the network and the carrier's
/// playback buffer plus the echo path itself).
pub(crate) const MAX_LAG: usize = 40;
/// Number of lags (0 ..= [`MAX_LAG`]).
pub const LAGS: usize = MAX_LAG + 1;
/// A played frame quieter than this (dBFS) is "nothing played": it predicts no echo.
pub(crate) const PLAYED_MIN_DB: f32 = -55.0;
/// Only played frames at least this loud (dBFS) are learnt from: the echo of quieter sounds
/// is near the line's noise and quantisation.
const LEARN_PLAYED_DB: f32 = -40.0;
/// The smallest cap on one frame's deviation (dB), see [`EchoEstimator::push`].
const LEARN_CAP_MIN_DB: f32 = 3.0;
/// Caller frames within this much of the background floor carry no evidence either way.
const OVER_FLOOR_DB: f32 = 3.0;
/// Weight of a new frame in the running mean and variance of each lag's level difference
/// once it has [`MIN_FRAMES`] (about the last dozen frames with something played count).
const ALPHA: f32 = 0.08;
/// Frames a lag must have learnt from before it can be locked on.
const MIN_FRAMES: u32 = 10;
/// A lag locks when the standard deviation of its difference falls to this (dB) ...
const LOCK_SD_DB: f32 = 4.0;
/// ... and the lock is lost when it rises past this.
const UNLOCK_SD_DB: f32 = 6.0;
/// Once locked, only frames up to this much over the prediction are learnt from (dB).
const LEARN_DB: f32 = 1.0;
/// Net frames over the prediction (1 s) after which the lock is dropped and learning
/// starts again: the path changed, or it was the wrong one.
const UNLOCK_OVER_FRAMES: u32 = 50;
/// Another lag takes over a lock only when its variance is this much lower.
const SWITCH_RATIO: f32 = 0.7;
/// An echo is not louder than what was played by more than this (dB).
const MAX_GAIN_DB: f32 = 3.0;
/// A caller frame more than this many standard deviations of the path's level difference
/// over the predicted echo level is the caller, ...
const MARGIN_SDS: f32 = 2.5;
/// ... within these bounds (dB).
const MARGIN_MIN_DB: f32 = 3.0;
const MARGIN_MAX_DB: f32 = 6.0;

/// Level of a μ-law frame in dBFS (mean energy), clamped to [`MIN_DB`].
pub fn ulaw_db(frame: &[u8]) -> f32 {
    if frame.is_empty() {
        return MIN_DB;
    }
    let sum: i64 = frame
        .iter()
        .map(|&u| {
            let s = i64::from(ulaw_to_linear(u));
            s * s
        })
        .sum();
    let mean = sum as f64 / frame.len() as f64;
    if mean <= 0.0 {
        return MIN_DB;
    }
    ((10.0 * (mean / (32768.0 * 32768.0)).log10()) as f32).max(MIN_DB)
}

/// The echo path as estimated so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EchoPath {
    /// Delay between a frame played and its echo in the caller's frames (ms).
    pub delay_ms: u64,
    /// Echo level against the played audio (dB, negative: the return loss).
    pub gain_db: f32,
    /// How steady the level difference is at that delay (standard deviation, dB).
    pub(crate) spread_db: f32,
}

/// One call's echo estimate. See the module documentation.
#[derive(Debug, Clone)]
pub struct EchoEstimator {
    mean: [f32; LAGS],
    var: [f32; LAGS],
    frames: [u32; LAGS],
    lag: Option<usize>,
    /// Frames over the prediction, less those under it, since the lock.
    over: u32,
}

impl Default for EchoEstimator {
    fn default() -> Self {
        Self {
            mean: [0.0; LAGS],
            var: [0.0; LAGS],
            frames: [0; LAGS],
            lag: None,
            over: 0,
        }
    }
}

impl EchoEstimator {
    /// Takes in one caller frame of level `caller_db` over a background at `floor_db`, with
    /// `played[k]` the level of the agent audio played `k` frames before it (at most
    /// [`PLAYED_MIN_DB`] where nothing was). Says whether the frame is explained by the echo
    /// of what was played.
    pub fn push(&mut self, caller_db: f32, floor_db: f32, played: &[f32; LAGS]) -> bool {
        if !Self::heard(caller_db, floor_db) {
            return false;
        }
        let explained = self
            .lag
            .is_some_and(|k| caller_db <= self.predict(k, played) + self.margin(k));
        if self.lag.is_some() {
            if !explained {
                // Over the prediction: the caller is talking too (double talk would pull the
                // estimate up), unless it goes on so long that the lock is the wrong one.
                self.over += 1;
                if self.over >= UNLOCK_OVER_FRAMES {
                    self.lag = None;
                    self.over = 0;
                }
                return false;
            }
            self.over = self.over.saturating_sub(1);
            if self
                .lag
                .is_some_and(|k| caller_db > self.predict(k, played) + LEARN_DB)
            {
                // Explained, but too near the margin to learn from without bias.
                return true;
            }
        }
        for (k, &p) in played.iter().enumerate() {
            if p < LEARN_PLAYED_DB {
                continue;
            }
            // The plain mean and variance of the first frames, then a running one in which
            // one frame moves the estimate by at most two standard deviations (the edges of
            // words, where the two clocks' phase matters most, are outliers).
            self.frames[k] = self.frames[k].saturating_add(1);
            let a = (1.0 / self.frames[k] as f32).max(ALPHA);
            let mut dev = caller_db - p - self.mean[k];
            if self.frames[k] > MIN_FRAMES {
                let cap = (2.0 * self.var[k].sqrt()).max(LEARN_CAP_MIN_DB);
                dev = dev.clamp(-cap, cap);
            }
            self.mean[k] += a * dev;
            self.var[k] = (1.0 - a) * (self.var[k] + a * dev * dev);
        }
        self.relock();
        explained
    }

    /// Whether a caller frame of level `caller_db` stands far enough over the background at
    /// `floor_db` to carry evidence (quieter frames are neither learnt from nor explained).
    pub fn heard(caller_db: f32, floor_db: f32) -> bool {
        caller_db >= floor_db + OVER_FLOOR_DB
    }

    /// Whether a caller frame could hold an echo of what was `played` (a path is locked and
    /// the level it predicts stands over the background at `floor_db`).
    pub(crate) fn could_echo(&self, floor_db: f32, played: &[f32; LAGS]) -> bool {
        self.lag
            .is_some_and(|k| self.predict(k, played) >= floor_db + OVER_FLOOR_DB)
    }

    /// The echo level the path predicts for a caller frame (dBFS): the loudest of the played
    /// frames at the path's delay and either side of it (the two clocks are not in phase),
    /// plus the path's gain.
    fn predict(&self, k: usize, played: &[f32; LAGS]) -> f32 {
        let lo = k.saturating_sub(1);
        let hi = (k + 1).min(MAX_LAG);
        let loudest = played[lo..=hi]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        if loudest < PLAYED_MIN_DB {
            return MIN_DB;
        }
        loudest + self.mean[k]
    }

    /// How far over the prediction a frame may be and still be echo (dB).
    fn margin(&self, k: usize) -> f32 {
        (MARGIN_SDS * self.var[k].sqrt()).clamp(MARGIN_MIN_DB, MARGIN_MAX_DB)
    }

    fn relock(&mut self) {
        let best = (0..LAGS)
            .filter(|&k| self.frames[k] >= MIN_FRAMES && self.mean[k] <= MAX_GAIN_DB)
            .min_by(|&a, &b| self.var[a].total_cmp(&self.var[b]));
        let Some(best) = best else {
            self.lag = None;
            return;
        };
        // A neighbouring lag about as steady as the one locked on (the clocks' phase moves
        // between them) does not take over.
        let best = match self.lag {
            Some(k) if self.var[best] >= SWITCH_RATIO * self.var[k] => k,
            _ => best,
        };
        let sd = self.var[best].sqrt();
        if sd <= LOCK_SD_DB {
            self.lag = Some(best);
        } else if self.lag.is_some_and(|k| self.var[k].sqrt() > UNLOCK_SD_DB) {
            self.lag = None;
        }
    }

    /// The echo path locked on, if any.
    pub fn path(&self) -> Option<EchoPath> {
        self.lag.map(|k| EchoPath {
            delay_ms: k as u64 * 20,
            gain_db: self.mean[k],
            spread_db: self.var[k].sqrt(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::{decode_ulaw, encode_ulaw};

    fn speech(name: &str) -> Vec<i16> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        decode_ulaw(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
    }

    /// A line echo as the simulator makes it: `delay` samples late, `gain_db` down,
    /// band-limited by one-pole filters (high-pass ~300 Hz, low-pass ~3.4 kHz).
    fn echo_of(agent: &[i16], delay: usize, gain_db: f32) -> Vec<f32> {
        let g = 10f32.powf(gain_db / 20.0);
        let (mut hx, mut hy, mut ly) = (0.0f32, 0.0f32, 0.0f32);
        (0..agent.len())
            .map(|i| {
                let x = if i >= delay {
                    f32::from(agent[i - delay]) * g
                } else {
                    0.0
                };
                let hp = 0.79 * (hy + x - hx);
                hx = x;
                hy = hp;
                ly = 0.93 * hp + 0.07 * ly;
                ly
            })
            .collect()
    }

    fn mix(parts: &[&[f32]], len: usize, noise_seed: u32) -> Vec<i16> {
        let mut seed = noise_seed;
        (0..len)
            .map(|i| {
                // Line hiss around -60 dBFS.
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let n = ((seed >> 16) as f32 / 65536.0 - 0.5) * 60.0;
                let s: f32 = parts.iter().map(|p| p.get(i).copied().unwrap_or(0.0)).sum();
                (s + n).clamp(-32768.0, 32767.0) as i16
            })
            .collect()
    }

    /// Runs the estimator over `caller` against `agent` played from sample 0; returns, per
    /// caller frame, (explained, caller level).
    fn run(agent: &[i16], caller: &[i16], floor_db: f32) -> (EchoEstimator, Vec<bool>) {
        let agent_db: Vec<f32> = agent
            .chunks(160)
            .map(|c| ulaw_db(&encode_ulaw(c)))
            .collect();
        let mut est = EchoEstimator::default();
        let mut out = Vec::new();
        for (n, frame) in caller.chunks(160).enumerate() {
            let mut played = [MIN_DB; LAGS];
            for (k, p) in played.iter_mut().enumerate() {
                if let Some(i) = n.checked_sub(k) {
                    *p = agent_db.get(i).copied().unwrap_or(MIN_DB);
                }
            }
            out.push(est.push(ulaw_db(&encode_ulaw(frame)), floor_db, &played));
        }
        (est, out)
    }

    fn share(flags: &[bool], voiced: &[bool]) -> f64 {
        let n = voiced.iter().filter(|v| **v).count().max(1);
        let hit = flags.iter().zip(voiced).filter(|(f, v)| **f && **v).count();
        hit as f64 / n as f64
    }

    /// Frames of `pcm` louder than `db`.
    fn loud(pcm: &[i16], db: f32) -> Vec<bool> {
        pcm.chunks(160)
            .map(|c| ulaw_db(&encode_ulaw(c)) > db)
            .collect()
    }

    #[test]
    fn an_echo_path_is_found_and_explains_the_echo() {
        let agent = speech("speech/agent_voice.ulaw");
        for (delay_ms, gain_db) in [(120usize, -6.0f32), (300, -20.0), (40, -10.0)] {
            let echo = echo_of(&agent, delay_ms * 8, gain_db);
            let caller = mix(&[&echo], agent.len(), 7);
            let (est, explained) = run(&agent, &caller, -60.0);
            let path = est.path().expect("an echo path");
            assert!(
                path.delay_ms.abs_diff(delay_ms as u64) <= 20,
                "{delay_ms} ms, {gain_db} dB: found {path:?}"
            );
            // The line's band limit takes the voice's energy under 300 Hz too.
            assert!(
                path.gain_db < gain_db + 2.0 && path.gain_db > gain_db - 8.0,
                "{delay_ms} ms, {gain_db} dB: found {path:?}"
            );
            // After the first second, the echo's audible frames are explained.
            let voiced = loud(&caller, -50.0);
            let share = share(&explained[50..], &voiced[50..]);
            assert!(
                share > 0.9,
                "{delay_ms} ms, {gain_db} dB: {share:.2} explained"
            );
        }
    }

    #[test]
    fn a_path_that_changes_is_found_again() {
        let agent = speech("speech/agent_voice.ulaw");
        let near = echo_of(&agent, 960, -6.0);
        let far = echo_of(&agent, 2400, -12.0);
        // The first 3 s echo 120 ms late, the rest 300 ms late.
        let cut = 24_000;
        let echo: Vec<f32> = (0..agent.len())
            .map(|i| if i < cut { near[i] } else { far[i] })
            .collect();
        let caller = mix(&[&echo], agent.len(), 5);
        let (est, _) = run(&agent[..cut], &caller[..cut], -60.0);
        assert_eq!(
            est.path().map(|p| p.delay_ms / 20),
            Some(6),
            "{:?}",
            est.path()
        );
        let (est, explained) = run(&agent, &caller, -60.0);
        let path = est.path().expect("found again");
        assert!(path.delay_ms.abs_diff(300) <= 20, "{path:?}");
        // Its last two seconds are explained again.
        let voiced = loud(&caller, -50.0);
        let n = explained.len();
        let share = share(&explained[n - 100..], &voiced[n - 100..]);
        assert!(share > 0.8, "{share:.2}");
    }

    #[test]
    fn a_caller_talking_over_the_echo_is_not_explained() {
        let agent = speech("speech/agent_voice.ulaw");
        let caller_voice = speech("speech/move_it.ulaw");
        let echo = echo_of(&agent, 960, -6.0);
        // The caller starts talking 2 s in, at their own level.
        let start = 16_000;
        let talk: Vec<f32> = (0..agent.len())
            .map(|i| {
                i.checked_sub(start)
                    .and_then(|j| caller_voice.get(j))
                    .map_or(0.0, |&s| f32::from(s))
            })
            .collect();
        let caller = mix(&[&echo, &talk], agent.len(), 9);
        let (est, explained) = run(&agent, &caller, -60.0);
        assert!(est.path().is_some(), "the path stays locked");
        let talk_pcm: Vec<i16> = talk.iter().map(|&s| s as i16).collect();
        let voiced = loud(&talk_pcm, -35.0);
        let share = share(&explained, &voiced);
        assert!(
            share < 0.25,
            "{share:.2} of the caller's loud frames were taken for echo"
        );
    }

    #[test]
    fn without_an_echo_nothing_is_locked_or_explained() {
        let agent = speech("speech/agent_voice.ulaw");
        let caller_voice = speech("speech/move_it.ulaw");
        // The caller talks over the agent; the line has no echo.
        let talk: Vec<f32> = caller_voice.iter().map(|&s| f32::from(s)).collect();
        let len = agent.len().min(talk.len());
        let caller = mix(&[&talk], len, 3);
        let (est, explained) = run(&agent[..len], &caller, -60.0);
        assert_eq!(est.path(), None);
        assert!(!explained.iter().any(|e| *e));
    }

    #[test]
    fn quiet_frames_and_silence_played_explain_nothing() {
        let mut est = EchoEstimator::default();
        let played = [MIN_DB; LAGS];
        for _ in 0..100 {
            assert!(!est.push(-20.0, -60.0, &played));
        }
        assert_eq!(est.path(), None);
        let loud = [-20.0; LAGS];
        assert!(!est.push(-59.0, -60.0, &loud), "at the floor: no evidence");
    }

    #[test]
    fn levels_in_dbfs() {
        assert_eq!(ulaw_db(&[0xFF; 160]), MIN_DB);
        assert_eq!(ulaw_db(&[]), MIN_DB);
        let tone = crate::audio::g711::ulaw_tone(440.0, 20, 8000);
        let db = ulaw_db(&tone);
        // A sine of amplitude 8000 has RMS 5657: -15.2 dBFS.
        assert!((db + 15.2).abs() < 0.5, "{db}");
    }
}
