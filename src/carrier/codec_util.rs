//! Small wire-format pieces several carriers share: XML escaping for answer documents, and
//! the string fields, inbound media payloads, counters, DTMF digits and unknown events of media
//! codecs — including the allocation-free fast path for the one frame that comes 50 times a
//! second (Twilio, Telnyx and Plivo all send `{"event":"media","media":{"payload":…}}`: read
//! borrowed by [`probe_inbound_media`], decoded into a [`FramePool`]) and the pieces codecs
//! build outgoing frames from in a reused buffer ([`push_json_str`], [`push_base64`],
//! [`encode_via_buffer`]).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::Value;

use super::{CodecError, MediaCodec, MediaCommand};

/// A media frame's JSON object; a frame longer than `max_len` is refused unparsed.
pub(crate) fn json_frame(frame: &str, max_len: usize) -> Result<Value, CodecError> {
    if frame.len() > max_len {
        return Err(CodecError::TooLarge(frame.len()));
    }
    let msg: Value = serde_json::from_str(frame).map_err(|e| CodecError::BadJson(e.to_string()))?;
    if !msg.is_object() {
        return Err(CodecError::BadJson("expected a JSON object".into()));
    }
    Ok(msg)
}

/// An object field of a media frame: missing or not an object is an error naming the field.
pub(crate) fn object_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a Value, CodecError> {
    let field = v.get(name).ok_or(CodecError::MissingField(name))?;
    if !field.is_object() {
        return Err(CodecError::InvalidField(name));
    }
    Ok(field)
}

/// A string field of a media frame: missing or not a string is an error naming the field.
pub(crate) fn str_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a str, CodecError> {
    v.get(name)
        .ok_or(CodecError::MissingField(name))?
        .as_str()
        .ok_or(CodecError::InvalidField(name))
}

/// A frame counter (`media.chunk`, …) as a string (`"3"`, Twilio's and Telnyx's spelling) or a
/// number (Plivo's); `None` for anything else (negative, fractional, not a counter).
pub(crate) fn counter_value(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::String(s) => counter_str(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

fn counter_str(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

/// The decoded audio of a `media` frame's `media.payload` (base64), or `None` for another
/// track than the caller's (outbound-track echoes, with `track="both_tracks"`, are not caller
/// audio). A payload that would decode to more than `max_bytes` is refused before decoding.
pub(crate) fn inbound_media_payload(
    msg: &Value,
    max_bytes: usize,
) -> Result<Option<Vec<u8>>, CodecError> {
    let media = msg.get("media").ok_or(CodecError::MissingField("media"))?;
    match media.get("track") {
        None => {}
        Some(Value::String(t)) if t == "inbound" || t == "inbound_track" => {}
        Some(Value::String(_)) => return Ok(None),
        Some(_) => return Err(CodecError::InvalidField("track")),
    }
    let payload = str_field(media, "payload")?;
    // Base64 is 4/3 of the data; check before decoding so a huge payload costs nothing.
    if payload.len() / 4 * 3 > max_bytes {
        return Err(CodecError::TooLarge(payload.len() / 4 * 3));
    }
    STANDARD
        .decode(payload)
        .map(Some)
        .map_err(|_| CodecError::BadBase64)
}

/// Escapes text for use in XML content or a double-quoted attribute.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0; drop them.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => {}
            c => out.push(c),
        }
    }
    out
}

/// A DTMF digit as carriers send it: one of `0-9 * # A-D`.
pub(crate) fn parse_digit(digit: &str) -> Result<char, CodecError> {
    let mut chars = digit.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_digit() || matches!(c, '*' | '#' | 'A'..='D') => Ok(c),
        _ => Err(CodecError::InvalidField("digit")),
    }
}

/// An unknown media event, its name cut to 64 characters and its control characters escaped
/// for the log (a peer sends it before any authentication).
pub(crate) fn unknown_event(other: &str) -> CodecError {
    CodecError::UnknownEvent(crate::security::truncate_for_log(other, 64))
}

