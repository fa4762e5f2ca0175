//! The Twilio Media Streams wire side of the load generator's caller: the frames it sends,
//! prebuilt where they can be ([`SpeechClip`]: the speech as base64 per 20 ms frame;
//! [`tag_frame`]: the call's tagged near-silence, which the fake Deepgram reads back with
//! [`read_tag`]; [`media_frame`]: one `media` message written into a reused buffer), and the
//! check of every agent message against Twilio's protocol ([`parse_agent_message`]: JSON, a
//! known event, this stream's `streamSid`, valid base64), run in the socket's reader task,
//! which timestamps the message on arrival ([`incoming`]).

use std::io::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::OpCode;
use serde::Deserialize;
use tokio::time::Instant;

use patterd::audio::g711::{SILENCE_ULAW, linear_to_ulaw, ulaw_tone};
use patterd::carrier::FRAME_BYTES;
use patterd_sim::ws::WsFrame;

/// The caller's speech, pre-encoded as base64 payloads of 20 ms frames.
pub struct SpeechClip {
    pub frames: Vec<String>,
}

impl SpeechClip {
    /// A 440 Hz tone at -12 dBFS lasting `ms` (speech to the fake Deepgram).
    pub fn tone(ms: u64) -> Self {
        let audio = ulaw_tone(440.0, ms, 8000);
        let frames = audio
            .chunks(FRAME_BYTES)
            .map(|c| {
                let mut f = c.to_vec();
                f.resize(FRAME_BYTES, SILENCE_ULAW);
                STANDARD.encode(&f)
            })
            .collect();
        Self { frames }
    }
}

/// Frames at the start of each call that carry its tag (the fake Deepgram reads the tag from
/// the first bytes of audio a session sees; the rest of the caller's quiet is line noise).
pub const TAGGED_FRAMES: u64 = 5;

/// The caller's line when it is not speaking: `frames` 20 ms frames of steady white noise at
/// `dbfs` (RMS against full scale), base64-encoded, played in a loop by every caller. A real
/// line is never digital silence; this is the quiet of a good one (−65 dBFS by default). A
/// caller that sent its tag in every frame instead (the first rounds of docs/BENCHMARKS.md)
/// made the server's voice detector score most of its silence: 8 tagged bytes per 20 ms
/// frame over digital silence is a level that comes and goes on the detector's 16 ms grid,
/// which no real background does.
pub fn line_noise(dbfs: f32, frames: usize) -> Vec<String> {
    let rms = 32768.0 * 10f32.powf(dbfs / 20.0);
    // Uniform noise on [-a, a] has RMS a / sqrt(3).
    let amp = rms * 3f32.sqrt();
    let mut seed: u32 = 0x2545_f491;
    (0..frames)
        .map(|_| {
            let f: Vec<u8> = (0..FRAME_BYTES)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let u = (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
                    linear_to_ulaw((u * amp) as i16)
                })
                .collect();
            STANDARD.encode(&f)
        })
        .collect()
}

/// The silence frame of call `idx`: its first 8 bytes are `0xF0 | nibble` of `idx + 1`
/// (quieter than any speech threshold), the rest μ-law silence.
pub fn tag_frame(idx: u32) -> Vec<u8> {
    let mut f = vec![SILENCE_ULAW; FRAME_BYTES];
    let tag = idx + 1;
    for (i, b) in f.iter_mut().take(8).enumerate() {
        *b = 0xF0 | ((tag >> (28 - 4 * i)) & 0xF) as u8;
    }
    f
}

/// Reads the call index back from the first audio bytes the fake Deepgram saw.
pub fn read_tag(bytes: &[u8]) -> Option<u32> {
    if bytes.len() < 8 || bytes[..8].iter().any(|b| b & 0xF0 != 0xF0) {
        return None;
    }
    let tag = bytes[..8]
        .iter()
        .fold(0u32, |acc, b| (acc << 4) | u32::from(b & 0x0F));
    // All 0xFF is plain silence, not a tag.
    if tag == u32::MAX {
        None
    } else {
        tag.checked_sub(1)
    }
}

