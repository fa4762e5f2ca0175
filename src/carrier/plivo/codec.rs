//! The Plivo audio stream codec: `start`, `media`, `dtmf`, `playedStream`
//! (or the older `played`), `clearedAudio` and a `stop` if one comes in; `playAudio`,
//! `checkpoint` and `clearAudio` out. The core speaks μ-law 8 kHz; when the stream is
//! `audio/x-l16` (little-endian, 8 or 16 kHz) inbound audio is converted to μ-law (16 kHz is
//! halved by averaging sample pairs) and outbound audio back to L16 at the stream's rate
//! (doubled by linear interpolation). Plivo ends a stream by closing the socket, so a close
//! counts as the caller hanging up ([`MediaCodec::stop_on_close`]). A checkpoint whose audio was
//! cleared is never acknowledged; the call's speech queue settles those itself.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::audio::g711::{linear_to_ulaw, ulaw_to_linear};
use crate::carrier::wire::{inbound_media_payload, json_frame, object_field, parse_digit, str_field, unknown_event};
use crate::carrier::{CodecError, MediaCodec, MediaCommand, MediaEvent, StreamStart};

/// Largest text frame (and decoded media payload) accepted.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The stream's audio format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlivoFormat {
    #[default]
    Mulaw,
    /// Little-endian signed 16-bit PCM at this rate (8000 or 16000).
    L16(u32),
}

/// Per-socket Plivo codec. Remembers the `streamId` and format from `start`.
#[derive(Debug, Default, Clone)]
pub struct PlivoCodec {
    stream_id: Option<String>,
    format: PlivoFormat,
    /// An odd byte (half a sample) left over from the last L16 payload.
    carry: Option<u8>,
    /// At 16 kHz, a sample waiting for its pair.
    pending_sample: Option<i16>,
    /// Last outbound sample (interpolation when upsampling).
    last_out: i16,
}

/// `extra_headers`: a JSON object in a string, or `k=v` pairs separated by `;` or `,`.
fn parse_extra_headers(v: Option<&Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(Value::String(s)) = v else {
        return out;
    };
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(s) {
        for (k, v) in map {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            out.insert(k, v);
        }
        return out;
    }
    for part in s.split([';', ',']) {
        if let Some((k, v)) = part.split_once('=') {
            out.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    out
}

impl PlivoCodec {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stream_id(&self) -> Option<&str> {
        self.stream_id.as_deref()
    }

    pub fn format(&self) -> PlivoFormat {
        self.format
    }

    fn decode_start(&mut self, msg: &Value) -> Result<MediaEvent, CodecError> {
        let start = object_field(msg, "start")?;
        let call_id = str_field(start, "callId")?.trim().to_string();
        let stream_id = match start.get("streamId") {
            Some(_) => str_field(start, "streamId")?,
            None => str_field(msg, "streamId")?,
        }
        .trim()
        .to_string();
        if call_id.is_empty() {
            return Err(CodecError::InvalidField("callId"));
        }
        if stream_id.is_empty() {
            return Err(CodecError::InvalidField("streamId"));
        }
        let fmt = start.get("mediaFormat");
        let encoding = fmt
            .and_then(|f| f.get("encoding"))
            .and_then(Value::as_str)
            .unwrap_or("audio/x-mulaw");
        let rate = match fmt.and_then(|f| f.get("sampleRate")) {
            None => 8000,
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
            Some(_) => 0,
        };
        // The encoding may carry `;rate=` in some shapes; the base type decides.
        let base = encoding.split(';').next().unwrap_or("").trim();
        self.format = match (base, rate) {
            ("audio/x-mulaw", 8000) => PlivoFormat::Mulaw,
            ("audio/x-l16", 8000) => PlivoFormat::L16(8000),
            ("audio/x-l16", 16000) => PlivoFormat::L16(16000),
            _ => {
                return Err(CodecError::UnsupportedFormat(format!(
                    "{encoding} {rate} Hz (expected audio/x-mulaw 8000 or audio/x-l16 8000/16000)"
                )));
            }
        };
        self.stream_id = Some(stream_id.clone());
        self.carry = None;
        self.pending_sample = None;
        Ok(MediaEvent::Start(StreamStart {
            call_id,
            stream_id,
            custom_parameters: parse_extra_headers(msg.get("extra_headers")),
        }))
    }

    /// Converts inbound L16 bytes to μ-law 8 kHz, carrying half samples and unpaired samples.
    fn l16_to_ulaw(&mut self, raw: &[u8], rate: u32) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(raw.len() + 1);
        bytes.extend(self.carry.take());
        bytes.extend_from_slice(raw);
        if bytes.len() % 2 == 1 {
            self.carry = bytes.pop();
        }
        let samples = bytes
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]));
        let mut out = Vec::with_capacity(bytes.len() / 2);
        if rate == 16000 {
            for s in samples {
                match self.pending_sample.take() {
                    None => self.pending_sample = Some(s),
                    Some(a) => {
                        let avg = ((i32::from(a) + i32::from(s)) / 2) as i16;
                        out.push(linear_to_ulaw(avg));
                    }
                }
            }
        } else {
            out.extend(samples.map(linear_to_ulaw));
        }
        out
    }

    /// Converts outbound μ-law 8 kHz to L16 at `rate`.
    fn ulaw_to_l16(&mut self, ulaw: &[u8], rate: u32) -> Vec<u8> {
        let per = if rate == 16000 { 4 } else { 2 };
        let mut out = Vec::with_capacity(ulaw.len() * per);
        for &u in ulaw {
            let s = ulaw_to_linear(u);
            if rate == 16000 {
                let mid = ((i32::from(self.last_out) + i32::from(s)) / 2) as i16;
                out.extend_from_slice(&mid.to_le_bytes());
            }
            out.extend_from_slice(&s.to_le_bytes());
            self.last_out = s;
        }
        out
    }

    fn decode_media(&mut self, msg: &Value) -> Result<Option<MediaEvent>, CodecError> {
        let Some(raw) = inbound_media_payload(msg, MAX_FRAME_BYTES)? else {
            return Ok(None);
        };
        let audio = match self.format {
            PlivoFormat::Mulaw => raw,
            PlivoFormat::L16(rate) => self.l16_to_ulaw(&raw, rate),
        };
        if audio.is_empty() {
            return Ok(None);
        }
        Ok(Some(MediaEvent::Audio(Bytes::from(audio))))
    }
}

