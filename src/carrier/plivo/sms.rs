//! Plivo's text messages and number lookups: sending is `POST
//! /v1/Account/{auth_id}/Message/` with the SDK's JSON, key order and bytes (Python's
//! `json.dumps`: `", "`, `": "`, non-ASCII as `\uXXXX`; numbers as digits, as Plivo writes
//! them) ([`message_body`]); a lookup is `GET {lookup_base}/v1/Number/{E.164}?type=carrier`,
//! where a 404 means Plivo found the number invalid. Inbound messages arrive on the
//! application's `message_url`, `POST /plivo/message`, which Plivo signs with V2 only: the
//! route takes a V3 signature when there is one and otherwise V2 with a single-use nonce
//! ([`super::signature::validate_v2`]), and answers an empty `<Response/>`.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::Value;
use tracing::warn;

use super::PlivoRest;
use super::routes::{PlivoCarrier, verified};
use super::signature::{NONCE_MAX_LEN, NONCE_V2_HEADER, NONCE_WINDOW, validate_v2};
use crate::carrier::account::Account;
use crate::carrier::messaging::{
    InboundSms, JsonStyle, JsonValue, LineType, NumberInfo, OutgoingSms, SentSms, ordered_json,
};
use crate::carrier::port::{Arrived, Counter, Host};
use crate::carrier::rest_client::send_error;
use crate::carrier::webhook::{arrive, field, header, sms_answer};
use crate::carrier::{CarrierError, CarrierKind, public_request_url};
use crate::net::http::{Body, empty, text, xml};
use crate::security::mask_number;

const CARRIER: &str = "Plivo";
/// Plivo's public Lookup API root.
pub(crate) const DEFAULT_LOOKUP_BASE: &str = "https://lookup.plivo.com";
/// The replay guard's scope of V2 nonces (messaging webhooks).
pub(crate) const NONCE_V2_SCOPE: &str = "plivo_nonce_v2";

/// The body of `POST Message/`, byte for byte what the SDK's `messages.create(src, dst,
/// text)` sends (its defaults `type`, `method`, `log`, `trackable` included).
pub fn message_body(sms: &OutgoingSms) -> String {
    ordered_json(
        &[
            ("dst", JsonValue::Str(sms.to.trim_start_matches('+'))),
            ("text", JsonValue::Str(&sms.body)),
            ("src", JsonValue::Str(sms.from.trim_start_matches('+'))),
            ("type", JsonValue::Str("sms")),
            ("method", JsonValue::Str("POST")),
            ("log", JsonValue::Str("true")),
            ("trackable", JsonValue::Bool(false)),
        ],
        JsonStyle::Python,
    )
}

/// The lookup URL for `number` (E.164, checked by the caller).
pub fn lookup_url(lookup_base: &str, number: &str) -> String {
    format!(
        "{}/v1/Number/{number}?type=carrier",
        lookup_base.trim_end_matches('/')
    )
}

fn non_empty(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A lookup answer as [`NumberInfo`].
pub fn number_info(number: &str, v: &Value) -> NumberInfo {
    let carrier = &v["carrier"];
    let reported = non_empty(&carrier["type"]);
    NumberInfo {
        number: non_empty(&v["phone_number"]).unwrap_or_else(|| number.to_string()),
        valid: Some(true),
        country: non_empty(&v["country"]["iso2"]),
        national_format: non_empty(&v["format"]["national"]),
        carrier: non_empty(&carrier["name"]),
        line_type: LineType::from_carrier(reported.as_deref().unwrap_or("")),
        line_type_reported: reported,
    }
}

/// The error message in a Plivo answer (`error`, or the lookup's `message`).
fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| non_empty(&v["error"]).or_else(|| non_empty(&v["message"])))
        .unwrap_or_else(|| text.chars().take(200).collect())
}

