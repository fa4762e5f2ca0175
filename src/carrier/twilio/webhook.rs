//! Twilio webhook requests: parsing the form body into raw pairs (kept whole for signature
//! checks) and into a typed [`VoiceWebhook`]. The public URL Twilio signed is rebuilt by the
//! carrier-shared [`public_request_url`].

/// Parses an `application/x-www-form-urlencoded` body into ordered pairs, keeping repeated and
/// empty fields (every field counts for the signature).
pub fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

pub use crate::carrier::webhook::{public_request_url, public_ws_url};

/// Why a webhook body could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error(
        "Twilio webhook is missing `{0}`; is this URL configured as a Twilio Voice webhook \
         (form POST)?"
    )]
    MissingField(&'static str),
}

/// The fields of a Twilio voice webhook (incoming call, outbound call answer, or status
/// callback) that patterd uses. `params` keeps every field as received.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VoiceWebhook {
    pub call_sid: String,
    pub account_sid: String,
    pub from: String,
    pub to: String,
    /// `inbound`, `outbound-api`, `outbound-dial`.
    pub direction: String,
    /// `ringing`, `in-progress`, `completed`, ...
    pub(crate) call_status: String,
    pub api_version: Option<String>,
    pub(crate) caller_name: Option<String>,
    pub(crate) forwarded_from: Option<String>,
    pub(crate) parent_call_sid: Option<String>,
    /// Answering-machine detection result, when AMD ran.
    pub answered_by: Option<String>,
    /// Seconds, on status callbacks for completed calls.
    pub(crate) call_duration: Option<u64>,
    pub(crate) stir_verstat: Option<String>,
    pub params: Vec<(String, String)>,
}

impl VoiceWebhook {
    /// Builds the typed view. `CallSid` and `To` are required (non-empty); everything else
    /// defaults to empty / `None`.
    pub fn from_params(params: &[(String, String)]) -> Result<Self, WebhookError> {
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let call_sid = get("CallSid").ok_or(WebhookError::MissingField("CallSid"))?;
        let to = get("To").ok_or(WebhookError::MissingField("To"))?;
        Ok(Self {
            call_sid,
            account_sid: get("AccountSid").unwrap_or_default(),
            from: get("From").unwrap_or_default(),
            to,
            direction: get("Direction").unwrap_or_default(),
            call_status: get("CallStatus").unwrap_or_default(),
            api_version: get("ApiVersion"),
            caller_name: get("CallerName"),
            forwarded_from: get("ForwardedFrom"),
            parent_call_sid: get("ParentCallSid"),
            answered_by: get("AnsweredBy"),
            call_duration: get("CallDuration").and_then(|d| d.parse().ok()),
            stir_verstat: get("StirVerstat"),
            params: params.to_vec(),
        })
    }

    /// Parses a form body straight into the typed view.
    pub fn from_form(body: &[u8]) -> Result<Self, WebhookError> {
        Self::from_params(&parse_form(body))
    }

    /// A raw field by name (first occurrence).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_webhook() {
        let body = b"CallSid=CA1&AccountSid=AC1&From=%2B14155550199&To=%2B14155550100&Direction=inbound&CallStatus=ringing&CallerName=&CallDuration=42";
        let w = VoiceWebhook::from_form(body).expect("valid");
        assert_eq!(w.call_sid, "CA1");
        assert_eq!(w.from, "+14155550199");
        assert_eq!(w.to, "+14155550100");
        assert_eq!(w.caller_name, None);
        assert_eq!(w.call_duration, Some(42));
        assert_eq!(w.param("CallerName"), Some(""));
        assert_eq!(w.params.len(), 8);
        assert_eq!(
            VoiceWebhook::from_form(b"To=%2B1"),
            Err(WebhookError::MissingField("CallSid"))
        );
        assert_eq!(
            VoiceWebhook::from_form(b"CallSid=CA1&To="),
            Err(WebhookError::MissingField("To"))
        );
        assert!(VoiceWebhook::from_form(b"\xff\xfe=%%%").is_err());
    }
}
