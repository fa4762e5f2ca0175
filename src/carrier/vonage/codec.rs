//! The Vonage media socket codec. Vonage opens the socket and sends one text message first,
//! `{"event":"websocket:connected","content-type":"audio/l16;rate=16000", …the headers of
//! the NCCO endpoint…}`, then binary messages of 16-bit little-endian linear PCM at 16 kHz
//! (20 ms = 640 bytes); DTMF arrives as `{"event":"websocket:dtmf","digit":"5",…}`.
//!
//! Inbound L16 16 kHz becomes the core's μ-law 8 kHz by averaging sample pairs (as the Plivo
//! codec does for its L16 stream); outbound μ-law 8 kHz becomes binary L16 16 kHz by
//! interpolating a midpoint before each sample. Control goes as text: a clear is
//! `{"action":"clear"}`, a mark is `{"action":"notify","payload":{"mark":NAME}}`, which
//! Vonage answers with `{"event":"websocket:notify","payload":{"mark":NAME}}` once the audio
//! queued before it has played.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::Value;

use crate::audio::g711::{linear_to_ulaw, ulaw_to_linear};
use crate::carrier::codec_util::parse_digit;
use crate::carrier::{
    CodecError, MAX_MEDIA_MESSAGE, MediaCodec, MediaCommand, MediaEvent, MessageKind,
    StreamStart,
};

/// Bytes of one 20 ms binary frame (L16, 16 kHz, mono).
#[cfg(test)]
pub(crate) const L16_FRAME_BYTES: usize = 640;

/// Per-socket Vonage codec, made by the media route for the call it admitted.
#[derive(Debug, Clone)]
pub(crate) struct VonageCodec {
    call_uuid: String,
    connected: bool,
    /// At 16 kHz, a sample waiting for its pair (frames always hold whole pairs; kept anyway).
    pending_in: Option<i16>,
    /// Last outbound sample (the midpoint of the upsampling).
    last_out: i16,
}

impl VonageCodec {
    pub(crate) fn new(call_uuid: &str) -> Self {
        Self {
            call_uuid: call_uuid.to_string(),
            connected: false,
            pending_in: None,
            last_out: 0,
        }
    }

    fn connected(&mut self, msg: &serde_json::Map<String, Value>) -> Result<MediaEvent, CodecError> {
        let content_type = msg
            .get("content-type")
            .and_then(Value::as_str)
            .ok_or(CodecError::MissingField("content-type"))?;
        if !content_type.replace(' ', "").eq_ignore_ascii_case(super::CONTENT_TYPE) {
            return Err(CodecError::UnsupportedFormat(format!(
                "{content_type} (expected {})",
                super::CONTENT_TYPE
            )));
        }
        self.connected = true;
        let custom_parameters: BTreeMap<String, String> = msg
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "event" | "content-type"))
            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
            .collect();
        Ok(MediaEvent::Start(StreamStart {
            call_id: self.call_uuid.clone(),
            stream_id: self.call_uuid.clone(),
            custom_parameters,
        }))
    }
}

/// The text of a JSON string field of `v`.
fn text_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a str, CodecError> {
    v.get(name)
        .and_then(Value::as_str)
        .ok_or(CodecError::MissingField(name))
}

