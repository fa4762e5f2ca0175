//! Small wire-format pieces several carriers share: XML escaping for answer documents, and
//! the DTMF digit and unknown-event handling of media codecs.

use super::CodecError;

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
