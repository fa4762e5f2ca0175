//! The Telnyx media streaming codec: `connected`, `start`, `media`, `dtmf`,
//! `mark`, `stop` and `error` frames in; `media`, `mark` and `clear` out (RTP mode, PCMU 8 kHz,
//! no `stream_id` needed on outgoing frames). Telnyx does not guarantee frame order, so inbound
//! audio goes through a small jitter buffer keyed on `media.chunk`: a frame that arrives early is
//! held until the gap before it fills (and released together with it), or released anyway once
//! [`MAX_HELD`] frames are waiting; frames older than what was already delivered are dropped,
//! unless the counter jumped back by more than [`RESYNC_BACK`] frames: that is a restarted
//! counter (a new stream on the same socket, a carrier-side reset), not a late frame, and the
//! buffer follows it instead of dropping everything after it.
//!
//! The 50-a-second frames go without allocating, as Twilio's do: an ordinary inbound `media`
//! frame is read borrowed ([`probe_inbound_media`]) and decoded (and, for PCMA, converted in
//! place) into a [`FramePool`]; outgoing frames are written into the caller's buffer
//! ([`MediaCodec::encode_into`], byte for byte what `serde_json::json!` built).

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::audio::g711::{alaw_to_linear, linear_to_ulaw};
use crate::carrier::codec_util::{
    FramePool, counter_value, encode_via_buffer, inbound_media_payload, json_frame, object_field,
    parse_digit, probe_inbound_media, push_base64, push_json_str, str_field, unknown_event,
};
use crate::carrier::{CodecError, MAX_MEDIA_MESSAGE, MediaCodec, MediaCommand, MediaEvent, StreamStart};

/// Early frames held back waiting for a missing one before giving up on it.
pub const MAX_HELD: usize = 3;
/// A `chunk` this far (1 s of frames) behind the expected one means the counter restarted.
pub(crate) const RESYNC_BACK: u64 = 50;

/// The audio encoding of the caller track Telnyx streams to us (from the `start` frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum CallerEncoding {
    #[default]
    Pcmu,
    Pcma,
}

/// Per-socket Telnyx codec.
#[derive(Debug, Default, Clone)]
pub struct TelnyxCodec {
    stream_id: Option<String>,
    caller_encoding: CallerEncoding,
    /// Next `chunk` expected; `None` before the first media frame.
    next_chunk: Option<u64>,
    held: BTreeMap<u64, Bytes>,
    /// Media frames that arrived out of order (held or dropped as late).
    pub reordered: u64,
    /// Where inbound audio is decoded to.
    pool: FramePool,
}

/// The largest `chunk` counter ordered by the jitter buffer (at 50 frames a second a real
/// stream never gets near it); a larger one is delivered unordered, so the buffer's counter
/// arithmetic cannot overflow on a hostile value.
pub(crate) const MAX_CHUNK: u64 = u64::MAX / 2;

/// Rewrites A-law bytes as μ-law in place (the core speaks μ-law).
fn alaw_to_ulaw_in_place(audio: &mut [u8]) {
    for b in audio {
        *b = linear_to_ulaw(alaw_to_linear(*b));
    }
}

impl TelnyxCodec {
    pub fn new() -> Self {
        Self::default()
    }

    /// The `stream_id` learned from `start`, if any.
    pub fn stream_id(&self) -> Option<&str> {
        self.stream_id.as_deref()
    }

