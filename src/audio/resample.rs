//! Band-limited sample-rate conversion of mono PCM16 streams, built on `rubato`'s synchronous
//! FFT resampler (an anti-aliasing low-pass at the lower rate's Nyquist frequency, not linear
//! interpolation). [`Resampler`] is streaming: chunks of any length go in (as samples or as
//! little-endian bytes split anywhere, even mid-sample), resampled chunks come out, and the
//! filter state, the odd byte and the not-yet-processed samples are kept across chunks.
//! [`Resampler::finish`] flushes the tail. The resampler's start-up delay is trimmed, so the
//! output lines up with the input and has `round(n · out / in)` samples in total.
//!
//! Used for TTS vendors that only speak linear PCM at 16/22.05/24/44.1/48 kHz (OpenAI speech,
//! self-hosted Kokoro / speaches) on their way to 8 kHz μ-law, and 8 → 16 kHz for anything that
//! wants wideband input. The cost per second of audio is measured by
//! `cargo bench --bench hot_path -- resample` (docs/BENCHMARKS.md).

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler as _};

/// Rates the resampler is set up and tested for (Hz). Any pair of them works.
pub(crate) const SUPPORTED_RATES: &[u32] = &[8_000, 16_000, 22_050, 24_000, 44_100, 48_000];

/// The resampler could not be built for these rates.
#[derive(Debug, thiserror::Error)]
pub enum ResampleError {
    #[error(
        "cannot resample {from} Hz to {to} Hz: supported rates are 8000, 16000, 22050, 24000, 44100 and 48000"
    )]
    UnsupportedRate { from: u32, to: u32 },
    #[error("the resampler could not be built for {from} Hz to {to} Hz: {reason}")]
    Build { from: u32, to: u32, reason: String },
}

/// Input processed per FFT block: about 20 ms, so audio comes out at most one block (plus the
/// filter's half-block delay) after it went in.
const BLOCK_MS: usize = 20;