/// Bytes a [`FramePool`] reserves at a time: a dozen 20 ms μ-law frames, so decoding
/// allocates at most once per ≈ 240 ms of audio (and not at all while the frames cut earlier
/// are released in time, the usual case). Small because every live call holds one.
const POOL_BYTES: usize = 2 * 1024;

/// Decoded caller audio is carved out of one shared block instead of a fresh allocation per
/// frame: each frame is a [`Bytes`] view of the block, and the block is reused once every
/// frame cut from it was dropped.
#[derive(Debug, Default)]
pub(crate) struct FramePool {
    buf: BytesMut,
}

impl Clone for FramePool {
    /// A clone starts with its own (empty) pool.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl FramePool {
    /// Decodes base64 `payload` into the pool; `None` when it is not valid base64.
    pub(crate) fn decode_base64(&mut self, payload: &str) -> Option<Bytes> {
        self.decode_base64_with(payload, |audio| audio.len())
    }

    /// Decodes base64 `payload` into the pool, then lets `convert` rewrite the decoded bytes in
    /// place (e.g. A-law or L16 to μ-law) and say how many of them the frame keeps; `None`
    /// (and `convert` not called) when the payload is not valid base64.
    pub(crate) fn decode_base64_with(
        &mut self,
        payload: &str,
        convert: impl FnOnce(&mut [u8]) -> usize,
    ) -> Option<Bytes> {
        let max = base64::decoded_len_estimate(payload.len());
        if self.buf.capacity() < max {
            self.buf.reserve(POOL_BYTES.max(max));
        }
        self.buf.resize(max, 0);
        match STANDARD.decode_slice(payload, &mut self.buf[..]) {
            Ok(n) => {
                let kept = convert(&mut self.buf[..n]).min(n);
                self.buf.truncate(kept);
                Some(self.buf.split().freeze())
            }
            Err(_) => {
                self.buf.clear();
                None
            }
        }
    }
}

/// The fields of a `media` frame, borrowed from the frame's text.
#[derive(Deserialize)]
struct MediaProbe<'a> {
    #[serde(borrow, default)]
    event: Option<&'a str>,
    #[serde(borrow, default)]
    media: Option<MediaProbeBody<'a>>,
}

#[derive(Deserialize)]
struct MediaProbeBody<'a> {
    #[serde(borrow, default)]
    track: Option<&'a str>,
    #[serde(borrow, default)]
    payload: Option<&'a str>,
    #[serde(default)]
    chunk: Option<Counter>,
}

/// `media.chunk` read without a JSON tree, as [`counter_value`] reads it: a string or a
/// number; another JSON type makes the probe fail (the general path then decides).
struct Counter(Option<u64>);

