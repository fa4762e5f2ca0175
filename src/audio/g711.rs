//! G.711 codecs: μ-law (PCMU, what Twilio streams) and A-law (PCMA), to and from signed 16-bit
//! PCM. The encoders match CPython 3.11 `audioop.lin2ulaw` / `lin2alaw` for every input (the
//! 14-bit / 13-bit "Sun" form that floors before negating), and the decoders are the standard
//! tables. Also here: the silence bytes, mean-absolute frame energy, and a μ-law sine-tone
//! generator used by the carrier simulators.

/// μ-law byte for digital silence (decodes to 0). Pad and fill with this, never 0x00.
pub const SILENCE_ULAW: u8 = 0xFF;
/// A-law byte for silence (decodes to +8).
pub const SILENCE_ALAW: u8 = 0xD5;
/// Samples (and μ-law bytes) per millisecond at 8 kHz.
pub(crate) const SAMPLES_PER_MS: usize = 8;

const fn ulaw_decode_one(byte: u8) -> i16 {
    let u = !byte;
    let exponent = (u >> 4) & 0x07;
    let mantissa = (u & 0x0F) as i32;
    let t = ((mantissa << 3) + 0x84) << exponent;
    if u & 0x80 != 0 {
        (0x84 - t) as i16
    } else {
        (t - 0x84) as i16
    }
}

const fn alaw_decode_one(byte: u8) -> i16 {
    let a = byte ^ 0x55;
    let m = (a & 0x0F) as i32;
    let seg = ((a >> 4) & 0x07) as i32;
    let t = match seg {
        0 => (m << 4) + 8,
        1 => (m << 4) + 0x108,
        _ => ((m << 4) + 0x108) << (seg - 1),
    };
    if a & 0x80 != 0 { t as i16 } else { -t as i16 }
}

const fn build_table(alaw: bool) -> [i16; 256] {
    let mut table = [0i16; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = if alaw {
            alaw_decode_one(i as u8)
        } else {
            ulaw_decode_one(i as u8)
        };
        i += 1;
    }
    table
}

/// μ-law byte → PCM sample, indexed by byte value.
pub(crate) static ULAW_DECODE: [i16; 256] = build_table(false);
/// A-law byte → PCM sample, indexed by byte value.
pub(crate) static ALAW_DECODE: [i16; 256] = build_table(true);

const ULAW_SEG_END: [i32; 8] = [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF];
const ALAW_SEG_END: [i32; 8] = [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF];

/// Decodes one μ-law byte.
#[inline]
pub fn ulaw_to_linear(byte: u8) -> i16 {
    ULAW_DECODE[byte as usize]
}

/// Encodes one PCM sample as μ-law, exactly as `audioop.lin2ulaw` does.
pub fn linear_to_ulaw(sample: i16) -> u8 {
    // 14-bit value; the shift is arithmetic (floors), which is where audioop differs from the
    // "classic" 16-bit encoder on some negative inputs.
    let mut x = (sample as i32) >> 2;
    let mask: i32 = if x < 0 {
        x = -x;
        0x7F
    } else {
        0xFF
    };
    // audioop clips the magnitude at 8159 before adding the bias (33 = 0x84 >> 2).
    x = x.min(8159) + 33;
    match ULAW_SEG_END.iter().position(|&end| x <= end) {
        Some(seg) => ((((seg as i32) << 4) | ((x >> (seg + 1)) & 0x0F)) ^ mask) as u8,
        None => (0x7F ^ mask) as u8,
    }
}

/// Decodes one A-law byte.
#[inline]
pub fn alaw_to_linear(byte: u8) -> i16 {
    ALAW_DECODE[byte as usize]
}

/// Encodes one PCM sample as A-law, exactly as `audioop.lin2alaw` does.
pub fn linear_to_alaw(sample: i16) -> u8 {
    // 13-bit value, arithmetic shift.
    let mut x = (sample as i32) >> 3;
    let mask: i32 = if x >= 0 {
        0xD5
    } else {
        x = -x - 1;
        0x55
    };
    match ALAW_SEG_END.iter().position(|&end| x <= end) {
        Some(seg) => {
            let quant = if seg < 2 {
                (x >> 1) & 0x0F
            } else {
                (x >> seg) & 0x0F
            };
            ((((seg as i32) << 4) | quant) ^ mask) as u8
        }
        None => (0x7F ^ mask) as u8,
    }
}

/// Decodes a μ-law buffer to PCM.
pub fn decode_ulaw(bytes: &[u8]) -> Vec<i16> {
    bytes.iter().map(|&b| ulaw_to_linear(b)).collect()
}

/// Encodes PCM to μ-law.
pub fn encode_ulaw(samples: &[i16]) -> Vec<u8> {
    samples.iter().map(|&s| linear_to_ulaw(s)).collect()
}

/// Mean absolute PCM value of a μ-law frame (0 for an empty frame). Silence (0xFF) is 0; a
/// full-scale tone is around 20 000. A cheap loudness measure for voice-activity checks.
pub fn ulaw_energy(frame: &[u8]) -> u32 {
    if frame.is_empty() {
        return 0;
    }
    let sum: u64 = frame
        .iter()
        .map(|&b| u64::from(ulaw_to_linear(b).unsigned_abs()))
        .sum();
    (sum / frame.len() as u64) as u32
}

/// A μ-law sine tone of `freq_hz`, `ms` milliseconds long (8 samples per ms), with peak
/// `amplitude` (clamped to the i16 range). Starts at phase 0.
pub fn ulaw_tone(freq_hz: f64, ms: u64, amplitude: i16) -> Vec<u8> {
    let n = (ms as usize).saturating_mul(SAMPLES_PER_MS);
    let amp = f64::from(amplitude);
    (0..n)
        .map(|i| {
            let phase = 2.0 * std::f64::consts::PI * freq_hz * (i as f64) / 8000.0;
            let v = (amp * phase.sin()).round().clamp(-32768.0, 32767.0) as i16;
            linear_to_ulaw(v)
        })
        .collect()
}

/// `ms` milliseconds of μ-law silence.
pub fn ulaw_silence(ms: u64) -> Vec<u8> {
    vec![SILENCE_ULAW; (ms as usize).saturating_mul(SAMPLES_PER_MS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_and_zeros() {
        assert_eq!(ulaw_to_linear(0xFF), 0);
        assert_eq!(ulaw_to_linear(0x7F), 0);
        assert_eq!(linear_to_ulaw(0), 0xFF);
        assert_eq!(alaw_to_linear(SILENCE_ALAW), 8);
        assert_eq!(ulaw_energy(&ulaw_silence(20)), 0);
    }

    #[test]
    fn round_trip_is_stable() {
        for b in 0..=255u8 {
            let pcm = ulaw_to_linear(b);
            // 0x7F (negative zero) re-encodes as 0xFF.
            if b != 0x7F {
                assert_eq!(linear_to_ulaw(pcm), b, "byte {b:#04x}");
            }
            assert_eq!(
                alaw_to_linear(linear_to_alaw(alaw_to_linear(b))),
                alaw_to_linear(b)
            );
        }
    }

    #[test]
    fn tone_has_energy_and_length() {
        let t = ulaw_tone(440.0, 20, 8000);
        assert_eq!(t.len(), 160);
        let e = ulaw_energy(&t);
        // Mean |sin| is 2/π of the peak: about 5100 for 8000.
        assert!((4500..5700).contains(&e), "energy {e}");
    }
}
