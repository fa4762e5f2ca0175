//! The Plivo audio stream codec: `start`, `media`, `dtmf`, `playedStream`
//! (or the older `played`), `clearedAudio` and a `stop` if one comes in; `playAudio`,
//! `checkpoint` and `clearAudio` out. The core speaks μ-law 8 kHz; when the stream is
//! `audio/x-l16` (little-endian, 8 or 16 kHz) inbound audio is converted to μ-law (16 kHz is
//! halved by averaging sample pairs) and outbound audio back to L16 at the stream's rate
//! (doubled by linear interpolation). Plivo ends a stream by closing the socket, so a close
//! counts as the caller hanging up ([`MediaCodec::stop_on_close`]). A checkpoint whose audio was
//! cleared is never acknowledged; the call's speech queue settles those itself.
//!
//! The 50-a-second frames go without allocating, as Twilio's do: an ordinary inbound `media`
//! frame is read borrowed ([`probe_inbound_media`]) and decoded (and, for L16, converted in
//! place) into a [`FramePool`]; outgoing frames are written into the caller's buffer
//! ([`MediaCodec::encode_into`], byte for byte what `serde_json::json!` built; L16 through a
//! reused scratch buffer).

use std::collections::BTreeMap;
use std::io::Write;

use bytes::Bytes;
use serde_json::Value;

use crate::audio::g711::{linear_to_ulaw, ulaw_to_linear};
use crate::carrier::codec_util::{
    FramePool, encode_via_buffer, inbound_media_payload, json_frame, object_field, parse_digit,
    probe_inbound_media, push_base64, push_json_str, str_field, unknown_event,
};
use crate::carrier::{CodecError, MAX_MEDIA_MESSAGE, MediaCodec, MediaCommand, MediaEvent, StreamStart};


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
    /// Inbound L16 → μ-law state.
    l16_in: L16In,
    /// Last outbound sample (interpolation when upsampling).
    last_out: i16,
    /// Where inbound audio is decoded to.
    pool: FramePool,
    /// Outbound L16 before base64 (reused).
    pcm_out: Vec<u8>,
}

/// What inbound L16 leaves over from one payload for the next.
#[derive(Debug, Default, Clone, Copy)]
struct L16In {
    /// An odd byte (half a sample) left over from the last L16 payload.
    carry: Option<u8>,
    /// At 16 kHz, a sample waiting for its pair.
    pending_sample: Option<i16>,
}