impl MediaCodec for PlivoCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        let msg = json_frame(frame, MAX_FRAME_BYTES * 2)?;
        match str_field(&msg, "event")? {
            "start" => self.decode_start(&msg).map(Some),
            "media" => self.decode_media(&msg),
            "dtmf" => {
                let dtmf = msg.get("dtmf").ok_or(CodecError::MissingField("dtmf"))?;
                parse_digit(str_field(dtmf, "digit")?).map(|c| Some(MediaEvent::Dtmf(c)))
            }
            "playedStream" | "played" => Ok(Some(MediaEvent::MarkPlayed(
                str_field(&msg, "name")?.to_string(),
            ))),
            "clearedAudio" => Ok(None),
            "stop" => Ok(Some(MediaEvent::Stop)),
            other => Err(unknown_event(other)),
        }
    }

    /// `None` before `start` (there is no `streamId` yet) and for hang-up (a REST call).
    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        let sid = self.stream_id.clone()?;
        let v = match cmd {
            MediaCommand::Audio(audio) => {
                let (content_type, rate, payload) = match self.format {
                    PlivoFormat::Mulaw => ("audio/x-mulaw", 8000, audio.to_vec()),
                    PlivoFormat::L16(rate) => ("audio/x-l16", rate, self.ulaw_to_l16(audio, rate)),
                };
                json!({
                    "event": "playAudio",
                    "media": {
                        "contentType": content_type,
                        "sampleRate": rate,
                        "payload": STANDARD.encode(payload),
                    },
                })
            }
            MediaCommand::Mark(name) => {
                json!({"event": "checkpoint", "streamId": sid, "name": name})
            }
            MediaCommand::Clear => json!({"event": "clearAudio", "streamId": sid}),
            MediaCommand::HangUp | MediaCommand::Transfer { .. } | MediaCommand::SendDtmf { .. } => {
                return None;
            }
        };
        Some(v.to_string())
    }

    fn stop_on_close(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(fmt: &str) -> String {
        format!(
            r#"{{"event":"start","sequenceNumber":1,"start":{{"callId":"c1","streamId":"s1","mediaFormat":{fmt}}},"extra_headers":"a=1;b=2"}}"#
        )
    }

    #[test]
    fn l16_16k_round_trip_and_carry() {
        let mut c = PlivoCodec::new();
        let ev = c
            .decode(&start(r#"{"encoding":"audio/x-l16","sampleRate":16000}"#))
            .expect("start");
        let Some(MediaEvent::Start(s)) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(s.custom_parameters.get("b").map(String::as_str), Some("2"));
        assert_eq!(c.format(), PlivoFormat::L16(16000));
        // 5 bytes: two whole samples (one μ-law byte at 8 kHz) and half a sample carried.
        let frame = |b: &[u8]| {
            format!(
                r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
                STANDARD.encode(b)
            )
        };
        let got = c.decode(&frame(&[0, 0, 0, 0, 0])).expect("media");
        assert_eq!(got, Some(MediaEvent::Audio(Bytes::from(vec![0xFF]))));
        assert_eq!(c.decode(&frame(&[0])).expect("media"), None);
        let out = c
            .encode(&MediaCommand::Audio(Bytes::from(vec![0xFF; 2])))
            .expect("encoded");
        let v: Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["media"]["contentType"], "audio/x-l16");
        assert_eq!(v["media"]["sampleRate"], 16000);
        let payload = STANDARD
            .decode(v["media"]["payload"].as_str().expect("payload"))
            .expect("b64");
        assert_eq!(payload.len(), 8);
    }

    #[test]
    fn events_and_refusals() {
        let mut c = PlivoCodec::new();
        assert_eq!(c.encode(&MediaCommand::Clear), None);
        assert!(
            c.decode(&start(r#"{"encoding":"audio/x-opus","sampleRate":48000}"#))
                .is_err()
        );
        assert!(
            c.decode(&start(r#"{"encoding":"audio/x-mulaw","sampleRate":8000}"#))
                .is_ok()
        );
        assert_eq!(
            c.encode(&MediaCommand::Clear).as_deref(),
            Some(r#"{"event":"clearAudio","streamId":"s1"}"#)
        );
        assert_eq!(
            c.decode(r#"{"event":"played","name":"m"}"#),
            Ok(Some(MediaEvent::MarkPlayed("m".into())))
        );
        assert_eq!(
            c.decode(r#"{"event":"clearedAudio","streamId":"s1"}"#),
            Ok(None)
        );
        assert_eq!(c.decode(r#"{"event":"stop"}"#), Ok(Some(MediaEvent::Stop)));
        assert!(c.decode(r#"{"event":"playedStream"}"#).is_err());
        assert!(
            c.decode(r#"{"event":"media","media":{"payload":7}}"#)
                .is_err()
        );
        assert!(c.stop_on_close());
    }
}