/// One agent message as the driver needs it (timestamped on arrival by the reader task).
#[derive(Debug)]
pub enum In {
    Media {
        bytes: usize,
        at: Instant,
    },
    Mark {
        name: String,
        at: Instant,
    },
    Clear {
        at: Instant,
    },
    Obligated(OpCode, Vec<u8>),
    /// A message that broke the protocol.
    Malformed,
    Closed,
}

#[derive(Deserialize)]
struct OutFrame<'a> {
    event: &'a str,
    #[serde(rename = "streamSid")]
    stream_sid: Option<&'a str>,
    #[serde(borrow)]
    media: Option<MediaPayload<'a>>,
    mark: Option<MarkName>,
}

#[derive(Deserialize)]
struct MediaPayload<'a> {
    payload: &'a str,
}

#[derive(Deserialize)]
struct MarkName {
    name: String,
}

/// Decoded length of standard, padded base64, or None when `s` is not valid base64 (checked
/// without decoding: length, alphabet, padding).
pub fn b64_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    let body_ok = b[..b.len() - pad]
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/');
    (pad <= 2 && body_ok).then(|| b.len() / 4 * 3 - pad)
}

/// Checks one text message from the server against Twilio's protocol (borrowed parse: nothing
/// is allocated for `media`, the payload is validated but never decoded).
pub fn parse_agent_message(text: &[u8], stream_sid: &str, at: Instant) -> In {
    let Ok(f) = serde_json::from_slice::<OutFrame<'_>>(text) else {
        return In::Malformed;
    };
    if f.stream_sid != Some(stream_sid) {
        return In::Malformed;
    }
    match f {
        OutFrame {
            event: "media",
            media: Some(m),
            ..
        } => match b64_len(m.payload) {
            Some(bytes) => In::Media { bytes, at },
            None => In::Malformed,
        },
        OutFrame {
            event: "mark",
            mark: Some(m),
            ..
        } => In::Mark { name: m.name, at },
        OutFrame { event: "clear", .. } => In::Clear { at },
        _ => In::Malformed,
    }
}

/// What the driver needs of one frame from the server.
pub(super) fn incoming(f: WsFrame<'_>, stream_sid: &str) -> Option<In> {
    let at = Instant::now();
    match f {
        WsFrame::Obligated(op, payload) => Some(In::Obligated(op, payload)),
        WsFrame::Text(t) => Some(parse_agent_message(t, stream_sid, at)),
        // Twilio's stream takes JSON text frames only.
        WsFrame::Binary(_) => Some(In::Malformed),
        WsFrame::Close(..) | WsFrame::Error(_) => Some(In::Closed),
    }
}