impl L16In {
    /// Converts L16 bytes (little-endian, at `rate`) to μ-law 8 kHz in place, carrying half
    /// samples and unpaired samples to the next payload; returns how many μ-law bytes now lead
    /// `buf`. Each μ-law byte is written behind the bytes already read, so one pass suffices.
    fn convert_in_place(&mut self, buf: &mut [u8], rate: u32) -> usize {
        let len = buf.len();
        let (mut read, mut written) = (0, 0);
        loop {
            let sample = match self.carry.take() {
                Some(lo) => {
                    let Some(&hi) = buf.get(read) else {
                        self.carry = Some(lo);
                        break;
                    };
                    read += 1;
                    i16::from_le_bytes([lo, hi])
                }
                None => {
                    if read + 2 > len {
                        self.carry = buf.get(read).copied();
                        break;
                    }
                    read += 2;
                    i16::from_le_bytes([buf[read - 2], buf[read - 1]])
                }
            };
            let sample = if rate == 16000 {
                match self.pending_sample.take() {
                    None => {
                        self.pending_sample = Some(sample);
                        continue;
                    }
                    Some(a) => ((i32::from(a) + i32::from(sample)) / 2) as i16,
                }
            } else {
                sample
            };
            buf[written] = linear_to_ulaw(sample);
            written += 1;
        }
        written
    }
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
        self.l16_in = L16In::default();
        Ok(MediaEvent::Start(StreamStart {
            call_id,
            stream_id,
            custom_parameters: parse_extra_headers(msg.get("extra_headers")),
        }))
    }

    /// Converts outbound μ-law 8 kHz to L16 at `rate` into `out` (cleared first).
    fn ulaw_to_l16(&mut self, ulaw: &[u8], rate: u32, out: &mut Vec<u8>) {
        out.clear();
        for &u in ulaw {
            let s = ulaw_to_linear(u);
            if rate == 16000 {
                let mid = ((i32::from(self.last_out) + i32::from(s)) / 2) as i16;
                out.extend_from_slice(&mid.to_le_bytes());
            }
            out.extend_from_slice(&s.to_le_bytes());
            self.last_out = s;
        }
    }

    /// Makes a frame's decoded audio μ-law (L16 converted in place); how many bytes of it are
    /// μ-law now (none when all of it was half a sample or a sample waiting for its pair).
    fn make_ulaw(&mut self, audio: &mut [u8]) -> usize {
        match self.format {
            PlivoFormat::Mulaw => audio.len(),
            PlivoFormat::L16(rate) => self.l16_in.convert_in_place(audio, rate),
        }
    }

    fn decode_media(&mut self, msg: &Value) -> Result<Option<MediaEvent>, CodecError> {
        let Some(mut audio) = inbound_media_payload(msg, MAX_MEDIA_MESSAGE)? else {
            return Ok(None);
        };
        let kept = self.make_ulaw(&mut audio);
        audio.truncate(kept);
        if audio.is_empty() {
            return Ok(None);
        }
        Ok(Some(MediaEvent::Audio(Bytes::from(audio))))
    }

    /// Any frame, through a JSON tree: every event, and the `media` frames the fast path
    /// leaves (with their precise errors).
    fn decode_general(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        let msg = json_frame(frame, MAX_MEDIA_MESSAGE * 2)?;
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

    /// An ordinary inbound `media` frame, read borrowed and decoded into the pool; `None` when
    /// the general path must decode it.
    fn decode_media_fast(&mut self, frame: &str) -> Option<Option<MediaEvent>> {
        let media = probe_inbound_media(frame, MAX_MEDIA_MESSAGE)?;
        let mut pool = std::mem::take(&mut self.pool);
        let audio = pool.decode_base64_with(media.payload, |audio| self.make_ulaw(audio));
        self.pool = pool;
        let audio = audio?;
        Some((!audio.is_empty()).then_some(MediaEvent::Audio(audio)))
    }
}