/// A streaming mono PCM16 resampler. Not `Sync`-shared: one per stream.
pub struct Resampler {
    from: u32,
    to: u32,
    /// `None` when the rates are equal (samples pass through).
    fft: Option<Fft<f32>>,
    /// Samples received but not yet processed (less than one block after each push).
    pending: Vec<f32>,
    /// A little-endian byte whose partner has not arrived yet.
    odd_byte: Option<u8>,
    /// Output scratch, sized for one block.
    scratch: Vec<f32>,
    /// Output samples still to drop: the resampler's start-up delay.
    skip: usize,
    /// Input samples received, output samples emitted (for the exact tail on `finish`).
    received: u64,
    emitted: u64,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Resampler {
    /// A resampler from `from` Hz to `to` Hz (both in [`SUPPORTED_RATES`]).
    pub fn new(from: u32, to: u32) -> Result<Self, ResampleError> {
        if !SUPPORTED_RATES.contains(&from) || !SUPPORTED_RATES.contains(&to) {
            return Err(ResampleError::UnsupportedRate { from, to });
        }
        let (fft, scratch, skip) = if from == to {
            (None, Vec::new(), 0)
        } else {
            let chunk = from as usize * BLOCK_MS / 1000;
            let fft = Fft::<f32>::new(from as usize, to as usize, chunk, 1, FixedSync::Both)
                .map_err(|e| ResampleError::Build {
                    from,
                    to,
                    reason: e.to_string(),
                })?;
            let scratch = vec![0.0; fft.output_frames_max()];
            let skip = fft.output_delay();
            (Some(fft), scratch, skip)
        };
        Ok(Self {
            from,
            to,
            fft,
            pending: Vec::new(),
            odd_byte: None,
            scratch,
            skip,
            received: 0,
            emitted: 0,
        })
    }

    /// Feeds samples; appends whatever output is ready to `out`.
    pub fn push(&mut self, samples: &[i16], out: &mut Vec<i16>) {
        self.received += samples.len() as u64;
        if self.fft.is_none() {
            out.extend_from_slice(samples);
            self.emitted += samples.len() as u64;
            return;
        }
        self.pending
            .extend(samples.iter().map(|&s| f32::from(s) / 32768.0));
        self.run(out);
    }

    /// Feeds little-endian PCM16 bytes split anywhere (an odd trailing byte waits for the next
    /// chunk); appends whatever output is ready to `out`.
    pub fn push_le_bytes(&mut self, mut bytes: &[u8], out: &mut Vec<i16>) {
        let mut samples = Vec::with_capacity(bytes.len() / 2 + 1);
        if let Some(lo) = self.odd_byte.take() {
            match bytes.split_first() {
                Some((&hi, rest)) => {
                    samples.push(i16::from_le_bytes([lo, hi]));
                    bytes = rest;
                }
                None => {
                    self.odd_byte = Some(lo);
                    return;
                }
            }
        }
        let pairs = bytes.chunks_exact(2);
        if let [last] = pairs.remainder() {
            self.odd_byte = Some(*last);
        }
        samples.extend(pairs.map(|p| i16::from_le_bytes([p[0], p[1]])));
        self.push(&samples, out);
    }

    /// Flushes the tail: the last partial block and the filter's delay line. A dangling odd
    /// byte is dropped. The resampler is then ready for a new stream.
    pub fn finish(&mut self, out: &mut Vec<i16>) {
        self.odd_byte = None;
        if let Some(fft) = &self.fft {
            let total = (self.received * u64::from(self.to) + u64::from(self.from) / 2)
                / u64::from(self.from);
            // Zeros push the real samples out of the delay line; stop once the tail is out.
            let block = fft.input_frames_next();
            let mut guard = 0;
            while self.emitted < total && guard < 64 {
                self.pending.resize(self.pending.len() + block, 0.0);
                let before = out.len();
                self.run(out);
                let over = (self.emitted.saturating_sub(total)) as usize;
                out.truncate(out.len() - over.min(out.len() - before));
                self.emitted = self.emitted.min(total);
                guard += 1;
            }
            if let Some(fft) = &mut self.fft {
                fft.reset();
                self.skip = fft.output_delay();
            }
        }
        self.pending.clear();
        self.received = 0;
        self.emitted = 0;
    }

    /// Processes every whole block in `pending`.
    fn run(&mut self, out: &mut Vec<i16>) {
        let Some(fft) = &mut self.fft else {
            return;
        };
        let mut start = 0;
        loop {
            let need = fft.input_frames_next();
            if self.pending.len() - start < need {
                break;
            }
            let input = &self.pending[start..start + need];
            let cap = self.scratch.len();
            let (Ok(inp), Ok(mut outp)) = (
                InterleavedSlice::new(input, 1, need),
                InterleavedSlice::new_mut(&mut self.scratch, 1, cap),
            ) else {
                // Only possible if the buffers were sized wrongly; sizes come from the resampler.
                break;
            };
            let Ok((used, written)) = fft.process_into_buffer(&inp, &mut outp, None) else {
                break;
            };
            start += used;
            let drop = self.skip.min(written);
            self.skip -= drop;
            out.extend(self.scratch[drop..written].iter().map(|&v| to_i16(v)));
            self.emitted += (written - drop) as u64;
        }
        self.pending.drain(..start);
    }
}

fn to_i16(v: f32) -> i16 {
    (v * 32768.0).round().clamp(-32768.0, 32767.0) as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, freq: f64, secs: f64, amp: f64) -> Vec<i16> {
        let n = (f64::from(rate) * secs) as usize;
        (0..n)
            .map(|i| {
                let t = i as f64 / f64::from(rate);
                (amp * 32767.0 * (2.0 * std::f64::consts::PI * freq * t).sin()).round() as i16
            })
            .collect()
    }

    /// Resamples `input` fed in uneven chunks (as bytes split mid-sample).
    fn stream(r: &mut Resampler, input: &[i16]) -> Vec<i16> {
        let bytes: Vec<u8> = input.iter().flat_map(|s| s.to_le_bytes()).collect();
        let mut out = Vec::new();
        let sizes = [1usize, 333, 960, 7, 4096, 2];
        let mut i = 0;
        let mut k = 0;
        while i < bytes.len() {
            let n = sizes[k % sizes.len()].min(bytes.len() - i);
            r.push_le_bytes(&bytes[i..i + n], &mut out);
            i += n;
            k += 1;
        }
        r.finish(&mut out);
        out
    }