    fn decode_start(&mut self, msg: &Value) -> Result<MediaEvent, CodecError> {
        let start = object_field(msg, "start")?;
        let call_id = str_field(start, "call_control_id")?.trim().to_string();
        if call_id.is_empty() {
            return Err(CodecError::InvalidField("call_control_id"));
        }
        let stream_id = match msg.get("stream_id") {
            Some(_) => str_field(msg, "stream_id")?.to_string(),
            None => String::new(),
        };
        if let Some(fmt) = start.get("media_format") {
            let encoding = fmt
                .get("encoding")
                .and_then(Value::as_str)
                .unwrap_or("PCMU");
            let rate = fmt
                .get("sample_rate")
                .and_then(Value::as_u64)
                .unwrap_or(8000);
            let channels = fmt.get("channels").and_then(Value::as_u64).unwrap_or(1);
            self.caller_encoding = match (encoding.to_ascii_uppercase().as_str(), rate, channels) {
                ("PCMU", 8000, 1) => CallerEncoding::Pcmu,
                ("PCMA", 8000, 1) => CallerEncoding::Pcma,
                _ => {
                    return Err(CodecError::UnsupportedFormat(format!(
                        "{encoding} {rate} Hz x{channels} (expected PCMU or PCMA 8000 Hz mono)"
                    )));
                }
            };
        }
        let mut custom_parameters = BTreeMap::new();
        match start.get("custom_parameters") {
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
            // Telnyx documents an object; a list of {name, value} is what we send.
            Some(Value::Array(items)) => {
                for it in items {
                    if let (Some(k), Some(v)) = (
                        it.get("name").and_then(Value::as_str),
                        it.get("value").and_then(Value::as_str),
                    ) {
                        custom_parameters.insert(k.to_string(), v.to_string());
                    }
                }
            }
            Some(_) => return Err(CodecError::InvalidField("custom_parameters")),
        }
        self.stream_id = Some(stream_id.clone());
        self.next_chunk = None;
        self.held.clear();
        Ok(MediaEvent::Start(StreamStart {
            call_id,
            stream_id,
            custom_parameters,
        }))
    }

    fn decode_media(&mut self, msg: &Value) -> Result<Option<MediaEvent>, CodecError> {
        let Some(mut raw) = inbound_media_payload(msg, MAX_MEDIA_MESSAGE)? else {
            return Ok(None);
        };
        if self.caller_encoding == CallerEncoding::Pcma {
            alaw_to_ulaw_in_place(&mut raw);
        }
        let chunk = counter_value(msg["media"].get("chunk"));
        Ok(self.deliver(chunk, Bytes::from(raw)))
    }

    /// Any frame, through a JSON tree: every event, and the `media` frames the fast path
    /// leaves (with their precise errors).
    fn decode_general(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        let msg = json_frame(frame, MAX_MEDIA_MESSAGE * 2)?;
        match str_field(&msg, "event")? {
            "connected" => Ok(None),
            "start" => self.decode_start(&msg).map(Some),
            "media" => self.decode_media(&msg),
            "dtmf" => {
                let dtmf = msg.get("dtmf").ok_or(CodecError::MissingField("dtmf"))?;
                parse_digit(str_field(dtmf, "digit")?).map(|c| Some(MediaEvent::Dtmf(c)))
            }
            "mark" => {
                let mark = msg.get("mark").ok_or(CodecError::MissingField("mark"))?;
                Ok(Some(MediaEvent::MarkPlayed(
                    str_field(mark, "name")?.to_string(),
                )))
            }
            "stop" => Ok(Some(MediaEvent::Stop)),
            "error" => {
                let p = msg.get("payload");
                let code = p
                    .and_then(|p| p.get("code"))
                    .map(|c| c.to_string())
                    .unwrap_or_default();
                let title = p
                    .and_then(|p| p.get("title"))
                    .and_then(|t| t.as_str())
                    .unwrap_or("");
                tracing::warn!(%code, title, "telnyx reported a media stream error");
                Ok(None)
            }
            other => Err(unknown_event(other)),
        }
    }

    /// An ordinary inbound `media` frame, read borrowed and decoded into the pool; `None` when
    /// the general path must decode it.
    fn decode_media_fast(&mut self, frame: &str) -> Option<Option<MediaEvent>> {
        let media = probe_inbound_media(frame, MAX_MEDIA_MESSAGE)?;
        let pcma = self.caller_encoding == CallerEncoding::Pcma;
        let audio = self.pool.decode_base64_with(media.payload, |audio| {
            if pcma {
                alaw_to_ulaw_in_place(audio);
            }
            audio.len()
        })?;
        Some(self.deliver(media.chunk, audio))
    }

    /// Delivers a frame's audio through the jitter buffer; a frame without a usable `chunk`
    /// (none, not a counter, or over [`MAX_CHUNK`]) goes as it comes.
    fn deliver(&mut self, chunk: Option<u64>, audio: Bytes) -> Option<MediaEvent> {
        match chunk.filter(|c| *c <= MAX_CHUNK) {
            Some(chunk) => self.reorder(chunk, audio).map(MediaEvent::Audio),
            None => Some(MediaEvent::Audio(audio)),
        }
    }

