//! The carriers' messaging and lookup APIs, faked as strictly as the real ones: each carrier's
//! file checks the method, the path (the number in a lookup path raw, as the SDKs send it),
//! the content type and the body — rebuilt from its fields in the official SDK's order and
//! encoding and compared byte for byte, so a body patterd encodes differently from the SDK is
//! refused — and refuses what the carrier refuses (a missing or malformed `to`, a `from` that
//! is not one of the account's messaging numbers, an empty or over-long body), with the
//! carrier's error shape. Every message accepted, lookup answered and request refused is in
//! the [`SmsLedger`] the fake owns; the fakes route their messaging paths here after checking
//! the credentials. Lookups answer from [`SmsLedger::lines`] or a rule on the last digit.

pub mod plivo;
pub mod telnyx;
pub mod twilio;

use std::collections::BTreeMap;

/// A message a fake accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentSms {
    /// The carrier's id it answered with.
    pub id: String,
    /// As the request wrote them (Plivo: digits).
    pub from: String,
    pub to: String,
    pub body: String,
    /// The request body as received.
    pub raw: String,
}

/// A messaging or lookup request a fake refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub why: String,
}

/// What a lookup says about a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub valid: bool,
    /// `mobile`, `landline`, `voip`, `toll_free` (each fake writes it its carrier's way).
    pub kind: &'static str,
    pub carrier: &'static str,
}

/// One fake's messaging record and settings.
#[derive(Debug, Clone, Default)]
pub struct SmsLedger {
    /// The account's messaging numbers (E.164): a `from` outside them is refused.
    pub senders: Vec<String>,
    pub sent: Vec<SentSms>,
    /// Numbers looked up, as they were in the path.
    pub lookups: Vec<String>,
    pub refused: Vec<Refused>,
    /// Lookup answers set by a test, by E.164 number.
    pub lines: BTreeMap<String, Line>,
}

impl SmsLedger {
    /// Whether `number` (E.164 or digits) is one of the account's messaging numbers.
    pub fn is_sender(&self, number: &str) -> bool {
        let digits = number.trim_start_matches('+');
        self.senders
            .iter()
            .any(|s| s.trim_start_matches('+') == digits)
    }

    /// The lookup answer for `e164`.
    pub fn line(&self, e164: &str) -> Line {
        if let Some(l) = self.lines.get(e164) {
            return l.clone();
        }
        if !is_e164(e164) {
            return Line {
                valid: false,
                kind: "unknown",
                carrier: "",
            };
        }
        let (kind, carrier) = match e164.bytes().last().unwrap_or(b'0') {
            b'0'..=b'5' => ("mobile", "Sim Wireless"),
            b'6' | b'7' => ("landline", "Sim Telephone Co"),
            b'8' => ("voip", "Sim VoIP"),
            _ => ("toll_free", "Sim Toll Free"),
        };
        Line {
            valid: true,
            kind,
            carrier,
        }
    }

    fn refuse(&mut self, method: &str, path: &str, status: u16, why: &str) {
        self.refused.push(Refused {
            method: method.to_string(),
            path: path.to_string(),
            status,
            why: why.to_string(),
        });
    }
}

/// A request as the fakes hand it here.
pub struct SmsRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    /// Lower-case names.
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl SmsRequest<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `Content-Type` without parameters.
    pub fn content_type(&self) -> &str {
        self.header("content-type")
            .and_then(|c| c.split(';').next())
            .unwrap_or("")
            .trim()
    }
}

/// `+` then 8 to 15 digits, the first not 0.
pub fn is_e164(s: &str) -> bool {
    s.strip_prefix('+').is_some_and(|d| {
        (8..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) && !d.starts_with('0')
    })
}

/// Python's `urllib.parse.urlencode` of pairs (the Twilio SDK's form bodies).
pub fn python_urlencode(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        let mut out = String::new();
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) {
                out.push(b as char);
            } else if b == b' ' {
                out.push('+');
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A JSON value of a flat SDK body.
#[derive(Debug, Clone)]
pub enum Scalar {
    Str(String),
    Bool(bool),
    Num(String),
}

impl Scalar {
    fn of(v: &serde_json::Value) -> Option<Self> {
        match v {
            serde_json::Value::String(s) => Some(Scalar::Str(s.clone())),
            serde_json::Value::Bool(b) => Some(Scalar::Bool(*b)),
            serde_json::Value::Number(n) => Some(Scalar::Num(n.to_string())),
            _ => None,
        }
    }
}

/// How an SDK writes JSON: `python` is `json.dumps` with its defaults (`", "`, `": "`,
/// everything outside printable ASCII as `\uXXXX`), otherwise compact UTF-8 (httpx).
pub fn sdk_json(fields: &[(&str, Scalar)], python: bool) -> String {
    let quote = |s: &str| {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (python && !(' '..='~').contains(&c)) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
        out
    };
    let (comma, colon) = if python { (", ", ": ") } else { (",", ":") };
    let inner = fields
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Str(s) => quote(s),
                Scalar::Bool(b) => b.to_string(),
                Scalar::Num(n) => n.clone(),
            };
            format!("{}{colon}{v}", quote(k))
        })
        .collect::<Vec<_>>()
        .join(comma);
    format!("{{{inner}}}")
}

/// A received JSON object's fields, in the SDK's key order `order` (keys outside it: `Err`
/// with the first unknown key), and the bytes the SDK would have sent for them.
pub fn sdk_body(
    body: &[u8],
    order: &[&str],
    python: bool,
) -> Result<(serde_json::Map<String, serde_json::Value>, String), String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let serde_json::Value::Object(map) = v else {
        return Err("the body is not a JSON object".into());
    };
    if let Some(k) = map.keys().find(|k| !order.contains(&k.as_str())) {
        return Err(format!("unknown field `{k}`"));
    }
    let mut fields = Vec::new();
    for k in order {
        if let Some(v) = map.get(*k) {
            fields.push((
                *k,
                Scalar::of(v).ok_or_else(|| format!("`{k}` is not a scalar"))?,
            ));
        }
    }
    Ok((map.clone(), sdk_json(&fields, python)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoders give the bytes captured from the SDKs (tests/fixtures/messaging_requests.json).
    #[test]
    fn encoders_match_the_sdk_captures() {
        assert_eq!(
            python_urlencode(&[("To", "+14155550123"), ("Body", "12 Main St & 5th, ça?")]),
            "To=%2B14155550123&Body=12+Main+St+%26+5th%2C+%C3%A7a%3F"
        );
        let f = [
            ("dst", Scalar::Str("14155550123".into())),
            ("text", Scalar::Str("out — ça".into())),
            ("trackable", Scalar::Bool(false)),
        ];
        assert_eq!(
            sdk_json(&f, true),
            r#"{"dst": "14155550123", "text": "out \u2014 \u00e7a", "trackable": false}"#
        );
        assert_eq!(
            sdk_json(&f, false),
            r#"{"dst":"14155550123","text":"out — ça","trackable":false}"#
        );
    }
}