impl MediaCodec for VonageCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        if frame.len() > MAX_MEDIA_MESSAGE {
            return Err(CodecError::TooLarge(frame.len()));
        }
        let v: Value = serde_json::from_str(frame).map_err(|e| CodecError::BadJson(e.to_string()))?;
        let Some(msg) = v.as_object() else {
            return Err(CodecError::BadJson("not an object".into()));
        };
        match text_field(&v, "event")? {
            "websocket:connected" => self.connected(msg).map(Some),
            "websocket:dtmf" => {
                // The digit at the top level, or inside a `dtmf` object.
                let digit = text_field(&v, "digit")
                    .or_else(|_| v.get("dtmf").map_or(Err(CodecError::MissingField("digit")), |d| text_field(d, "digit")))?;
                parse_digit(digit).map(|c| Some(MediaEvent::Dtmf(c)))
            }
            "websocket:notify" => {
                let payload = v.get("payload").ok_or(CodecError::MissingField("payload"))?;
                Ok(Some(MediaEvent::MarkPlayed(text_field(payload, "mark")?.to_string())))
            }
            // The answer to our clear, and Vonage's own notices.
            "websocket:cleared" | "websocket:error" | "websocket:media:update" => Ok(None),
            other => Err(CodecError::UnknownEvent(other.chars().take(64).collect())),
        }
    }

    fn decode_binary(&mut self, frame: &[u8]) -> Result<Option<MediaEvent>, CodecError> {
        if frame.len() > MAX_MEDIA_MESSAGE {
            return Err(CodecError::TooLarge(frame.len()));
        }
        if !self.connected {
            return Err(CodecError::InvalidField("audio before websocket:connected"));
        }
        if !frame.len().is_multiple_of(2) {
            return Err(CodecError::InvalidField("L16 audio of an odd number of bytes"));
        }
        let mut ulaw = Vec::with_capacity(frame.len() / 4 + 1);
        for pair in frame.chunks_exact(2) {
            let s = i16::from_le_bytes([pair[0], pair[1]]);
            match self.pending_in.take() {
                None => self.pending_in = Some(s),
                Some(a) => ulaw.push(linear_to_ulaw(((i32::from(a) + i32::from(s)) / 2) as i16)),
            }
        }
        Ok(Some(MediaEvent::Audio(Bytes::from(ulaw))))
    }

    fn encodes(&self) -> MessageKind {
        MessageKind::Binary
    }

    /// Vonage ends the stream by closing the socket.
    fn stop_on_close(&self) -> bool {
        true
    }

    fn encodes_command(&self, cmd: &MediaCommand) -> MessageKind {
        match cmd {
            MediaCommand::Audio(_) => MessageKind::Binary,
            _ => MessageKind::Text,
        }
    }

    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        match cmd {
            MediaCommand::Mark(name) => Some(
                serde_json::json!({"action": "notify", "payload": {"mark": name}}).to_string(),
            ),
            MediaCommand::Clear => Some(r#"{"action":"clear"}"#.to_string()),
            _ => None,
        }
    }

    fn encode_into(&mut self, cmd: &MediaCommand, out: &mut Vec<u8>) -> bool {
        out.clear();
        match cmd {
            MediaCommand::Audio(ulaw) => {
                out.reserve(ulaw.len() * 4);
                for &u in ulaw.iter() {
                    let s = ulaw_to_linear(u);
                    let mid = ((i32::from(self.last_out) + i32::from(s)) / 2) as i16;
                    out.extend_from_slice(&mid.to_le_bytes());
                    out.extend_from_slice(&s.to_le_bytes());
                    self.last_out = s;
                }
                true
            }
            MediaCommand::Mark(_) | MediaCommand::Clear => match self.encode(cmd) {
                Some(text) => {
                    out.extend_from_slice(text.as_bytes());
                    true
                }
                None => false,
            },
            // Hang-ups, transfers and DTMF go through Vonage's REST API.
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONNECTED: &str = r#"{"event":"websocket:connected","content-type":"audio/l16;rate=16000","call_uuid":"u1"}"#;

    fn connected() -> VonageCodec {
        let mut c = VonageCodec::new("u1");
        let start = c.decode(CONNECTED).unwrap();
        let Some(MediaEvent::Start(s)) = start else {
            panic!("{start:?}")
        };
        assert_eq!(s.call_id, "u1");
        assert_eq!(s.custom_parameters.get("call_uuid").map(String::as_str), Some("u1"));
        c
    }

    #[test]
    fn l16_16k_round_trips_through_ulaw_8k() {
        let mut c = connected();
        // One 20 ms frame of a 500 Hz tone at 16 kHz.
        let samples: Vec<i16> = (0..320)
            .map(|i| (8000.0 * (i as f64 * 500.0 * std::f64::consts::TAU / 16000.0).sin()) as i16)
            .collect();
        let frame: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        assert_eq!(frame.len(), L16_FRAME_BYTES);
        let Ok(Some(MediaEvent::Audio(ulaw))) = c.decode_binary(&frame) else {
            panic!("audio")
        };
        assert_eq!(ulaw.len(), crate::carrier::FRAME_BYTES);
        let mut out = Vec::new();
        assert_eq!(c.encodes_command(&MediaCommand::Audio(ulaw.clone())), MessageKind::Binary);
        assert!(c.encode_into(&MediaCommand::Audio(ulaw), &mut out));
        assert_eq!(out.len(), L16_FRAME_BYTES);
        // Back at 16 kHz the tone is close to what went in (μ-law and the pair average).
        let back: Vec<i16> = out.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        let err: f64 = samples[8..]
            .iter()
            .zip(&back[8..])
            .map(|(a, b)| f64::from(*a - *b).abs())
            .sum::<f64>()
            / (samples.len() - 8) as f64;
        assert!(err < 600.0, "mean error {err}");
    }

    #[test]
    fn control_is_text_and_events_decode() {
        let mut c = connected();
        let mark = MediaCommand::Mark("m1".into());
        assert_eq!(c.encodes_command(&mark), MessageKind::Text);
        let mut out = Vec::new();
        assert!(c.encode_into(&mark, &mut out));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"action":"notify","payload":{"mark":"m1"}}));
        assert!(c.encode_into(&MediaCommand::Clear, &mut out));
        assert_eq!(out, br#"{"action":"clear"}"#);
        assert_eq!(
            c.decode(r#"{"event":"websocket:notify","payload":{"mark":"m1"}}"#),
            Ok(Some(MediaEvent::MarkPlayed("m1".into())))
        );
        assert_eq!(
            c.decode(r#"{"event":"websocket:dtmf","digit":"7","duration":250}"#),
            Ok(Some(MediaEvent::Dtmf('7')))
        );
        assert_eq!(c.decode(r#"{"event":"websocket:cleared"}"#), Ok(None));
    }

    #[test]
    fn bad_messages_are_refused_with_why() {
        let mut c = VonageCodec::new("u1");
        assert!(matches!(c.decode_binary(&[0; 640]), Err(CodecError::InvalidField(_))));
        assert!(matches!(
            c.decode(r#"{"event":"websocket:connected","content-type":"audio/l16;rate=8000"}"#),
            Err(CodecError::UnsupportedFormat(_))
        ));
        let mut c = connected();
        assert!(matches!(c.decode_binary(&[0; 3]), Err(CodecError::InvalidField(_))));
        assert!(matches!(c.decode("nope"), Err(CodecError::BadJson(_))));
        assert!(matches!(c.decode(r#"{"event":"x"}"#), Err(CodecError::UnknownEvent(_))));
        assert!(matches!(
            c.decode(r#"{"event":"websocket:dtmf","digit":"x"}"#),
            Err(CodecError::InvalidField(_))
        ));
    }
}