/// Writes one inbound `media` message into `buf` (cleared first): the only parts that vary
/// per frame are the sequence number, chunk and timestamp; the payload is precomputed base64.
pub fn media_frame(
    buf: &mut Vec<u8>,
    seq: u64,
    chunk: u64,
    ts_ms: u64,
    payload: &str,
    stream_sid: &str,
) {
    buf.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(
        buf,
        r#"{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound","chunk":"{chunk}","timestamp":"{ts_ms}","payload":"{payload}"}},"streamSid":"{stream_sid}"}}"#
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd::audio::vad::{Vad, VadConfig};

    /// Share of the server's voice-detector frames scored by its network over `secs` of the
    /// given looped quiet frames.
    fn scored_share(frames: &[Vec<u8>], secs: usize) -> f64 {
        let mut vad = Vad::new(VadConfig::default());
        for i in 0..secs * 50 {
            assert!(
                vad.push_ulaw(&frames[i % frames.len()]).is_empty(),
                "no speech"
            );
        }
        vad.frames_scored() as f64 / vad.frames_seen() as f64
    }

    #[test]
    fn line_noise_is_steady_quiet_and_skipped_by_the_detector() {
        let noise: Vec<Vec<u8>> = line_noise(-65.0, 50)
            .iter()
            .map(|b| STANDARD.decode(b).expect("base64"))
            .collect();
        assert!(noise.iter().all(|f| f.len() == FRAME_BYTES));
        let pcm: Vec<f64> = noise
            .concat()
            .into_iter()
            .map(|b| f64::from(patterd::audio::g711::ulaw_to_linear(b)))
            .collect();
        let rms = (pcm.iter().map(|x| x * x).sum::<f64>() / pcm.len() as f64).sqrt();
        let dbfs = 20.0 * (rms / 32768.0).log10();
        assert!((-66.5..-63.5).contains(&dbfs), "{dbfs} dBFS");
        // Steady noise sits on the detector's floor, so its network scores (almost) none of
        // it; the tag over digital silence in every frame made it score most frames.
        let quiet = scored_share(&noise, 10);
        let tagged = scored_share(&[tag_frame(3)], 10);
        assert!(quiet < 0.05, "line noise scored {quiet}");
        assert!(tagged > 0.5, "tagged silence scored {tagged}");
    }

    #[test]
    fn tags_round_trip_and_stay_quiet() {
        for idx in [0, 1, 7, 1999, 65_535, 1 << 27] {
            let f = tag_frame(idx);
            assert_eq!(read_tag(&f), Some(idx));
            assert!(patterd::audio::g711::ulaw_energy(&f) < 200);
        }
        assert_eq!(read_tag(&[SILENCE_ULAW; 16][..]), None);
        assert_eq!(read_tag(&[0x10; 16][..]), None);
    }

    #[test]
    fn base64_lengths_and_validity() {
        for n in [1, 2, 3, 160] {
            assert_eq!(b64_len(&STANDARD.encode(vec![0xA5u8; n])), Some(n));
        }
        for bad in ["", "abc", "ab=c", "a===", "ab$d", "/w==x"] {
            assert_eq!(b64_len(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn media_frame_is_the_json_twilio_sends() {
        let mut buf = Vec::new();
        let payload = STANDARD.encode(tag_frame(3));
        media_frame(&mut buf, 42, 41, 820, &payload, "MZ1");
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        assert_eq!(
            v,
            serde_json::json!({"event": "media", "sequenceNumber": "42", "streamSid": "MZ1",
                "media": {"track": "inbound", "chunk": "41", "timestamp": "820", "payload": payload}})
        );
        // The buffer is rebuilt, not appended to.
        media_frame(&mut buf, 43, 42, 840, &payload, "MZ1");
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        assert_eq!(v["sequenceNumber"], "43");
    }

    #[test]
    fn agent_messages_are_checked() {
        let at = Instant::now();
        let p = |s: &str| parse_agent_message(s.as_bytes(), "MZ1", at);
        assert!(matches!(
            p(r#"{"event":"media","streamSid":"MZ1","media":{"payload":"/w=="}}"#),
            In::Media { bytes: 1, .. }
        ));
        assert!(matches!(
            p(r#"{"event":"mark","streamSid":"MZ1","mark":{"name":"u1"}}"#),
            In::Mark { ref name, .. } if name == "u1"
        ));
        assert!(matches!(
            p(r#"{"event":"clear","streamSid":"MZ1"}"#),
            In::Clear { .. }
        ));
        for bad in [
            "not json",
            r#"{"event":"media","streamSid":"MZ2","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","streamSid":"MZ1","media":{"payload":"@@@@"}}"#,
            r#"{"event":"media","streamSid":"MZ1"}"#,
            r#"{"event":"mark","streamSid":"MZ1","mark":{}}"#,
            r#"{"event":"dance","streamSid":"MZ1"}"#,
        ] {
            assert!(matches!(p(bad), In::Malformed), "{bad}");
        }
    }
}
