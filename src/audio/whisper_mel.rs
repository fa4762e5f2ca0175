//! Whisper's log-mel spectrogram for 8 s of 16 kHz audio (feature `smart_turn`), as the Smart
//! Turn v3 model takes it: the waveform normalised to zero mean and unit variance, a centred
//! (reflect-padded) 400-point periodic-Hann STFT with hop 160 on `realfft`, the power spectrum
//! projected on 80 Slaney-normalised mel filters (0–8 kHz), `log10` floored at 1e-10, the last
//! frame dropped, clamped to 8 below the maximum and mapped by `(x + 4) / 4`. It follows
//! `transformers.WhisperFeatureExtractor` as vendored by pipecat
//! (`pipecat/audio/turn/smart_turn/_whisper_features.py`); `tests/fixtures/smart_turn/`
//! holds numpy's output for a clip, which the feature tests compare against.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

/// FFT size (25 ms).
pub const N_FFT: usize = 400;
/// Hop (10 ms).
pub const HOP: usize = 160;
/// Mel bins.
pub const N_MELS: usize = 80;
/// Samples the model looks at (8 s at 16 kHz).
pub const SAMPLES: usize = 128_000;
/// Frames produced for [`SAMPLES`].
pub const FRAMES: usize = SAMPLES / HOP;
const BINS: usize = N_FFT / 2 + 1;

/// The precomputed window, filters and FFT plan (cheap to reuse, not to build).
pub struct WhisperMel {
    fft: Arc<dyn RealToComplex<f64>>,
    window: Vec<f64>,
    /// `N_MELS` rows of `BINS` weights.
    filters: Vec<f64>,
    /// Per mel filter, the bins where its weight is not zero (a triangle a few bins wide):
    /// the projection skips the rest, 80 × 201 products a frame becoming about 2 × 201.
    spans: Vec<std::ops::Range<usize>>,
}

impl Default for WhisperMel {
    fn default() -> Self {
        Self::new()
    }
}

fn hz_to_mel(f: f64) -> f64 {
    let logstep = 27.0 / 6.4f64.ln();
    if f >= 1000.0 {
        15.0 + (f / 1000.0).ln() * logstep
    } else {
        3.0 * f / 200.0
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let logstep = 6.4f64.ln() / 27.0;
    if m >= 15.0 {
        1000.0 * (logstep * (m - 15.0)).exp()
    } else {
        200.0 * m / 3.0
    }
}

impl WhisperMel {
    pub fn new() -> Self {
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
            .collect();
        let (mel_min, mel_max) = (hz_to_mel(0.0), hz_to_mel(8000.0));
        let filter_hz: Vec<f64> = (0..N_MELS + 2)
            .map(|i| mel_to_hz(mel_min + (mel_max - mel_min) * i as f64 / (N_MELS + 1) as f64))
            .collect();
        let fft_hz: Vec<f64> = (0..BINS)
            .map(|i| 8000.0 * i as f64 / (BINS - 1) as f64)
            .collect();
        let mut filters = vec![0.0; N_MELS * BINS];
        for m in 0..N_MELS {
            let enorm = 2.0 / (filter_hz[m + 2] - filter_hz[m]);
            for (b, &f) in fft_hz.iter().enumerate() {
                let down = (f - filter_hz[m]) / (filter_hz[m + 1] - filter_hz[m]);
                let up = (filter_hz[m + 2] - f) / (filter_hz[m + 2] - filter_hz[m + 1]);
                filters[m * BINS + b] = down.min(up).max(0.0) * enorm;
            }
        }
        let spans = (0..N_MELS)
            .map(|m| {
                let row = &filters[m * BINS..(m + 1) * BINS];
                let lo = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let hi = row.iter().rposition(|&w| w != 0.0).map_or(lo, |i| i + 1);
                lo..hi
            })
            .collect();
        Self {
            fft: RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT),
            window,
            filters,
            spans,
        }
    }

    /// Features `[N_MELS][FRAMES]` (row-major) of the last 8 s of `audio` (16 kHz, −1..1),
    /// zero-padded at the front when shorter.
    pub fn features(&self, audio: &[f32]) -> Vec<f32> {
        let tail = &audio[audio.len().saturating_sub(SAMPLES)..];
        let mut x = vec![0f32; SAMPLES - tail.len()];
        x.extend_from_slice(tail);
        // Zero mean, unit variance (float32 like the reference; sums in f64).
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / SAMPLES as f64;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / SAMPLES as f64;
        let (mean, scale) = (mean as f32, (var as f32 + 1e-7).sqrt());
        let x: Vec<f64> = x.iter().map(|&v| f64::from((v - mean) / scale)).collect();
        // Reflect padding of N_FFT / 2 on both sides (numpy's "reflect": the edge is not
        // repeated).
        let pad = N_FFT / 2;
        let mut padded = Vec::with_capacity(SAMPLES + 2 * pad);
        padded.extend((1..=pad).rev().map(|i| x[i]));
        padded.extend_from_slice(&x);
        padded.extend((1..=pad).map(|i| x[SAMPLES - 1 - i]));

        let mut frame = self.fft.make_input_vec();
        let mut spec = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0f64; BINS];
        // One frame more than kept: the reference drops the last one.
        let mut log = vec![0f64; N_MELS * FRAMES];
        let mut max = f64::MIN;
        for t in 0..FRAMES {
            let start = t * HOP;
            for (i, v) in frame.iter_mut().enumerate() {
                *v = padded[start + i] * self.window[i];
            }
            if self
                .fft
                .process_with_scratch(&mut frame, &mut spec, &mut scratch)
                .is_err()
            {
                // Sizes are fixed above, so this cannot fail; keep silence if it did.
                spec.iter_mut().for_each(|c| *c = Default::default());
            }
            for (p, c) in power.iter_mut().zip(&spec) {
                *p = c.norm_sqr();
            }
            for (m, span) in self.spans.iter().enumerate() {
                // Outside its span a filter's weights are 0: skipping them changes no sum.
                let row = &self.filters[m * BINS + span.start..m * BINS + span.end];
                let e: f64 = row
                    .iter()
                    .zip(&power[span.clone()])
                    .map(|(w, p)| w * p)
                    .sum();
                let l = e.max(1e-10).log10();
                max = max.max(l);
                log[m * FRAMES + t] = l;
            }
        }
        log.iter()
            .map(|&l| ((l.max(max - 8.0) + 4.0) / 4.0) as f32)
            .collect()
    }
}
