//! The answering machine's beep: an in-band detector of the single steady tone that ends a
//! voicemail greeting, on 8 kHz μ-law caller audio, sans I/O (audio in, a [`Beep`] out when a
//! tone has ended). A bank of Goertzel filters spaced [`BIN_STEP_HZ`] apart from
//! [`LOW_HZ`] to [`HIGH_HZ`] (machines beep anywhere from about 400 Hz to 2100 Hz: 1000 Hz and
//! 1400 Hz are common, carriers' mailboxes use 1250, 1500 or 1700 Hz) runs over 20 ms windows
//! every 10 ms. A window is *tonal* when one bin holds at least [`PURITY`] of the window's
//! energy (a sine anywhere in the band keeps at least 81 % in its nearest bin; speech spreads
//! its energy over several harmonics, noise over the whole band, DTMF over two tones) and the
//! window is louder than [`MIN_LEVEL_DB`]. A run of tonal windows on one frequency (±1 bin),
//! tonal over 40 ms too once it is that long, is a beep if its level holds steady, it holds
//! [`BEEP_PURITY`] of its energy on average (a held vowel's strongest harmonic does not), and
//! it spans at least [`MIN_TONE_MS`] and at most [`MAX_TONE_MS`]; it is reported when it has
//! *ended* (two windows in a row not tonal at its frequency), never while it sounds, so
//! whatever is said after the report starts after the tone.

use super::g711::ulaw_to_linear;

/// Samples per analysis window (20 ms at 8 kHz): 50 Hz resolution.
const WINDOW: usize = 160;
/// Samples between windows (10 ms).
const HOP: usize = 80;
/// Samples of the steadiness check (40 ms, 25 Hz resolution): once a run is longer, each of its
/// windows must also be tonal over the last 40 ms at the run's frequency (±12.5 Hz). Two
/// tones closer than a window resolves (ringback's 440 + 480 Hz) and a voice's harmonic
/// gliding with its pitch are not.
const LONG: usize = 320;
/// Lowest and highest filter frequency (Hz).
pub(crate) const LOW_HZ: u32 = 350;
pub(crate) const HIGH_HZ: u32 = 2150;
/// Spacing of the filters (Hz): half the window's resolution, so a tone is never more than a
/// quarter of a resolution cell from a filter's centre.
pub(crate) const BIN_STEP_HZ: u32 = 25;
/// Share of a window's energy the strongest filter must hold for the window to be tonal.
pub(crate) const PURITY: f32 = 0.6;
/// Share a beep holds on average inside its run (edges excluded), measured ±12.5 Hz around
/// its filter: a clean sine keeps at least 95 % wherever it lies, 86 % under noise 10 dB
/// down; a voice's strongest harmonic on a held vowel stays under 80 %.
pub(crate) const BEEP_PURITY: f32 = 0.8;
/// Quietest tonal window (mean square, dB below full scale).
pub(crate) const MIN_LEVEL_DB: f32 = -45.0;
/// Shortest and longest run of tonal windows that counts as a beep (from the first window's
/// start to the last one's end: about the tone's length plus 16 ms).
pub(crate) const MIN_TONE_MS: u64 = 120;
pub(crate) const MAX_TONE_MS: u64 = 5000;
/// Largest spread of the levels inside a run (dB, edges excluded): a beep is steady, a sung
/// vowel is not.
const MAX_SPREAD_DB: f32 = 3.0;
/// Non-tonal windows in a row that end a run (a single one is a dip, not the end).
const END_WINDOWS: u32 = 2;
const RATE: f32 = 8000.0;

/// A beep that has ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Beep {
    /// Its frequency (the strongest filter's, ±[`BIN_STEP_HZ`]).
    pub(crate) freq_hz: u32,
    /// When it started and when it ended, in ms of audio pushed (estimates, ±10 ms).
    pub(crate) start_ms: u64,
    pub(crate) end_ms: u64,
    /// Its level (mean square, dB below full scale).
    pub(crate) level_db: f32,
}

impl Beep {
    /// How long it lasted (ms).
    pub(crate) fn length_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
    }
}

