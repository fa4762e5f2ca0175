//! Small wire-format pieces several carriers share: XML escaping for answer documents, and
//! the string fields, inbound media payloads, DTMF digits and unknown events of media codecs.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use super::CodecError;

/// A media frame's JSON object; a frame longer than `max_len` is refused unparsed.
pub fn json_frame(frame: &str, max_len: usize) -> Result<Value, CodecError> {
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
pub fn object_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a Value, CodecError> {
    let field = v.get(name).ok_or(CodecError::MissingField(name))?;
    if !field.is_object() {
        return Err(CodecError::InvalidField(name));
    }
    Ok(field)
}

/// A string field of a media frame: missing or not a string is an error naming the field.
pub fn str_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a str, CodecError> {
    v.get(name)
        .ok_or(CodecError::MissingField(name))?
        .as_str()
        .ok_or(CodecError::InvalidField(name))
}

/// The decoded audio of a `media` frame's `media.payload` (base64), or `None` for another
/// track than the caller's (outbound-track echoes, with `track="both_tracks"`, are not caller
/// audio). A payload that would decode to more than `max_bytes` is refused before decoding.
pub fn inbound_media_payload(msg: &Value, max_bytes: usize) -> Result<Option<Vec<u8>>, CodecError> {
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
pub fn xml_escape(s: &str) -> String {
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
pub fn parse_digit(digit: &str) -> Result<char, CodecError> {
    let mut chars = digit.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_digit() || matches!(c, '*' | '#' | 'A'..='D') => Ok(c),
        _ => Err(CodecError::InvalidField("digit")),
    }
}

/// An unknown media event, its name cut to 64 characters for the log.
pub fn unknown_event(other: &str) -> CodecError {
    let mut name: String = other.chars().take(64).collect();
    if name.len() < other.len() {
        name.push('…');
    }
    CodecError::UnknownEvent(name)
}