    /// Feeds one frame to the jitter buffer; returns the audio that is now in order.
    fn reorder(&mut self, chunk: u64, audio: Bytes) -> Option<Bytes> {
        let next = *self.next_chunk.get_or_insert(chunk);
        if chunk + RESYNC_BACK < next {
            // The counter restarted: deliver what was held, then follow the new numbering.
            let mut out = BytesMut::new();
            for (_, a) in std::mem::take(&mut self.held) {
                out.extend_from_slice(&a);
            }
            out.extend_from_slice(&audio);
            self.next_chunk = Some(chunk + 1);
            return Some(out.freeze());
        }
        if chunk < next {
            // Late (its slot was given up on) or a duplicate.
            self.reordered += 1;
            return None;
        }
        if chunk == next && self.held.is_empty() {
            self.next_chunk = Some(chunk + 1);
            return Some(audio);
        }
        if chunk != next {
            self.reordered += 1;
        }
        self.held.insert(chunk, audio);
        let first = *self.held.keys().next()?;
        if first != next && self.held.len() <= MAX_HELD {
            return None;
        }
        // Release the contiguous run starting at the first held frame.
        let mut out = BytesMut::new();
        let mut expect = first;
        while let Some(a) = self.held.remove(&expect) {
            out.extend_from_slice(&a);
            expect += 1;
        }
        self.next_chunk = Some(expect);
        Some(out.freeze())
    }
}