/// A run of tonal windows on one frequency.
struct Run {
    bin: usize,
    /// First sample of its first window, last sample (exclusive) of its last tonal one.
    start: u64,
    end: u64,
    /// Level (dB) and purity of each tonal window.
    windows: Vec<Tonal>,
    /// Non-tonal windows since its last tonal one.
    misses: u32,
}

/// A tonal window: its strongest filter, level (dB) and the share of its energy at that
/// frequency.
#[derive(Debug, Clone, Copy)]
struct Tonal {
    bin: usize,
    level: f32,
    purity: f32,
}

/// The detector (see the module docs): push caller audio, get a [`Beep`] once one has ended.
pub(crate) struct BeepDetector {
    /// Each filter's Goertzel coefficient, `2 cos(2π f / rate)`.
    coeffs: Vec<f32>,
    /// The newest samples (at most [`LONG`]; the window is the last [`WINDOW`]), scaled to ±1.
    buf: Vec<f32>,
    /// Samples pushed so far.
    pushed: u64,
    run: Option<Run>,
}

impl Default for BeepDetector {
    fn default() -> Self {
        Self::new()
    }
}

impl BeepDetector {
    pub(crate) fn new() -> Self {
        let coeffs = (LOW_HZ..=HIGH_HZ)
            .step_by(BIN_STEP_HZ as usize)
            .map(|f| coeff(f as f32))
            .collect();
        Self {
            coeffs,
            buf: Vec::with_capacity(LONG + HOP),
            pushed: 0,
            run: None,
        }
    }

    /// Takes in μ-law audio of any length; returns the beep that ended in it, if one did.
    pub(crate) fn push_ulaw(&mut self, audio: &[u8]) -> Option<Beep> {
        let mut found = None;
        for &b in audio {
            self.buf.push(f32::from(ulaw_to_linear(b)) / 32768.0);
            self.pushed += 1;
            if self.pushed.is_multiple_of(HOP as u64) && self.buf.len() >= WINDOW {
                found = found.or(self.window());
                let extra = self.buf.len().saturating_sub(LONG);
                self.buf.drain(..extra);
            }
        }
        found
    }

    /// Audio pushed so far (ms).
    #[cfg(test)]
    pub(crate) fn audio_ms(&self) -> u64 {
        self.pushed / 8
    }

    /// Judges the full window in `buf` (it ends at sample `pushed`).
    fn window(&mut self) -> Option<Beep> {
        let end = self.pushed;
        let start = end - WINDOW as u64;
        let tone = self.tone().filter(|t| self.steady(t.bin, end));
        match (&mut self.run, tone) {
            (Some(run), Some(t)) if t.bin.abs_diff(run.bin) <= 1 => {
                run.end = end;
                run.windows.push(t);
                run.misses = 0;
                None
            }
            (Some(run), other) => {
                run.misses += 1;
                if run.misses < END_WINDOWS && other.is_none() {
                    return None;
                }
                let ended = self.run.take().and_then(|r| self.judge(r));
                // A tone on another frequency starts a run of its own.
                if let Some(t) = other {
                    self.run = Some(Run::new(t, start, end));
                }
                ended
            }
            (None, Some(t)) => {
                self.run = Some(Run::new(t, start, end));
                None
            }
            (None, None) => None,
        }
    }

    /// False when the run this window would extend is longer than [`LONG`] and the last
    /// [`LONG`] samples are not tonal at its frequency (see [`LONG`]).
    fn steady(&self, bin: usize, end: u64) -> bool {
        let Some(run) = self.run.as_ref().filter(|r| bin.abs_diff(r.bin) <= 1) else {
            return true;
        };
        if run.start + (LONG + HOP) as u64 > end || self.buf.len() < LONG {
            return true;
        }
        let x = &self.buf[self.buf.len() - LONG..];
        let energy: f32 = x.iter().map(|v| v * v).sum();
        let freq = (LOW_HZ + bin as u32 * BIN_STEP_HZ) as f32;
        let best = [-12.5f32, 0.0, 12.5]
            .into_iter()
            .map(|d| goertzel(x, coeff(freq + d)))
            .fold(0.0f32, f32::max);
        2.0 * best / (LONG as f32 * energy.max(1e-12)) >= PURITY
    }