impl MediaCodec for PlivoCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        match self.decode_media_fast(frame) {
            Some(event) => Ok(event),
            None => self.decode_general(frame),
        }
    }

    /// `None` before `start` (there is no `streamId` yet) and for hang-up (a REST call).
    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        encode_via_buffer(self, cmd)
    }

    fn encode_into(&mut self, cmd: &MediaCommand, out: &mut Vec<u8>) -> bool {
        if self.stream_id.is_none() {
            return false;
        }
        out.clear();
        // The same bytes `serde_json::json!` gave (keys in sorted order; `playAudio` without
        // `streamId`, as the official stream SDK sends it).
        match cmd {
            MediaCommand::Audio(audio) => {
                match self.format {
                    PlivoFormat::Mulaw => {
                        out.extend_from_slice(
                            br#"{"event":"playAudio","media":{"contentType":"audio/x-mulaw","payload":""#,
                        );
                        push_base64(out, audio);
                        out.extend_from_slice(br#"","sampleRate":8000}}"#);
                    }
                    PlivoFormat::L16(rate) => {
                        let mut pcm = std::mem::take(&mut self.pcm_out);
                        self.ulaw_to_l16(audio, rate, &mut pcm);
                        out.extend_from_slice(
                            br#"{"event":"playAudio","media":{"contentType":"audio/x-l16","payload":""#,
                        );
                        push_base64(out, &pcm);
                        self.pcm_out = pcm;
                        // Formatting a number into a Vec does not allocate.
                        let _ = write!(out, r#"","sampleRate":{rate}}}}}"#);
                    }
                }
                return true;
            }
            MediaCommand::Mark(name) => {
                out.extend_from_slice(br#"{"event":"checkpoint","name":"#);
                push_json_str(out, name);
                out.extend_from_slice(br#","streamId":"#);
            }
            MediaCommand::Clear => out.extend_from_slice(br#"{"event":"clearAudio","streamId":"#),
        }
        if let Some(sid) = &self.stream_id {
            push_json_str(out, sid);
        }
        out.push(b'}');
        true
    }

    fn stop_on_close(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

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

/// The allocation-free paths against the general ones (and the `json!` encoder and the
/// allocating L16 conversions they replaced).
#[cfg(test)]
mod fast_path_tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    /// The encoder before the hand-written one (`last_out` is its interpolation state).
    fn json_encode(
        format: PlivoFormat,
        sid: &str,
        last_out: &mut i16,
        cmd: &MediaCommand,
    ) -> Option<String> {
        let v = match cmd {
            MediaCommand::Audio(audio) => {
                let (content_type, rate, payload) = match format {
                    PlivoFormat::Mulaw => ("audio/x-mulaw", 8000, audio.to_vec()),
                    PlivoFormat::L16(rate) => {
                        let mut out = Vec::new();
                        for &u in audio.iter() {
                            let s = ulaw_to_linear(u);
                            if rate == 16000 {
                                let mid = ((i32::from(*last_out) + i32::from(s)) / 2) as i16;
                                out.extend_from_slice(&mid.to_le_bytes());
                            }
                            out.extend_from_slice(&s.to_le_bytes());
                            *last_out = s;
                        }
                        ("audio/x-l16", rate, out)
                    }
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
        };
        Some(v.to_string())
    }

    /// The inbound L16 conversion before the in-place one.
    fn l16_to_ulaw_vec(state: &mut L16In, raw: &[u8], rate: u32) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend(state.carry.take());
        bytes.extend_from_slice(raw);
        if bytes.len() % 2 == 1 {
            state.carry = bytes.pop();
        }
        let samples = bytes
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]));
        let mut out = Vec::new();
        if rate == 16000 {
            for s in samples {
                match state.pending_sample.take() {
                    None => state.pending_sample = Some(s),
                    Some(a) => out.push(linear_to_ulaw(((i32::from(a) + i32::from(s)) / 2) as i16)),
                }
            }
        } else {
            out.extend(samples.map(linear_to_ulaw));
        }
        out
    }

    fn start(encoding: &str, rate: u32) -> String {
        format!(
            r#"{{"event":"start","sequenceNumber":1,"start":{{"callId":"c1","streamId":"s\"1","mediaFormat":{{"encoding":"{encoding}","sampleRate":{rate}}}}}}}"#
        )
    }

    const FORMATS: [(&str, u32); 3] = [
        ("audio/x-mulaw", 8000),
        ("audio/x-l16", 8000),
        ("audio/x-l16", 16000),
    ];

    #[test]
    fn outgoing_frames_are_byte_identical_to_the_json_encoder() {
        let cmds = [
            MediaCommand::Audio(Bytes::from((0..160u32).map(|i| (i * 7) as u8).collect::<Vec<_>>())),
            MediaCommand::Audio(Bytes::new()),
            MediaCommand::Audio(Bytes::from_static(&[0x00, 0x7F, 0x80])),
            MediaCommand::Mark("reply-1".into()),
            MediaCommand::Audio(Bytes::from(vec![0x10; 1600])),
            MediaCommand::Mark("q\"u\\o/te\n\u{1}é😀".into()),
            MediaCommand::Clear,
            MediaCommand::Audio(Bytes::from_static(&[0xFF])),
        ];
        for (encoding, rate) in FORMATS {
            let mut c = PlivoCodec::new();
            assert_eq!(c.encode(&MediaCommand::Clear), None, "before start");
            let mut out = vec![b'x'; 3];
            assert!(!c.encode_into(&MediaCommand::Audio(Bytes::new()), &mut out));
            c.decode(&start(encoding, rate)).expect("start");
            let mut last_out = 0i16;
            for cmd in &cmds {
                let want = json_encode(c.format(), "s\"1", &mut last_out, cmd);
                assert!(c.encode_into(cmd, &mut out) == want.is_some());
                if let Some(want) = want {
                    assert_eq!(
                        std::str::from_utf8(&out),
                        Ok(want.as_str()),
                        "{encoding} {rate}: {cmd:?}"
                    );
                }
            }
            // `encode` is the same frame as a string (and moves the same state).
            let mut other = c.clone();
            let cmd = MediaCommand::Audio(Bytes::from_static(&[1, 2, 3]));
            assert!(c.encode_into(&cmd, &mut out));
            assert_eq!(other.encode(&cmd).as_deref().map(str::as_bytes), Some(&out[..]));
        }
    }

    #[test]
    fn in_place_l16_conversion_matches_the_allocating_one() {
        let pcm: Vec<u8> = (0..701u32).map(|i| (i * 37 % 251) as u8).collect();
        for rate in [8000, 16000] {
            let (mut old, mut new) = (L16In::default(), L16In::default());
            // Payload sizes that split samples and sample pairs every way.
            let mut rest = &pcm[..];
            for n in [0, 1, 1, 2, 3, 5, 320, 7, 0, 1, 2, 4, 8, 100, 641].iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (part, tail) = rest.split_at((*n).min(rest.len()));
                rest = tail;
                let want = l16_to_ulaw_vec(&mut old, part, rate);
                let mut buf = part.to_vec();
                let n = new.convert_in_place(&mut buf, rate);
                assert_eq!(&buf[..n], &want[..], "rate {rate}, part of {}", part.len());
                assert_eq!((new.carry, new.pending_sample), (old.carry, old.pending_sample));
            }
        }
    }

    #[test]
    fn inbound_media_decodes_as_the_general_path_does() {
        let media = |payload: &str| {
            format!(
                r#"{{"event":"media","sequenceNumber":42,"streamId":"s1","media":{{"track":"inbound","timestamp":"1705312200000","chunk":41,"payload":"{payload}"}},"extra_headers":"a=1"}}"#
            )
        };
        let b64 = |n: usize| STANDARD.encode((0..n).map(|i| (i * 13 % 256) as u8).collect::<Vec<u8>>());
        let frames = [
            media(&b64(320)),
            media(&b64(5)),
            media(&b64(1)),
            media(&b64(2)),
            media(""),
            media(&b64(3)),
            media(&format!("{}\\/w==", &b64(3)[..4])),
            media("@@@@"),
            media(&b64(160)),
            r#"{"event":"media","media":{"payload":"AAEC"}}"#.into(),
            r#"{"event":"media","media":{"track":"inbound_track","chunk":"x","payload":"AAEC"}}"#.into(),
            r#"{"event":"media","media":{"track":"outbound","payload":"AAEC"}}"#.into(),
            r#"{"event":"media","media":{"payload":"AAEC","payload":"AA=="}}"#.into(),
            r#"{"event":"media","media":{"payload":7}}"#.into(),
            r#"["media",{"payload":"AAEC"}]"#.into(),
            media(&b64(321)),
        ];
        for (encoding, rate) in FORMATS {
            let mut fast = PlivoCodec::new();
            fast.decode(&start(encoding, rate)).expect("start");
            let mut general = fast.clone();
            for frame in &frames {
                assert_eq!(
                    fast.decode(frame),
                    general.decode_general(frame),
                    "{encoding} {rate}: {frame}"
                );
            }
        }
    }

    #[test]
    fn malformed_media_frames_still_get_their_errors() {
        let mut c = PlivoCodec::new();
        c.decode(&start("audio/x-l16", 8000)).expect("start");
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":"inbound","payload":"@@@@"}}"#),
            Err(CodecError::BadBase64)
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":"inbound"}}"#),
            Err(CodecError::MissingField("payload"))
        );
        assert_eq!(
            c.decode(r#"{"event":"media","media":{"track":[],"payload":"AAEC"}}"#),
            Err(CodecError::InvalidField("track"))
        );
        let big = format!(
            r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
            "A".repeat(100_000)
        );
        assert!(matches!(c.decode(&big), Err(CodecError::TooLarge(_))));
        // A bad frame leaves no half sample behind: the next one decodes whole.
        assert_eq!(
            c.decode(&format!(
                r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
                STANDARD.encode(0i16.to_le_bytes())
            )),
            Ok(Some(MediaEvent::Audio(Bytes::from_static(&[0xFF]))))
        );
    }
}