    /// Energy of `x` at `freq` (Goertzel-free: correlation with a quadrature pair), as RMS.
    fn amplitude_at(x: &[i16], rate: u32, freq: f64) -> f64 {
        let (mut re, mut im) = (0.0f64, 0.0f64);
        for (i, &s) in x.iter().enumerate() {
            let ph = 2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate);
            re += f64::from(s) * ph.cos();
            im += f64::from(s) * ph.sin();
        }
        2.0 * (re * re + im * im).sqrt() / x.len() as f64
    }

    fn rms(x: &[i16]) -> f64 {
        (x.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
    }

    #[test]
    fn output_length_is_exact_and_lines_up_with_the_input() {
        for &from in SUPPORTED_RATES {
            let mut r = Resampler::new(from, 8000).expect("build");
            let input = tone(from, 440.0, 0.5, 0.5);
            let out = stream(&mut r, &input);
            let want = (input.len() as u64 * 8000).div_ceil(u64::from(from)) as i64;
            assert!(
                (out.len() as i64 - want).abs() <= 1,
                "{from} Hz: {} samples out, want {want}",
                out.len()
            );
            // No start-up delay left: the tone (already up at sample 0) is there by 5 ms.
            let head = &out[40..80];
            assert!(rms(head) > 5000.0, "{from} Hz: head rms {}", rms(head));
            // A pure 440 Hz tone passes at its level (within 0.5 dB).
            let mid = &out[800..3200];
            let a = amplitude_at(mid, 8000, 440.0) / (0.5 * 32767.0);
            assert!((0.944..1.06).contains(&a), "{from} Hz: 440 Hz gain {a}");
        }
    }

    #[test]
    fn a_tone_sweep_above_4_khz_folds_back_at_least_40_db_down() {
        for &from in &[16_000u32, 22_050, 24_000, 44_100, 48_000] {
            let nyq = f64::from(from) / 2.0;
            let mut freq = 4400.0;
            while freq < nyq.min(11_500.0) {
                let mut r = Resampler::new(from, 8000).expect("build");
                let input = tone(from, freq, 0.4, 0.9);
                let out = stream(&mut r, &input);
                let body = &out[400..out.len() - 400];
                // Everything left below 4 kHz is aliasing (the input had nothing there).
                let leak = rms(body) / (0.9 * 32767.0 / std::f64::consts::SQRT_2);
                let db = 20.0 * leak.max(1e-9).log10();
                assert!(
                    db <= -40.0,
                    "{from} Hz, {freq} Hz tone: alias at {db:.1} dB"
                );
                freq += 700.0;
            }
        }
    }

    #[test]
    fn the_passband_keeps_speech_frequencies() {
        let mut r = Resampler::new(24_000, 8000).expect("build");
        for freq in [300.0, 1000.0, 2000.0, 3000.0] {
            let input = tone(24_000, freq, 0.3, 0.5);
            let out = stream(&mut r, &input);
            let a = amplitude_at(&out[400..2000], 8000, freq) / (0.5 * 32767.0);
            assert!((0.89..1.06).contains(&a), "{freq} Hz gain {a}");
        }
    }

    #[test]
    fn upsampling_8_to_16_khz_keeps_the_tone_and_adds_no_image() {
        let mut r = Resampler::new(8000, 16_000).expect("build");
        let input = tone(8000, 1000.0, 0.5, 0.5);
        let out = stream(&mut r, &input);
        assert_eq!(out.len(), 8000);
        let a = amplitude_at(&out[800..7200], 16_000, 1000.0) / (0.5 * 32767.0);
        assert!((0.944..1.06).contains(&a), "gain {a}");
        // The image of a 1 kHz tone at 7 kHz must be gone.
        let img = amplitude_at(&out[800..7200], 16_000, 7000.0) / (0.5 * 32767.0);
        assert!(20.0 * img.max(1e-9).log10() < -40.0, "image {img}");
    }

    #[test]
    fn equal_rates_pass_through_and_odd_bytes_wait_for_their_partner() {
        let mut r = Resampler::new(8000, 8000).expect("build");
        let mut out = Vec::new();
        r.push_le_bytes(&[0x34], &mut out);
        assert!(out.is_empty());
        r.push_le_bytes(&[0x12, 0xff], &mut out);
        assert_eq!(out, vec![0x1234]);
        r.push_le_bytes(&[0x7f], &mut out);
        assert_eq!(out, vec![0x1234, 0x7fff]);
    }

    #[test]
    fn unsupported_rates_are_refused_with_the_list() {
        let e = Resampler::new(11_025, 8000).expect_err("refused");
        assert!(e.to_string().contains("supported rates are"), "{e}");
    }
}
