//! Plivo's Message API (`POST /v1/Account/{auth_id}/Message/`, JSON in the SDK's key order and
//! Python `json.dumps` bytes) and Lookup API (`GET /v1/Number/{+E.164}?type=carrier`, 404 with
//! `error_code` 20404 for an invalid number), with Plivo's `{"api_id", "error"}` refusals: a
//! `dst` or `src` that is no number, a `src` that is not one of the account's numbers, `src`
//! equal to `dst`, no `text`, a type other than `sms`.

use hyper::Response;
use serde_json::json;

use super::{SentSms, SmsLedger, SmsRequest, is_e164, sdk_body};
use crate::http::{Body, Recorder, json as json_resp};
use crate::stream::new_uuid;

/// The fields `messages.create` may send, in the SDK's order.
const ORDER: &[&str] = &[
    "dst",
    "text",
    "src",
    "type",
    "url",
    "method",
    "log",
    "trackable",
    "powerpack_uuid",
    "media_urls",
    "media_ids",
    "message_expiry",
];

fn error(status: u16, message: &str) -> Response<Body> {
    json_resp(status, &json!({"api_id": new_uuid(), "error": message}))
}

/// Answers a messaging or lookup request of account `auth_id`; `None` for other paths.
pub fn handle(
    ledger: &Recorder<SmsLedger>,
    req: &SmsRequest<'_>,
    auth_id: &str,
) -> Option<Response<Body>> {
    if req.path == format!("/v1/Account/{auth_id}/Message/") {
        return Some(send(ledger, req));
    }
    let number = req.path.strip_prefix("/v1/Number/")?;
    Some(lookup(ledger, req, number))
}

fn send(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>) -> Response<Body> {
    let refuse = |status: u16, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, why)
    };
    if req.method != "POST" {
        return refuse(405, "method not allowed");
    }
    if req.content_type() != "application/json" {
        return refuse(415, "Content-Type must be application/json");
    }
    let (fields, expected) = match sdk_body(req.body, ORDER, true) {
        Ok(x) => x,
        Err(why) => return refuse(400, &why),
    };
    if expected.as_bytes() != req.body {
        return refuse(
            400,
            "the body is not what the SDK sends (key order or encoding differs)",
        );
    }
    let s = |k: &str| fields.get(k).and_then(|v| v.as_str()).unwrap_or("");
    let number = |n: &str| is_e164(&format!("+{}", n.trim_start_matches('+')));
    let (dst, src, text) = (s("dst"), s("src"), s("text"));
    if !number(dst) {
        return refuse(400, "dst is not a valid phone number");
    }
    if !number(src) || !ledger.snapshot().is_sender(src) {
        return refuse(400, "src is not a number of this account");
    }
    if dst.trim_start_matches('+') == src.trim_start_matches('+') {
        return refuse(400, "destination number cannot be same as source number");
    }
    if text.is_empty() {
        return refuse(400, "text is required");
    }
    if text.chars().count() > 1600 {
        return refuse(400, "text is longer than 1600 characters");
    }
    if s("type") != "sms" {
        return refuse(400, "type must be sms");
    }
    let id = new_uuid();
    ledger.modify(|l| {
        l.sent.push(SentSms {
            id: id.clone(),
            from: src.to_string(),
            to: dst.to_string(),
            body: text.to_string(),
            raw: String::from_utf8_lossy(req.body).into_owned(),
        })
    });
    json_resp(
        202,
        &json!({"api_id": new_uuid(), "message": "message(s) queued", "message_uuid": [id]}),
    )
}

fn lookup(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>, number: &str) -> Response<Body> {
    let refuse = |status: u16, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, why)
    };
    if req.method != "GET" {
        return refuse(405, "method not allowed");
    }
    if !number.starts_with('+') || number.contains('%') || number.contains('/') {
        return refuse(404, "the number is not in the path as the SDK writes it");
    }
    if req.query != "type=carrier" {
        return refuse(400, "type must be carrier");
    }
    let line = ledger.snapshot().line(number);
    ledger.modify(|l| l.lookups.push(number.to_string()));
    if !line.valid {
        return json_resp(
            404,
            &json!({"api_id": new_uuid(), "error_code": 20404,
                    "message": "Phone number is invalid"}),
        );
    }
    let kind = match line.kind {
        "landline" => "fixed",
        "toll_free" => "toll-free",
        other => other,
    };
    json_resp(
        200,
        &json!({"api_id": new_uuid(), "phone_number": number,
                "country": {"name": "United States", "iso2": "US", "iso3": "USA"},
                "format": {"e164": number, "national": "(555) 000-0000",
                           "international": number, "rfc3966": format!("tel:{number}")},
                "carrier": {"mobile_country_code": "310", "mobile_network_code": "150",
                            "name": line.carrier, "type": kind, "ported": "no"},
                "resource_uri": format!("/v1/Number/{number}?type=carrier")}),
    )
}
