//! Twilio's text messages and number lookups: sending is `POST
//! /2010-04-01/Accounts/{AccountSid}/Messages.json` with the form `To`, `From`, `Body` in the
//! SDK's order and encoding ([`message_form`]); a lookup is Lookup v2's `GET
//! {lookup_base}/v2/PhoneNumbers/{E.164}?Fields=line_type_intelligence` (the `+` raw in the path,
//! as the SDK sends it). An inbound message is the number's messaging webhook, `POST
//! /twilio/sms`, signed like the voice webhook (`X-Twilio-Signature`), answered with an empty
//! `<Response/>`: the agent's reply, if any, goes out through the API like any other message.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tracing::warn;

use super::TwilioRest;
use super::rest::encode_form;
use super::routes::{TwilioCarrier, signed_form};
use crate::carrier::CarrierError;
use crate::carrier::messaging::{InboundSms, LineType, NumberInfo, OutgoingSms, SentSms};
use crate::carrier::port::Host;
use crate::carrier::webhook::field_or_empty;
use crate::carrier::{CarrierKind, webhook::sms_answer};
use crate::net::http::{Body, text, xml};

const CARRIER: &str = "Twilio";

/// The form body of `Messages.json`, as the SDK's `messages.create(to, from_, body)` sends it.
pub fn message_form(sms: &OutgoingSms) -> String {
    encode_form(&[("To", &sms.to), ("From", &sms.from), ("Body", &sms.body)])
}

/// The Lookup v2 URL for `number` (E.164, checked by the caller) under `lookup_base`.
pub fn lookup_url(lookup_base: &str, number: &str) -> String {
    format!(
        "{}/v2/PhoneNumbers/{number}?Fields=line_type_intelligence",
        lookup_base.trim_end_matches('/')
    )
}

fn non_empty(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A Lookup v2 answer as [`NumberInfo`].
pub fn number_info(number: &str, v: &Value) -> NumberInfo {
    let lti = &v["line_type_intelligence"];
    let reported = non_empty(&lti["type"]);
    NumberInfo {
        number: non_empty(&v["phone_number"]).unwrap_or_else(|| number.to_string()),
        valid: v["valid"].as_bool(),
        country: non_empty(&v["country_code"]),
        national_format: non_empty(&v["national_format"]),
        carrier: non_empty(&lti["carrier_name"]),
        line_type: LineType::from_carrier(reported.as_deref().unwrap_or("")),
        line_type_reported: reported,
    }
}

impl TwilioRest {
    /// Sends a text message; returns its `SM…` sid and first status.
    pub(crate) async fn send_message(&self, sms: &OutgoingSms) -> Result<SentSms, CarrierError> {
        let url = format!("{}/Messages.json", self.account_url());
        let v = self
            .post_form(&url, "the account's Messages resource", message_form(sms))
            .await?;
        let sid = non_empty(&v["sid"]).ok_or_else(|| CarrierError::Http {
            carrier: CARRIER,
            status: 201,
            message: "the created message resource has no `sid`".into(),
        })?;
        Ok(SentSms {
            carrier_message_id: sid,
            status: non_empty(&v["status"]).unwrap_or_else(|| "queued".into()),
        })
    }

    /// Looks `number` (E.164) up with Lookup v2's line type intelligence.
    pub(crate) async fn lookup(&self, number: &str) -> Result<NumberInfo, CarrierError> {
        let url = lookup_url(&self.lookup_base, number);
        let v = self
            .get_json(&url, &format!("the number {number} (Lookup v2)"))
            .await?;
        Ok(number_info(number, &v))
    }
}

/// `POST /twilio/sms`: a text message to one of our numbers.
pub(super) async fn webhook(
    me: Arc<TwilioCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let (account, params) = match signed_form(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let get = |k: &str| field_or_empty(&params, k);
    let sid = match get("MessageSid") {
        "" => get("SmsSid"),
        s => s,
    };
    if sid.is_empty() || get("From").is_empty() || get("To").is_empty() {
        warn!("twilio messaging webhook without MessageSid, From or To");
        return text(400, "missing MessageSid, From or To\n");
    }
    let sms = InboundSms {
        carrier: CarrierKind::Twilio,
        account: &account.name,
        carrier_message_id: sid,
        from: get("From"),
        to: get("To"),
        body: get("Body"),
    };
    // An empty TwiML document: no reply from Twilio itself.
    sms_answer(host.incoming_sms(sms).await, || {
        xml(r#"<?xml version="1.0" encoding="UTF-8"?><Response/>"#.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_answers_fold() {
        let v = serde_json::json!({
            "phone_number": "+14155550123", "valid": true, "country_code": "US",
            "national_format": "(415) 555-0123",
            "line_type_intelligence": {"carrier_name": "Verizon Wireless", "type": "nonFixedVoip"}
        });
        let info = number_info("+14155550123", &v);
        assert_eq!(info.line_type, LineType::Voip);
        assert_eq!(info.carrier.as_deref(), Some("Verizon Wireless"));
        assert_eq!(info.valid, Some(true));
        let empty = number_info("+1", &serde_json::json!({"valid": false}));
        assert_eq!((empty.number.as_str(), empty.valid), ("+1", Some(false)));
        assert_eq!(empty.line_type, LineType::Unknown);
        assert_eq!(
            lookup_url("https://lookups.twilio.com/", "+14155550123"),
            "https://lookups.twilio.com/v2/PhoneNumbers/+14155550123?Fields=line_type_intelligence"
        );
    }
}