impl PlivoRest {
    async fn messaging_request(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(u16, String), CarrierError> {
        let resp = req
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        match status {
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            _ => Ok((status, text)),
        }
    }

    /// Sends a text message; returns its `message_uuid`.
    pub(crate) async fn send_message(&self, sms: &OutgoingSms) -> Result<SentSms, CarrierError> {
        let url = format!("{}/v1/Account/{}/Message/", self.base, self.auth_id);
        let req = self.client.post(&url).body(message_body(sms));
        let (status, text) = self.messaging_request(req, &url).await?;
        if !(200..=299).contains(&status) {
            return Err(CarrierError::Http {
                carrier: CARRIER,
                status,
                message: error_message(&text),
            });
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        let id = non_empty(&v["message_uuid"][0])
            .or_else(|| non_empty(&v["message_uuid"]))
            .ok_or_else(|| CarrierError::Http {
                carrier: CARRIER,
                status,
                message: "the answer has no message_uuid".into(),
            })?;
        Ok(SentSms {
            carrier_message_id: id,
            status: "queued".into(),
        })
    }

    /// Looks `number` (E.164) up: the carrier lookup; an invalid number (404) is a valid
    /// answer saying so.
    pub(crate) async fn lookup(&self, number: &str) -> Result<NumberInfo, CarrierError> {
        let url = lookup_url(&self.lookup_base, number);
        let (status, text) = self.messaging_request(self.client.get(&url), &url).await?;
        match status {
            200..=299 => {
                let v: Value = serde_json::from_str(&text).unwrap_or_default();
                Ok(number_info(number, &v))
            }
            404 => Ok(NumberInfo {
                number: number.to_string(),
                valid: Some(false),
                country: None,
                national_format: None,
                carrier: None,
                line_type: LineType::Unknown,
                line_type_reported: None,
            }),
            _ => Err(CarrierError::Http {
                carrier: CARRIER,
                status,
                message: error_message(&text),
            }),
        }
    }
}

/// Authenticates a messaging webhook signed with V2 (URL + nonce, the nonce single use
/// cluster-wide); the fields are the form for POST, the query for GET.
async fn verified_v2<'a>(
    me: &'a PlivoCarrier,
    host: &dyn Host,
    parts: &mut Arrived,
) -> Result<(&'a Account<PlivoRest>, Vec<(String, String)>), Response<Body>> {
    let urls: Vec<String> = host
        .signature_bases()
        .into_iter()
        .map(|base| public_request_url(base, parts.uri.path(), parts.uri.query()))
        .collect();
    let account = me.accounts.verifying(|auth_token| {
        urls.iter()
            .any(|url| validate_v2(auth_token, url, |name| header(&parts.headers, name)))
    });
    let fields: Vec<(String, String)> = if parts.method == Method::POST {
        form_urlencoded::parse(&parts.body).into_owned().collect()
    } else {
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect()
    };
    let Some(account) = account else {
        host.count(Counter::WebhookForbidden);
        warn!(
            from = %mask_number(field(&fields, "From").unwrap_or("")),
            to = %mask_number(field(&fields, "To").unwrap_or("")),
            "plivo messaging webhook refused: bad or missing X-Plivo-Signature-V2 (check \
             auth_token and server.public_url)"
        );
        return Err(empty(403));
    };
    let nonce = header(&parts.headers, NONCE_V2_HEADER).unwrap_or_default();
    if nonce.len() > NONCE_MAX_LEN {
        host.count(Counter::WebhookForbidden);
        return Err(empty(403));
    }
    match host.first_seen(NONCE_V2_SCOPE, &nonce, NONCE_WINDOW).await {
        Ok(true) => {
            parts.seen = Some((NONCE_V2_SCOPE, nonce));
            Ok((account, fields))
        }
        Ok(false) => {
            host.count(Counter::WebhookForbidden);
            warn!(
                "plivo messaging webhook refused: its X-Plivo-Signature-V2-Nonce was already \
                 used (a replayed request)"
            );
            Err(empty(403))
        }
        Err(e) => {
            warn!(error = %e, "plivo messaging webhook refused for now: its nonce cannot be checked");
            Err(text(503, "the replay guard is unavailable; try again\n"))
        }
    }
}

/// `POST /plivo/message`: a text message to one of our numbers.
pub(super) async fn webhook(
    me: Arc<PlivoCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let mut arrived = match arrive(req, host.max_body_bytes()).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let signed_v3 = header(&arrived.headers, "X-Plivo-Signature-V3").is_some()
        || header(&arrived.headers, "X-Plivo-Signature-Ma-V3").is_some();
    let checked = if signed_v3 {
        verified(&me, host.as_ref(), &mut arrived).await
    } else {
        verified_v2(&me, host.as_ref(), &mut arrived).await
    };
    let (account, fields) = match checked {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (Some(id), Some(from), Some(to)) = (
        field(&fields, "MessageUUID"),
        field(&fields, "From"),
        field(&fields, "To"),
    ) else {
        warn!("plivo message webhook without MessageUUID, From or To");
        return text(400, "missing MessageUUID, From or To\n");
    };
    let sms = InboundSms {
        carrier: CarrierKind::Plivo,
        account: &account.name,
        carrier_message_id: id,
        from,
        to,
        body: field(&fields, "Text").unwrap_or(""),
    };
    sms_answer(host.incoming_sms(sms).await, || {
        xml(r#"<?xml version="1.0" encoding="UTF-8"?><Response/>"#.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_fold() {
        let v = serde_json::json!({"phone_number": "+16172252821",
            "country": {"name": "United States", "iso2": "US", "iso3": "USA"},
            "format": {"e164": "+16172252821", "national": "(617) 225-2821"},
            "carrier": {"name": "Cellco", "type": "fixed", "ported": "no"}});
        let info = number_info("+16172252821", &v);
        assert_eq!(info.line_type, LineType::Landline);
        assert_eq!(info.country.as_deref(), Some("US"));
        assert_eq!(info.national_format.as_deref(), Some("(617) 225-2821"));
        assert_eq!(
            lookup_url("https://lookup.plivo.com/", "+16172252821"),
            "https://lookup.plivo.com/v1/Number/+16172252821?type=carrier"
        );
    }
}