impl<'de> Deserialize<'de> for Counter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Counter;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a counter (string or number)")
            }
            fn visit_str<E>(self, s: &str) -> Result<Counter, E> {
                Ok(Counter(counter_str(s)))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Counter, E> {
                Ok(Counter(Some(n)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Counter, E> {
                // serde_json gives non-negative integers as u64: this is a negative one.
                Ok(Counter(u64::try_from(n).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Counter, E> {
                Ok(Counter(None))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// An ordinary inbound `media` frame's fields, borrowed from its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InboundMedia<'a> {
    /// `media.payload`: base64, without escapes, of at most `max_bytes` once decoded.
    pub payload: &'a str,
    /// `media.chunk`, when it is a counter ([`counter_value`]).
    pub chunk: Option<u64>,
}

/// Reads an ordinary inbound `media` frame (`{"event":"media","media":{"payload":…}}` with
/// Twilio's, Telnyx's or Plivo's field names, track `inbound`/`inbound_track` or none) without
/// building a JSON tree: no allocation. `None` for anything else — another event or track,
/// strings with escapes, a frame over 2 × `max_bytes` or a payload over `max_bytes`, odd types,
/// duplicate keys, bad JSON — which the codec's general path then decodes (and reports) as
/// before.
pub(crate) fn probe_inbound_media(frame: &str, max_bytes: usize) -> Option<InboundMedia<'_>> {
    // A struct also deserialises from a JSON array; only objects are frames.
    if frame.len() > max_bytes.saturating_mul(2) || !frame.trim_start().starts_with('{') {
        return None;
    }
    let probe: MediaProbe = serde_json::from_str(frame).ok()?;
    if probe.event? != "media" {
        return None;
    }
    let media = probe.media?;
    if !matches!(media.track, None | Some("inbound" | "inbound_track")) {
        return None;
    }
    let payload = media.payload?;
    if payload.len() / 4 * 3 > max_bytes {
        return None;
    }
    Some(InboundMedia {
        payload,
        chunk: media.chunk.and_then(|c| c.0),
    })
}

/// The caller audio of an ordinary inbound `media` frame ([`probe_inbound_media`]) decoded
/// into `pool` as it came; `None` when the general path must decode it.
pub(crate) fn fast_inbound_media(
    frame: &str,
    max_bytes: usize,
    pool: &mut FramePool,
) -> Option<Bytes> {
    pool.decode_base64(probe_inbound_media(frame, max_bytes)?.payload)
}

/// Appends `s` as a JSON string (quoted and escaped) without allocating.
pub(crate) fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Appends the base64 of `data` without allocating (beyond growing `out`).
pub(crate) fn push_base64(out: &mut Vec<u8>, data: &[u8]) {
    let start = out.len();
    let n = base64::encoded_len(data.len(), true).unwrap_or(0);
    out.resize(start + n, 0);
    let written = STANDARD.encode_slice(data, &mut out[start..]).unwrap_or(0);
    out.truncate(start + written);
}

/// [`MediaCodec::encode`] for a codec that writes its frames by hand in
/// [`MediaCodec::encode_into`]: the same frame, as a `String`.
pub(crate) fn encode_via_buffer<C: MediaCodec + ?Sized>(
    codec: &mut C,
    cmd: &MediaCommand,
) -> Option<String> {
    let mut out = Vec::new();
    if !codec.encode_into(cmd, &mut out) {
        return None;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    /// Each carrier's ordinary `media` frame is read on the fast path, with its counter.
    #[test]
    fn reads_every_carriers_media_frame_and_leaves_the_rest() {
        let cases = [
            (
                r#"{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1","timestamp":"5","payload":"/w=="},"streamSid":"MZ1"}"#,
                Some(1),
            ),
            (
                r#"{"event":"media","sequence_number":"4","media":{"track":"inbound","chunk":"2","timestamp":"5","payload":"/w=="},"stream_id":"32DE"}"#,
                Some(2),
            ),
            (
                r#"{"event":"media","sequenceNumber":42,"streamId":"8765","media":{"track":"inbound","timestamp":"1705312200000","chunk":41,"payload":"/w=="},"extra_headers":"a=1"}"#,
                Some(41),
            ),
            (r#" {"event":"media","media":{"payload":"/w=="}}"#, None),
            (
                r#"{"event":"media","media":{"chunk":-1,"payload":"/w=="}}"#,
                None,
            ),
            (
                r#"{"event":"media","media":{"chunk":"x","payload":"/w=="}}"#,
                None,
            ),
        ];
        for (frame, chunk) in cases {
            assert_eq!(
                probe_inbound_media(frame, 1024),
                Some(InboundMedia {
                    payload: "/w==",
                    chunk
                }),
                "{frame}"
            );
        }
        for frame in [
            r#"{"event":"mark","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","media":{"track":"outbound","payload":"/w=="}}"#,
            r#"{"event":"media","media":{"payload":"\/w=="}}"#,
            r#"{"event":"media","media":{"chunk":{},"payload":"/w=="}}"#,
            r#"{"event":"media","media":{"chunk":true,"payload":"/w=="}}"#,
            r#"{"event":"media","event":"media","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","media":{"payload":"/w=="}"#,
            r#"["media",{"payload":"/w=="}]"#,
            r#"{"event":"media","media":{"payload":"AAAAAAAA"}}"#,
        ] {
            assert_eq!(probe_inbound_media(frame, 4), None, "{frame}");
        }
        let mut pool = FramePool::default();
        assert_eq!(pool.decode_base64("@@"), None);
        assert_eq!(
            pool.decode_base64_with("AAEC", |b| {
                b.reverse();
                2
            }),
            Some(Bytes::from_static(&[2, 1]))
        );
    }
}
