//! Telnyx's Messaging API (`POST /v2/messages`, JSON in the SDK's key order and compact bytes)
//! and Number Lookup (`GET /v2/number_lookup/{+E.164}?type=carrier`), with Telnyx's error
//! shape `{"errors": [{"code", "title", "detail"}]}`: 40310 a `to` that is no number, 40305 a
//! `from` that is not one of the account's messaging numbers, 40300 no `text` for an SMS,
//! 40006 a body over 1,600 characters.

use hyper::Response;
use serde_json::json;

use super::{SentSms, SmsLedger, SmsRequest, is_e164, sdk_body};
use crate::http::{Body, Recorder, json as json_resp};

/// The fields `messages.send` may send, in the SDK's order.
const ORDER: &[&str] = &[
    "to",
    "auto_detect",
    "encoding",
    "from",
    "media_urls",
    "messaging_profile_id",
    "send_at",
    "subject",
    "text",
    "type",
    "use_profile_webhooks",
    "webhook_failover_url",
    "webhook_url",
];

fn error(status: u16, code: &str, title: &str) -> Response<Body> {
    json_resp(
        status,
        &json!({"errors": [{"code": code, "title": title, "detail": title}]}),
    )
}

/// Answers a messaging or lookup request; `None` for other paths.
pub fn handle(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>) -> Option<Response<Body>> {
    if req.path == "/v2/messages" {
        return Some(send(ledger, req));
    }
    let number = req.path.strip_prefix("/v2/number_lookup/")?;
    Some(lookup(ledger, req, number))
}

fn send(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>) -> Response<Body> {
    let refuse = |status: u16, code: &str, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, code, why)
    };
    if req.method != "POST" {
        return refuse(405, "10005", "Method not allowed");
    }
    if req.content_type() != "application/json" {
        return refuse(415, "10015", "Content-Type must be application/json");
    }
    let (fields, expected) = match sdk_body(req.body, ORDER, false) {
        Ok(x) => x,
        Err(why) => return refuse(400, "10015", &format!("Bad request: {why}")),
    };
    if expected.as_bytes() != req.body {
        return refuse(
            400,
            "10015",
            "Bad request: the body is not what the SDK sends (key order or encoding differs)",
        );
    }
    let s = |k: &str| fields.get(k).and_then(|v| v.as_str()).unwrap_or("");
    let (to, from, text) = (s("to"), s("from"), s("text"));
    if !is_e164(to) {
        return refuse(400, "40310", "Invalid 'to' address");
    }
    if !ledger.snapshot().is_sender(from) || !from.starts_with('+') {
        return refuse(
            400,
            "40305",
            "Invalid 'from' address: not a messaging number of this account",
        );
    }
    if text.is_empty() {
        return refuse(400, "40300", "'text' is required for an SMS");
    }
    if text.chars().count() > 1600 {
        return refuse(400, "40006", "The message text is too long");
    }
    let id = crate::stream::new_uuid();
    ledger.modify(|l| {
        l.sent.push(SentSms {
            id: id.clone(),
            from: from.to_string(),
            to: to.to_string(),
            body: text.to_string(),
            raw: String::from_utf8_lossy(req.body).into_owned(),
        })
    });
    json_resp(
        200,
        &json!({"data": {"record_type": "message", "id": id, "direction": "outbound",
                "type": "SMS", "from": {"phone_number": from, "carrier": "TELNYX LLC",
                "line_type": "VoIP"}, "to": [{"phone_number": to, "status": "queued"}],
                "text": text, "parts": 1, "encoding": "GSM-7"}}),
    )
}

fn lookup(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>, number: &str) -> Response<Body> {
    let refuse = |status: u16, code: &str, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, code, why)
    };
    if req.method != "GET" {
        return refuse(405, "10005", "Method not allowed");
    }
    if !number.starts_with('+') || number.contains('%') {
        return refuse(
            404,
            "10005",
            "the number is not in the path as the SDK writes it",
        );
    }
    if req.query != "type=carrier" {
        return refuse(400, "10015", "type must be carrier (as patterd asks)");
    }
    let line = ledger.snapshot().line(number);
    ledger.modify(|l| l.lookups.push(number.to_string()));
    let kind = match line.kind {
        "landline" => "fixed line",
        "toll_free" => "toll free",
        other => other,
    };
    json_resp(
        200,
        &json!({"data": {"record_type": "number_lookup", "phone_number": number,
                "valid_number": line.valid,
                "country_code": if line.valid { json!("US") } else { json!(null) },
                "national_format": null, "fraud": null,
                "carrier": {"name": line.carrier.to_uppercase(), "type": kind,
                            "normalized_carrier": line.carrier, "error_code": null,
                            "mobile_country_code": "310", "mobile_network_code": "410"}}}),
    )
}
