//! WAV files for `patterd try`: the agent's μ-law audio written as 16-bit PCM at 8 kHz, and a
//! caller's recording read as μ-law 8 kHz; and mono 16-bit PCM at any rate read for the
//! `flite` TTS ([`read_pcm16`]). Only 8 kHz mono input (16-bit PCM or μ-law) is
//! accepted: the call runs at 8 kHz and this module does not resample (the error says how to
//! convert a file).

use super::g711;

/// Why a WAV file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WavError {
    #[error("not a WAV file (no RIFF/WAVE header)")]
    NotWav,
    #[error("the WAV file has no `{0}` chunk")]
    MissingChunk(&'static str),
    #[error(
        "unsupported WAV format ({0}); use 8 kHz mono 16-bit PCM or μ-law, e.g. \
         `sox in.wav -r 8000 -c 1 -b 16 out.wav`"
    )]
    Unsupported(String),
}

/// A mono 16-bit PCM WAV of `samples` at `rate`.
pub(crate) fn write_pcm16(samples: &[i16], rate: u32) -> Vec<u8> {
    let data_len = u32::try_from(samples.len() * 2).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(44 + samples.len() * 2);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&data_len.saturating_add(36).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// μ-law 8 kHz audio as a 16-bit PCM WAV.
pub fn ulaw_to_wav(ulaw: &[u8]) -> Vec<u8> {
    write_pcm16(&g711::decode_ulaw(ulaw), 8000)
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// A WAV file's `fmt ` fields: format tag, channels, sample rate, bits per sample.
type WavFormat = (u16, u16, u32, u16);

/// The format and the data of a WAV file.
fn data_chunk(bytes: &[u8]) -> Result<(WavFormat, &[u8]), WavError> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(WavError::NotWav);
    }
    let mut fmt: Option<(u16, u16, u32, u16)> = None;
    let mut i = 12;
    while i + 8 <= bytes.len() {
        let id = &bytes[i..i + 4];
        let len = u32_at(bytes, i + 4) as usize;
        let body = i + 8;
        let end = body.saturating_add(len).min(bytes.len());
        if id == b"fmt " && end - body >= 16 {
            fmt = Some((
                u16_at(bytes, body),
                u16_at(bytes, body + 2),
                u32_at(bytes, body + 4),
                u16_at(bytes, body + 14),
            ));
        } else if id == b"data" {
            let fmt = fmt.ok_or(WavError::MissingChunk("fmt "))?;
            return Ok((fmt, &bytes[body..end]));
        }
        i = body.saturating_add(len + (len & 1));
    }
    Err(WavError::MissingChunk(if fmt.is_some() {
        "data"
    } else {
        "fmt "
    }))
}

/// The audio of an 8 kHz mono WAV (16-bit PCM or μ-law) as μ-law.
pub fn read_ulaw_8k(bytes: &[u8]) -> Result<Vec<u8>, WavError> {
    let ((format, channels, rate, bits), data) = data_chunk(bytes)?;
    match (format, channels, rate, bits) {
        (1, 1, 8000, 16) => Ok(data
            .chunks_exact(2)
            .map(|c| g711::linear_to_ulaw(i16::from_le_bytes([c[0], c[1]])))
            .collect()),
        (7, 1, 8000, 8) => Ok(data.to_vec()),
        _ => Err(WavError::Unsupported(format!(
            "format {format}, {channels} channel(s), {rate} Hz, {bits} bits"
        ))),
    }
}

/// The rate and samples of a mono 16-bit PCM WAV at any rate (what `flite` writes).
pub(crate) fn read_pcm16(bytes: &[u8]) -> Result<(u32, Vec<i16>), WavError> {
    let ((format, channels, rate, bits), data) = data_chunk(bytes)?;
    if (format, channels, bits) != (1, 1, 16) || rate == 0 {
        return Err(WavError::Unsupported(format!(
            "format {format}, {channels} channel(s), {rate} Hz, {bits} bits; expected mono 16-bit PCM"
        )));
    }
    Ok((
        rate,
        data.chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let tone = g711::ulaw_tone(440.0, 100, 8000);
        let wav = ulaw_to_wav(&tone);
        assert_eq!(wav.len(), 44 + tone.len() * 2);
        assert_eq!(read_ulaw_8k(&wav), Ok(tone));
        assert_eq!(read_ulaw_8k(b"nope"), Err(WavError::NotWav));
        let wide = write_pcm16(&[0; 160], 16_000);
        assert!(matches!(read_ulaw_8k(&wide), Err(WavError::Unsupported(_))));
        assert_eq!(
            read_ulaw_8k(&wav[..40]),
            Err(WavError::MissingChunk("data"))
        );
        assert_eq!(read_pcm16(&wide), Ok((16_000, vec![0; 160])));
        assert!(matches!(
            read_pcm16(&wav[..20]),
            Err(WavError::MissingChunk(_))
        ));
        let mut stereo = write_pcm16(&[0; 160], 16_000);
        stereo[22] = 2;
        assert!(matches!(read_pcm16(&stereo), Err(WavError::Unsupported(_))));
    }
}
