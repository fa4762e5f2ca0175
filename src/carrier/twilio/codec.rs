//! The Twilio Media Streams codec: turns Twilio's JSON text frames (`connected`, `start`,
//! `media`, `dtmf`, `mark`, `stop`) into [`MediaEvent`]s and [`MediaCommand`]s into `media` /
//! `mark` / `clear` frames stamped with the stream's `streamSid`. The 50-a-second frames go
//! without allocating: inbound `media` through [`fast_inbound_media`] into a [`FramePool`],
//! outbound frames written into the caller's buffer ([`MediaCodec::encode_into`]).

use bytes::Bytes;
use serde_json::Value;

use crate::carrier::codec_util::{
    FramePool, encode_via_buffer, fast_inbound_media, inbound_media_payload, json_frame, object_field, parse_digit,
    push_base64, push_json_str, str_field, unknown_event,
};
use crate::carrier::{CodecError, MAX_MEDIA_MESSAGE, MediaCodec, MediaCommand, MediaEvent, StreamStart};


/// Per-socket Twilio codec. Remembers the `streamSid` from `start` for outgoing frames.
#[derive(Debug, Default, Clone)]
pub struct TwilioCodec {
    stream_sid: Option<String>,
    /// Where inbound audio is decoded to.
    pool: FramePool,
}

impl TwilioCodec {
    pub fn new() -> Self {
        Self::default()
    }

    /// The `streamSid` learned from `start`, if any.
    pub fn stream_sid(&self) -> Option<&str> {
        self.stream_sid.as_deref()
    }

    fn decode_start(&mut self, msg: &Value) -> Result<MediaEvent, CodecError> {
        let start = object_field(msg, "start")?;
        let call_id = str_field(start, "callSid")?.to_string();
        let stream_id = match start.get("streamSid") {
            Some(_) => str_field(start, "streamSid")?,
            None => str_field(msg, "streamSid")?,
        }
        .to_string();
        if call_id.is_empty() {
            return Err(CodecError::InvalidField("callSid"));
        }
        if stream_id.is_empty() {
            return Err(CodecError::InvalidField("streamSid"));
        }
        if let Some(fmt) = start.get("mediaFormat") {
            let encoding = fmt.get("encoding").and_then(Value::as_str).unwrap_or("");
            let rate = fmt.get("sampleRate").and_then(Value::as_u64).unwrap_or(0);
            let channels = fmt.get("channels").and_then(Value::as_u64).unwrap_or(1);
            if encoding != "audio/x-mulaw" || rate != 8000 || channels != 1 {
                return Err(CodecError::UnsupportedFormat(format!(
                    "{encoding} {rate} Hz x{channels} (expected audio/x-mulaw 8000 Hz mono)"
                )));
            }
        }
        let mut custom_parameters = std::collections::BTreeMap::new();
        match start.get("customParameters") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (k, v) in map {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    custom_parameters.insert(k.clone(), v);
                }
            }
            Some(_) => return Err(CodecError::InvalidField("customParameters")),
        }
        self.stream_sid = Some(stream_id.clone());
        Ok(MediaEvent::Start(StreamStart {
            call_id,
            stream_id,
            custom_parameters,
        }))
    }

    fn sid_for_encode(&self) -> Option<&str> {
        self.stream_sid.as_deref()
    }
}

fn decode_media(msg: &Value) -> Result<Option<MediaEvent>, CodecError> {
    Ok(inbound_media_payload(msg, MAX_MEDIA_MESSAGE)?.map(|audio| MediaEvent::Audio(Bytes::from(audio))))
}

fn decode_dtmf(msg: &Value) -> Result<MediaEvent, CodecError> {
    let dtmf = msg.get("dtmf").ok_or(CodecError::MissingField("dtmf"))?;
    parse_digit(str_field(dtmf, "digit")?).map(MediaEvent::Dtmf)
}

