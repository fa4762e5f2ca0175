//! Text messages and number lookups, carrier-neutrally: what the daemon asks a carrier to send
//! ([`OutgoingSms`]) and what it answers ([`SentSms`]), what a number lookup tells
//! ([`NumberInfo`], the carrier's line type folded into [`LineType`]), and an inbound message
//! as a carrier's signed webhook describes it ([`InboundSms`]). Each carrier's REST encoding
//! and webhook parsing live in its own `sms.rs`; the [`ordered_json`] writer gives the JSON
//! carriers' bodies the exact bytes their official SDKs send.

use serde::Serialize;

use super::CarrierKind;

/// The longest message body any of the SMS carriers accepts (Twilio refuses more than 1,600
/// characters with error 21617; Telnyx and Plivo split up to the same length). The daemon's
/// own cap, `[outbound] max_sms_chars`, is at most this.
pub const MAX_SMS_CHARS: usize = 1600;

/// A text message for a carrier to send; numbers are E.164 and already allowed, the body is
/// non-empty and within the caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingSms {
    /// One of our `[[numbers]]` on the carrier's account.
    pub from: String,
    pub to: String,
    pub body: String,
}

/// What the carrier answered to a message it accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentSms {
    /// The carrier's id for the message (Twilio `SM…`, Telnyx's UUID, Plivo's
    /// `message_uuid`).
    pub carrier_message_id: String,
    /// The carrier's first status (`queued`, `accepted`), as it spelled it.
    pub status: String,
}

/// What kind of line a number is, folded from each carrier's own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LineType {
    Mobile,
    Landline,
    Voip,
    TollFree,
    /// Premium-rate, shared-cost, pager, UAN, voicemail and the like.
    Other,
    Unknown,
}

impl LineType {
    /// The line type a carrier's `type` value names: Twilio's Lookup v2
    /// (`mobile`, `landline`, `fixedVoip`, `nonFixedVoip`, `tollFree`, …), Telnyx's
    /// (`mobile`, `fixed line`, `voip`, `toll free`, …) and Plivo's (`mobile`, `fixed`,
    /// `voip`, `toll-free`, `unknown`).
    pub fn from_carrier(raw: &str) -> Self {
        let folded: String = raw
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        match folded.as_str() {
            "mobile" | "wireless" | "cellular" => LineType::Mobile,
            "landline" | "fixed" | "fixedline" | "wireline" => LineType::Landline,
            "voip" | "fixedvoip" | "nonfixedvoip" => LineType::Voip,
            "tollfree" => LineType::TollFree,
            "" | "unknown" | "fixedlineormobile" => LineType::Unknown,
            _ => LineType::Other,
        }
    }
}

/// What a number lookup found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumberInfo {
    /// The number as looked up (E.164).
    pub number: String,
    /// Whether the carrier considers it a valid number (`None`: it did not say).
    pub valid: Option<bool>,
    /// ISO 3166-1 alpha-2.
    pub country: Option<String>,
    pub national_format: Option<String>,
    /// The network operator's name.
    pub carrier: Option<String>,
    pub line_type: LineType,
    /// The carrier's own word for the line type.
    pub line_type_reported: Option<String>,
}

/// A text message a carrier's signed webhook delivered to one of our numbers.
#[derive(Debug, Clone, Copy)]
pub struct InboundSms<'a> {
    pub carrier: CarrierKind,
    /// The `[carriers.NAME]` account whose signature the webhook carried.
    pub account: &'a str,
    /// The carrier's id for the message (its replays carry the same one).
    pub carrier_message_id: &'a str,
    pub from: &'a str,
    pub to: &'a str,
    pub body: &'a str,
}

/// What the daemon did with an inbound message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmsReceipt {
    /// Stored (and, for a number with `sms = true`, handed to its agent).
    Stored,
    /// A message id already seen: a carrier's retry or a replay; nothing was done.
    Repeated,
}

/// A value in an [`ordered_json`] body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JsonValue<'a> {
    Str(&'a str),
    Bool(bool),
}

/// How the SDK whose bytes a body copies serialises JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonStyle {
    /// `{"a":"b"}` with UTF-8 as is (httpx: the Telnyx SDK).
    Compact,
    /// `{"a": "b"}` with everything outside printable ASCII as `\uXXXX` (Python's
    /// `json.dumps` defaults, which `requests` uses: the Plivo SDK).
    Python,
}

/// A flat JSON object with its keys in the order given, as `style` writes it.
pub(crate) fn ordered_json(fields: &[(&str, JsonValue<'_>)], style: JsonStyle) -> String {
    let (comma, colon) = match style {
        JsonStyle::Compact => (",", ":"),
        JsonStyle::Python => (", ", ": "),
    };
    let mut out = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push_str(comma);
        }
        push_json_str(&mut out, k, style);
        out.push_str(colon);
        match v {
            JsonValue::Str(s) => push_json_str(&mut out, s, style),
            JsonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out.push('}');
    out
}

fn push_json_str(out: &mut String, s: &str, style: JsonStyle) {
    use std::fmt::Write as _;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style == JsonStyle::Python && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{:04x}", u);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_styles_match_the_sdks() {
        let f = [
            ("text", JsonValue::Str("a — ç \"q\" \u{1F600}\n\u{7f}")),
            ("log", JsonValue::Bool(false)),
        ];
        assert_eq!(
            ordered_json(&f, JsonStyle::Compact),
            "{\"text\":\"a — ç \\\"q\\\" \u{1F600}\\n\u{7f}\",\"log\":false}"
        );
        assert_eq!(
            ordered_json(&f, JsonStyle::Python),
            "{\"text\": \"a \\u2014 \\u00e7 \\\"q\\\" \\ud83d\\ude00\\n\\u007f\", \"log\": false}"
        );
        // Either way it is JSON that reads back to the same text.
        let v: serde_json::Value =
            serde_json::from_str(&ordered_json(&f, JsonStyle::Python)).expect("json");
        assert_eq!(v["text"], "a — ç \"q\" \u{1F600}\n\u{7f}");
    }

    #[test]
    fn line_types_fold() {
        for (raw, t) in [
            ("mobile", LineType::Mobile),
            ("fixedVoip", LineType::Voip),
            ("nonFixedVoip", LineType::Voip),
            ("landline", LineType::Landline),
            ("fixed line", LineType::Landline),
            ("fixed", LineType::Landline),
            ("toll free", LineType::TollFree),
            ("toll-free", LineType::TollFree),
            ("tollFree", LineType::TollFree),
            ("premium", LineType::Other),
            ("unknown", LineType::Unknown),
            ("", LineType::Unknown),
        ] {
            assert_eq!(LineType::from_carrier(raw), t, "{raw}");
        }
    }
}
