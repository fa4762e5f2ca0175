//! Telnyx's text messages and number lookups: sending is `POST /v2/messages` with
//! `{"to","from","text"}` in the SDK's key order and bytes ([`message_body`]); a lookup is
//! `GET /v2/number_lookup/{E.164}?type=carrier`. Inbound messages arrive on the messaging
//! profile's webhook, `POST /telnyx/sms`, signed like Call Control events (Ed25519 over
//! `timestamp|body`): `message.received` is handed to the daemon, delivery reports
//! (`message.sent`, `message.finalized`) are acknowledged and ignored.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tracing::{debug, warn};

use super::TelnyxRest;
use super::routes::{TelnyxCarrier, verified_account};
use crate::carrier::messaging::{
    InboundSms, JsonStyle, JsonValue, LineType, NumberInfo, OutgoingSms, SentSms, ordered_json,
};
use crate::carrier::port::Host;
use crate::carrier::webhook::{arrive, sms_answer, unix_now};
use crate::carrier::{CarrierError, CarrierKind};
use crate::net::http::{Body, empty, text};

const CARRIER: &str = "Telnyx";

/// The body of `POST /v2/messages`, byte for byte what the SDK's `messages.send(to, from_,
/// text)` sends.
pub fn message_body(sms: &OutgoingSms) -> String {
    ordered_json(
        &[
            ("to", JsonValue::Str(&sms.to)),
            ("from", JsonValue::Str(&sms.from)),
            ("text", JsonValue::Str(&sms.body)),
        ],
        JsonStyle::Compact,
    )
}

/// The number lookup URL for `number` (E.164, checked by the caller).
pub fn lookup_url(base: &str, number: &str) -> String {
    format!(
        "{}/v2/number_lookup/{number}?type=carrier",
        base.trim_end_matches('/')
    )
}

fn non_empty(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A number lookup's `data` as [`NumberInfo`].
pub fn number_info(number: &str, data: &Value) -> NumberInfo {
    let carrier = &data["carrier"];
    let reported = non_empty(&carrier["type"]);
    NumberInfo {
        number: non_empty(&data["phone_number"]).unwrap_or_else(|| number.to_string()),
        valid: data["valid_number"].as_bool(),
        country: non_empty(&data["country_code"]),
        national_format: non_empty(&data["national_format"]),
        carrier: non_empty(&carrier["normalized_carrier"]).or_else(|| non_empty(&carrier["name"])),
        line_type: LineType::from_carrier(reported.as_deref().unwrap_or("")),
        line_type_reported: reported,
    }
}

impl TelnyxRest {
    /// Sends a text message; returns its id and first status.
    pub(crate) async fn send_message(&self, sms: &OutgoingSms) -> Result<SentSms, CarrierError> {
        let url = format!("{}/v2/messages", self.base);
        let v = self
            .post_raw(&url, "the messages resource", message_body(sms))
            .await?;
        let data = &v["data"];
        let id = non_empty(&data["id"]).ok_or_else(|| CarrierError::Http {
            carrier: CARRIER,
            status: 200,
            message: "the sent message has no data.id".into(),
        })?;
        Ok(SentSms {
            carrier_message_id: id,
            status: non_empty(&data["to"][0]["status"]).unwrap_or_else(|| "queued".into()),
        })
    }

    /// Looks `number` (E.164) up with the carrier lookup.
    pub(crate) async fn lookup(&self, number: &str) -> Result<NumberInfo, CarrierError> {
        let url = lookup_url(&self.base, number);
        let v = self
            .get(&url, &format!("the number {number} (number lookup)"))
            .await?;
        Ok(number_info(number, &v["data"]))
    }
}

/// `message.received`'s payload, the fields patterd uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub id: String,
    pub from: String,
    /// The first recipient (our number).
    pub to: String,
    pub text: String,
}

/// Why a messaging webhook body could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessagingWebhookError {
    #[error("Telnyx messaging webhook body is not JSON: {0}")]
    BadJson(String),
    #[error(
        "Telnyx messaging webhook is missing `{0}`; is this URL the webhook of a messaging profile?"
    )]
    MissingField(&'static str),
}

/// A messaging webhook: its event type and, for `message.received`, the message.
pub fn parse_webhook(
    body: &[u8],
) -> Result<(String, Option<ReceivedMessage>), MessagingWebhookError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| MessagingWebhookError::BadJson(e.to_string()))?;
    let data = &v["data"];
    let event = non_empty(&data["event_type"])
        .ok_or(MessagingWebhookError::MissingField("data.event_type"))?;
    if event != "message.received" {
        return Ok((event, None));
    }
    let p = &data["payload"];
    let need = |v: &Value, name: &'static str| {
        non_empty(v).ok_or(MessagingWebhookError::MissingField(name))
    };
    let message = ReceivedMessage {
        id: need(&p["id"], "data.payload.id")?,
        from: need(&p["from"]["phone_number"], "data.payload.from.phone_number")?,
        to: need(
            &p["to"][0]["phone_number"],
            "data.payload.to[0].phone_number",
        )?,
        text: p["text"].as_str().unwrap_or_default().to_string(),
    };
    Ok((event, Some(message)))
}

/// `POST /telnyx/sms`: the messaging profile's webhook.
pub(super) async fn webhook(
    me: Arc<TelnyxCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let arrived = match arrive(req, host.max_body_bytes()).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Some(account) = verified_account(
        &me,
        host.as_ref(),
        &arrived.headers,
        &arrived.body,
        unix_now(),
    ) else {
        return empty(403);
    };
    let (event, message) = match parse_webhook(&arrived.body) {
        Ok(x) => x,
        Err(e) => {
            warn!(error = %e, "telnyx messaging webhook without the fields patterd needs");
            return text(400, "not a messaging event\n");
        }
    };
    let Some(m) = message else {
        debug!(event = %event, "telnyx messaging event ignored");
        return empty(200);
    };
    let sms = InboundSms {
        carrier: CarrierKind::Telnyx,
        account: &account.name,
        carrier_message_id: &m.id,
        from: &m.from,
        to: &m.to,
        body: &m.text,
    };
    sms_answer(host.incoming_sms(sms).await, || empty(200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_parse() {
        let body = br#"{"data":{"event_type":"message.received","id":"e1","payload":{
            "id":"m1","from":{"phone_number":"+15557654321"},
            "to":[{"phone_number":"+15550002000","status":"webhook_delivered"}],
            "text":"hi"}}}"#;
        let (event, m) = parse_webhook(body).expect("parses");
        assert_eq!(event, "message.received");
        let m = m.expect("message");
        assert_eq!(
            (m.id.as_str(), m.to.as_str(), m.text.as_str()),
            ("m1", "+15550002000", "hi")
        );
        let (event, m) =
            parse_webhook(br#"{"data":{"event_type":"message.finalized","payload":{}}}"#)
                .expect("parses");
        assert_eq!((event.as_str(), m), ("message.finalized", None));
        assert!(matches!(
            parse_webhook(br#"{"data":{"event_type":"message.received","payload":{"id":"m"}}}"#),
            Err(MessagingWebhookError::MissingField(_))
        ));
        assert!(parse_webhook(b"nope").is_err());
    }

    #[test]
    fn lookups_fold() {
        let data = serde_json::json!({"phone_number": "+13129457420", "country_code": "US",
            "valid_number": true, "carrier": {"name": "AT&T WIRELESS", "type": "mobile",
            "normalized_carrier": "AT&T"}});
        let info = number_info("+13129457420", &data);
        assert_eq!(info.carrier.as_deref(), Some("AT&T"));
        assert_eq!(info.line_type, LineType::Mobile);
    }
}