impl MediaCodec for TwilioCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        if let Some(audio) = fast_inbound_media(frame, MAX_MEDIA_MESSAGE, &mut self.pool) {
            return Ok(Some(MediaEvent::Audio(audio)));
        }
        let msg = json_frame(frame, MAX_MEDIA_MESSAGE * 2)?;
        let event = str_field(&msg, "event")?;
        match event {
            "connected" => Ok(None),
            "start" => self.decode_start(&msg).map(Some),
            "media" => decode_media(&msg),
            "dtmf" => decode_dtmf(&msg).map(Some),
            "mark" => {
                let mark = msg.get("mark").ok_or(CodecError::MissingField("mark"))?;
                Ok(Some(MediaEvent::MarkPlayed(
                    str_field(mark, "name")?.to_string(),
                )))
            }
            "stop" => Ok(Some(MediaEvent::Stop)),
            other => Err(unknown_event(other)),
        }
    }

    /// Encodes a command. Returns `None` for any command before `start` was decoded (there is no `streamSid` to address yet).
    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        encode_via_buffer(self, cmd)
    }

    fn encode_into(&mut self, cmd: &MediaCommand, out: &mut Vec<u8>) -> bool {
        let Some(sid) = self.sid_for_encode() else {
            return false;
        };
        out.clear();
        // The same bytes `serde_json::json!` gave (keys in sorted order).
        match cmd {
            MediaCommand::Audio(audio) => {
                out.extend_from_slice(br#"{"event":"media","media":{"payload":""#);
                push_base64(out, audio);
                out.extend_from_slice(br#""},"streamSid":"#);
            }
            MediaCommand::Mark(name) => {
                out.extend_from_slice(br#"{"event":"mark","mark":{"name":"#);
                push_json_str(out, name);
                out.extend_from_slice(br#"},"streamSid":"#);
            }
            MediaCommand::Clear => out.extend_from_slice(br#"{"event":"clear","streamSid":"#),
        }
        push_json_str(out, sid);
        out.push(b'}');
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    fn start_frame(fmt: &str) -> String {
        format!(
            r#"{{"event":"start","sequenceNumber":"1","start":{{"accountSid":"AC1","streamSid":"MZ1","callSid":"CA1","tracks":["inbound"],"mediaFormat":{fmt},"customParameters":{{"t":"x"}}}},"streamSid":"MZ1"}}"#
        )
    }

    #[test]
    fn start_then_encode() {
        let mut c = TwilioCodec::new();
        assert_eq!(c.encode(&MediaCommand::Clear), None);
        let ev = c
            .decode(&start_frame(
                r#"{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}"#,
            ))
            .expect("start decodes");
        let Some(MediaEvent::Start(s)) = ev else {
            panic!("expected start, got {ev:?}");
        };
        assert_eq!((s.call_id.as_str(), s.stream_id.as_str()), ("CA1", "MZ1"));
        assert_eq!(s.custom_parameters.get("t").map(String::as_str), Some("x"));
        assert_eq!(
            c.encode(&MediaCommand::Clear).as_deref(),
            Some(r#"{"event":"clear","streamSid":"MZ1"}"#)
        );
    }

    #[test]
    fn rejects_bad_input() {
        let mut c = TwilioCodec::new();
        assert!(matches!(
            c.decode(&start_frame(
                r#"{"encoding":"audio/x-l16","sampleRate":16000,"channels":1}"#
            )),
            Err(CodecError::UnsupportedFormat(_))
        ));
        assert!(matches!(c.decode("{"), Err(CodecError::BadJson(_))));
        assert!(matches!(c.decode("[1]"), Err(CodecError::BadJson(_))));
        assert_eq!(c.decode("{}"), Err(CodecError::MissingField("event")));
        assert_eq!(
            c.decode(r#"{"event":5}"#),
            Err(CodecError::InvalidField("event"))
        );
        assert_eq!(
            c.decode(r#"{"event":"bogus"}"#),
            Err(CodecError::UnknownEvent("bogus".into()))
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":"inbound","payload":"@@@"}}"#),
            Err(CodecError::BadBase64)
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":"outbound","payload":"/w=="}}"#),
            Ok(None)
        );
        let big = format!(
            r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
            "A".repeat(100_000)
        );
        assert!(matches!(c.decode(&big), Err(CodecError::TooLarge(_))));
        assert_eq!(
            c.decode(r#"{"event":"dtmf","dtmf":{"digit":"12"}}"#),
            Err(CodecError::InvalidField("digit"))
        );
        assert_eq!(
            c.decode(r##"{"event":"dtmf","dtmf":{"digit":"#"}}"##),
            Ok(Some(MediaEvent::Dtmf('#')))
        );
        assert_eq!(
            c.decode(r#"{"event":"mark","mark":{}}"#),
            Err(CodecError::MissingField("name"))
        );
    }

    /// The allocation-free paths give exactly what the general ones give.
    #[test]
    fn fast_paths_match_the_general_ones() {
        let mut c = TwilioCodec::new();
        c.decode(&start_frame(
            r#"{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}"#,
        ))
        .expect("start decodes");
        let audio: Vec<u8> = (0..160u32).map(|i| (i * 7 % 256) as u8).collect();
        let b64 = STANDARD.encode(&audio);
        // Fast path: plain frames, both track spellings and none.
        for track in [r#""track":"inbound","#, r#""track":"inbound_track","#, ""] {
            let frame = format!(
                r#"{{"event":"media","sequenceNumber":"2","media":{{{track}"chunk":"1","timestamp":"20","payload":"{b64}"}},"streamSid":"MZ1"}}"#
            );
            assert_eq!(
                c.decode(&frame),
                Ok(Some(MediaEvent::Audio(Bytes::from(audio.clone()))))
            );
        }
        // Frames the fast path leaves to the general one decode as before: an escaped
        // payload, an outbound track, an array.
        let escaped = format!(
            r#"{{"event":"media","media":{{"payload":"{}\/w=="}}}}"#,
            &b64[..b64.len() - 4]
        );
        // 160 bytes end in a one-byte quantum (`xx==`).
        let mut want = audio[..audio.len() - 1].to_vec();
        want.extend_from_slice(&STANDARD.decode("/w==").expect("b64"));
        assert_eq!(
            c.decode(&escaped),
            Ok(Some(MediaEvent::Audio(Bytes::from(want))))
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":"outbound","payload":"/w=="}}"#),
            Ok(None)
        );
        assert!(matches!(
            c.decode(r#"["media",{"payload":"/w=="}]"#),
            Err(CodecError::BadJson(_))
        ));
        // Outgoing frames: byte for byte what `json!` built.
        let cases = [
            (
                MediaCommand::Audio(Bytes::from(audio.clone())),
                json!({"event": "media", "streamSid": "MZ1", "media": {"payload": b64}}),
            ),
            (
                MediaCommand::Mark("u1.\"2\"".into()),
                json!({"event": "mark", "streamSid": "MZ1", "mark": {"name": "u1.\"2\""}}),
            ),
            (
                MediaCommand::Clear,
                json!({"event": "clear", "streamSid": "MZ1"}),
            ),
        ];
        let mut out = Vec::new();
        for (cmd, want) in cases {
            assert!(c.encode_into(&cmd, &mut out));
            assert_eq!(String::from_utf8(out.clone()).expect("utf8"), want.to_string());
        }
    }
}