    /// The window's strongest filter, level and purity when the window is tonal.
    fn tone(&self) -> Option<Tonal> {
        let x = &self.buf[self.buf.len() - WINDOW..];
        let energy: f32 = x.iter().map(|v| v * v).sum();
        let level = 10.0 * (energy / WINDOW as f32).max(1e-12).log10();
        if level < MIN_LEVEL_DB {
            return None;
        }
        // Every other filter first (50 Hz apart: a tone between two of them still gives them
        // its largest share), then the two between which the best one sits.
        let power = |bin: usize| self.coeffs.get(bin).map(|&c| goertzel(x, c));
        let coarse = (0..self.coeffs.len())
            .step_by(2)
            .filter_map(|b| Some((b, power(b)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let (bin, power) = [coarse.0.checked_sub(1), Some(coarse.0 + 1)]
            .into_iter()
            .flatten()
            .filter_map(|b| Some((b, power(b)?)))
            .fold(coarse, |best, c| if c.1 > best.1 { c } else { best });
        // A sine of amplitude A over N samples: |X|² = (A N / 2)², energy A² N / 2.
        let share = |power: f32| 2.0 * power / (WINDOW as f32 * energy);
        if share(power) < PURITY {
            return None;
        }
        // How pure it is, a quarter of a filter step either side too.
        let freq = (LOW_HZ + bin as u32 * BIN_STEP_HZ) as f32;
        let power = [-12.5f32, 12.5]
            .into_iter()
            .map(|d| goertzel(x, coeff(freq + d)))
            .fold(power, f32::max);
        Some(Tonal {
            bin,
            level,
            purity: share(power),
        })
    }

    /// A finished run: a beep if it is long enough, not too long, and steady.
    fn judge(&self, run: Run) -> Option<Beep> {
        let span_ms = (run.end - run.start) / 8;
        if !(MIN_TONE_MS..=MAX_TONE_MS).contains(&span_ms) {
            return None;
        }
        // The first and last two windows may hold only part of the tone.
        let inner = run.windows.get(2..run.windows.len().saturating_sub(2))?;
        let n = inner.len().max(1) as f32;
        let levels = || inner.iter().map(|w| w.level);
        let (lo, hi) = (levels().reduce(f32::min)?, levels().reduce(f32::max)?);
        let purity = inner.iter().map(|w| w.purity).sum::<f32>() / n;
        if hi - lo > MAX_SPREAD_DB || purity < BEEP_PURITY {
            return None;
        }
        let level_db = levels().sum::<f32>() / n;
        // The tone fills at least PURITY of the first and last tonal windows.
        let edge = (WINDOW as f32 * (1.0 - PURITY) / 2.0) as u64;
        Some(Beep {
            freq_hz: LOW_HZ + run.bin as u32 * BIN_STEP_HZ,
            start_ms: (run.start + edge) / 8,
            end_ms: (run.end - edge) / 8,
            level_db,
        })
    }
}

impl Run {
    fn new(first: Tonal, start: u64, end: u64) -> Self {
        Self {
            bin: first.bin,
            start,
            end,
            windows: vec![first],
            misses: 0,
        }
    }
}

/// The Goertzel coefficient of `freq` (Hz): `2 cos(2π f / rate)`.
fn coeff(freq: f32) -> f32 {
    2.0 * (2.0 * std::f32::consts::PI * freq / RATE).cos()
}

/// The power `|X(f)|²` of `x` at the frequency whose coefficient is `coeff`.
fn goertzel(x: &[f32], coeff: f32) -> f32 {
    let (mut s1, mut s2) = (0.0f32, 0.0f32);
    for &v in x {
        let s = v + coeff * s1 - s2;
        s2 = s1;
        s1 = s;
    }
    (s1 * s1 + s2 * s2 - coeff * s1 * s2).max(0.0)
}

#[cfg(test)]
mod tests;