impl MediaCodec for TelnyxCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        match self.decode_media_fast(frame) {
            Some(event) => Ok(event),
            None => self.decode_general(frame),
        }
    }


    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        encode_via_buffer(self, cmd)
    }

    fn encode_into(&mut self, cmd: &MediaCommand, out: &mut Vec<u8>) -> bool {
        out.clear();
        // The same bytes `serde_json::json!` gave (keys in sorted order); no `stream_id`.
        match cmd {
            MediaCommand::Audio(audio) => {
                out.extend_from_slice(br#"{"event":"media","media":{"payload":""#);
                push_base64(out, audio);
                out.extend_from_slice(br#""}}"#);
            }
            MediaCommand::Mark(name) => {
                out.extend_from_slice(br#"{"event":"mark","mark":{"name":"#);
                push_json_str(out, name);
                out.extend_from_slice(b"}}");
            }
            MediaCommand::Clear => out.extend_from_slice(br#"{"event":"clear"}"#),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    fn media(chunk: u64, byte: u8) -> String {
        format!(
            r#"{{"event":"media","sequence_number":"{}","media":{{"track":"inbound","chunk":"{chunk}","timestamp":"0","payload":"{}"}},"stream_id":"s"}}"#,
            chunk + 1,
            STANDARD.encode([byte; 4])
        )
    }

    fn audio(ev: Result<Option<MediaEvent>, CodecError>) -> Option<Vec<u8>> {
        match ev {
            Ok(Some(MediaEvent::Audio(b))) => Some(b.to_vec()),
            _ => None,
        }
    }

    /// Found by the parser property tests: a `chunk` near `u64::MAX` overflowed the jitter
    /// buffer's arithmetic (a panic in debug builds). Such counters are delivered unordered.
    #[test]
    fn huge_chunk_counters_do_not_overflow() {
        let mut c = TelnyxCodec::new();
        let frame = |chunk: &str| {
            format!(
                r#"{{"event":"media","media":{{"track":"inbound","chunk":"{chunk}","payload":"{}"}}}}"#,
                STANDARD.encode([7u8; 4])
            )
        };
        for chunk in [u64::MAX, u64::MAX - 1, MAX_CHUNK + 1, u64::MAX] {
            assert_eq!(audio(c.decode(&frame(&chunk.to_string()))), Some(vec![7; 4]));
        }
        assert_eq!(audio(c.decode(&frame(&MAX_CHUNK.to_string()))), Some(vec![7; 4]));
    }

    #[test]
    fn reorders_swapped_frames_and_drops_late_ones() {
        let mut c = TelnyxCodec::new();
        assert_eq!(audio(c.decode(&media(1, 1))), Some(vec![1; 4]));
        assert_eq!(audio(c.decode(&media(3, 3))), None);
        let mut both = vec![2; 4];
        both.extend([3; 4]);
        assert_eq!(audio(c.decode(&media(2, 2))), Some(both));
        assert_eq!(audio(c.decode(&media(2, 2))), None, "duplicate dropped");
        // A frame that never comes: released after MAX_HELD later ones.
        for n in 5..5 + MAX_HELD as u64 {
            assert_eq!(audio(c.decode(&media(n, n as u8))), None);
        }
        assert_eq!(
            audio(c.decode(&media(5 + MAX_HELD as u64, 9))).map(|a| a.len()),
            Some(4 * (MAX_HELD + 1))
        );
        assert_eq!(audio(c.decode(&media(4, 4))), None, "too late");
        assert!(c.reordered >= 3);
    }

    #[test]
    fn a_restarted_counter_is_followed_not_dropped() {
        let mut c = TelnyxCodec::new();
        for n in 1000..1100 {
            assert_eq!(audio(c.decode(&media(n, 1))), Some(vec![1; 4]));
        }
        // The counter starts again at 1: every frame after it still reaches the call.
        for n in 1..100 {
            assert_eq!(audio(c.decode(&media(n, 2))), Some(vec![2; 4]), "chunk {n}");
        }
        // A frame a little late is still a late frame, not a restart.
        assert_eq!(audio(c.decode(&media(90, 3))), None);
    }

    #[test]
    fn encodes_without_stream_id() {
        let mut c = TelnyxCodec::new();
        assert_eq!(
            c.encode(&MediaCommand::Clear).as_deref(),
            Some(r#"{"event":"clear"}"#)
        );
        assert_eq!(
            c.encode(&MediaCommand::Mark("m1".into())).as_deref(),
            Some(r#"{"event":"mark","mark":{"name":"m1"}}"#)
        );
        assert!(
            c.decode(r#"{"event":"error","payload":{"code":100003}}"#)
                .is_ok()
        );
        assert!(
            c.decode(r#"{"event":"dtmf","dtmf":{"digit":"55"}}"#)
                .is_err()
        );
        assert!(c
            .decode(r#"{"event":"start","start":{"call_control_id":"v3:x","media_format":{"encoding":"L16","sample_rate":16000}}}"#)
            .is_err());
    }
}

/// The allocation-free paths against the general ones (and the `json!` encoder they replaced).
#[cfg(test)]
mod fast_path_tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    /// The encoder before the hand-written one.
    fn json_encode(cmd: &MediaCommand) -> Option<String> {
        let v = match cmd {
            MediaCommand::Audio(audio) => json!({
                "event": "media",
                "media": {"payload": STANDARD.encode(audio)},
            }),
            MediaCommand::Mark(name) => json!({"event": "mark", "mark": {"name": name}}),
            MediaCommand::Clear => json!({"event": "clear"}),
        };
        Some(v.to_string())
    }

    #[test]
    fn outgoing_frames_are_byte_identical_to_the_json_encoder() {
        let mut c = TelnyxCodec::new();
        let mut out = Vec::new();
        let cmds = [
            MediaCommand::Audio(Bytes::new()),
            MediaCommand::Audio(Bytes::from_static(&[0x7F])),
            MediaCommand::Audio(Bytes::from_static(&[1, 2])),
            MediaCommand::Audio(Bytes::from((0..160u32).map(|i| (i * 7) as u8).collect::<Vec<_>>())),
            MediaCommand::Audio(Bytes::from(vec![0xFF; 3200])),
            MediaCommand::Mark("reply-1".into()),
            MediaCommand::Mark("q\"u\\o/te\n\u{1}é😀".into()),
            MediaCommand::Mark(String::new()),
            MediaCommand::Clear,
        ];
        for cmd in &cmds {
            let want = json_encode(cmd);
            assert_eq!(c.encode(cmd), want, "{cmd:?}");
            assert_eq!(c.encode_into(cmd, &mut out), want.is_some());
            if let Some(want) = want {
                assert_eq!(std::str::from_utf8(&out), Ok(want.as_str()));
            }
        }
    }

    fn start(encoding: &str) -> String {
        format!(
            r#"{{"event":"start","sequence_number":"1","stream_id":"s1","start":{{"call_control_id":"v3:c","media_format":{{"encoding":"{encoding}","sample_rate":8000,"channels":1}}}}}}"#
        )
    }

    /// Frames in the order a test feeds them: ordinary ones (the fast path), and ones the fast
    /// path leaves to the general one.
    fn frames() -> Vec<String> {
        let b64 = |n: u8| STANDARD.encode([n, n.wrapping_mul(3), 0x80, 0x7F, n ^ 0x55]);
        let media = |chunk: &str, payload: &str| {
            format!(
                r#"{{"event":"media","sequence_number":"9","media":{{"track":"inbound",{chunk}"timestamp":"5","payload":"{payload}"}},"stream_id":"s1"}}"#
            )
        };
        let mut v = vec![
            media(r#""chunk":"1","#, &b64(1)),
            media(r#""chunk":"3","#, &b64(3)),
            media(r#""chunk":2,"#, &b64(2)),
            media(r#""chunk":" 4 ","#, &b64(4)),
            media(r#""chunk":"4","#, &b64(4)),
            media("", &b64(9)),
            media(r#""chunk":null,"#, &b64(10)),
            media(r#""chunk":-5,"#, &b64(11)),
            media(r#""chunk":5.5,"#, &b64(12)),
            media(r#""chunk":"x","#, &b64(13)),
            media(r#""chunk":true,"#, &b64(14)),
            media(r#""chunk":{},"#, &b64(15)),
            media(r#""chunk":"\u0035","#, &b64(5)),
            media(r#""chunk":"6","#, &format!("{}\\/w==", &b64(6)[..4])),
            media(r#""chunk":"7","#, "@@@@"),
            media(r#""chunk":"7","#, ""),
            media(r#""chunk":"18446744073709551615","#, &b64(16)),
            media(r#""chunk":"7","chunk":"8","#, &b64(7)),
        ];
        v.push(r#"{"event":"media","media":{"track":"outbound","chunk":"7","payload":"/w=="}}"#.into());
        v.push(r#"{"event":"media","media":{"track":5,"payload":"/w=="}}"#.into());
        v.push(r#"{"event":"media","media":{"payload":7}}"#.into());
        v.push(r#"{"event":"media"}"#.into());
        v.push(r#"["media",{"payload":"/w=="}]"#.into());
        v.push(format!(
            r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
            "A".repeat(100_000)
        ));
        v.push(media(r#""chunk":"7","#, &b64(7)));
        v
    }

    #[test]
    fn inbound_media_decodes_as_the_general_path_does() {
        for encoding in ["PCMU", "PCMA"] {
            let mut fast = TelnyxCodec::new();
            assert!(matches!(
                fast.decode(&start(encoding)),
                Ok(Some(MediaEvent::Start(_)))
            ));
            let mut general = fast.clone();
            for frame in frames() {
                assert_eq!(
                    fast.decode(&frame),
                    general.decode_general(&frame),
                    "{encoding}: {frame:.200}"
                );
            }
            assert_eq!(fast.reordered, general.reordered);
            assert_eq!(fast.next_chunk, general.next_chunk);
        }
    }

    #[test]
    fn malformed_media_frames_still_get_their_errors() {
        let mut c = TelnyxCodec::new();
        let media = |payload: &str| {
            format!(r#"{{"event":"media","media":{{"track":"inbound","payload":{payload}}}}}"#)
        };
        assert_eq!(c.decode(&media(r#""@@@""#)), Err(CodecError::BadBase64));
        assert_eq!(
            c.decode(&media("7")),
            Err(CodecError::InvalidField("payload"))
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":1,"payload":"/w=="}}"#),
            Err(CodecError::InvalidField("track"))
        );
        assert_eq!(
            c.decode(r#"{"event":"media"}"#),
            Err(CodecError::MissingField("media"))
        );
        assert!(matches!(
            c.decode(r#"{"event":"media","media":{"payload":"/w=="}"#),
            Err(CodecError::BadJson(_))
        ));
        // PCMA is converted on the fast path as on the general one.
        c.decode(&start("PCMA")).expect("start");
        let alaw = [0xD5u8, 0x55, 0x2A];
        let want: Vec<u8> = alaw
            .iter()
            .map(|&a| linear_to_ulaw(alaw_to_linear(a)))
            .collect();
        assert_eq!(
            c.decode(&media(&format!("\"{}\"", STANDARD.encode(alaw)))),
            Ok(Some(MediaEvent::Audio(Bytes::from(want))))
        );
    }
}
