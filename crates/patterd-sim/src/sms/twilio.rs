//! Twilio's Messages API (`POST /2010-04-01/Accounts/{sid}/Messages.json`, a form in the SDK's
//! field order and `urlencode` bytes) and Lookup v2 (`GET
//! /v2/PhoneNumbers/{+E.164}?Fields=line_type_intelligence`), with Twilio's error codes:
//! 21604 no `To`, 21211 a `To` that is no number, 21603 no `From`, 21606 a `From` that is not
//! the account's, 21602 no `Body`, 21617 a body over 1,600 characters, 21266 `To` = `From`.

use hyper::Response;
use serde_json::json;

use super::{SentSms, SmsLedger, SmsRequest, is_e164, python_urlencode};
use crate::http::Recorder;
use crate::http::{Body, json as json_resp};

/// The form fields `messages.create` may send, in the SDK's order (the ones patterd uses and
/// their neighbours).
const ORDER: &[&str] = &[
    "To",
    "StatusCallback",
    "ApplicationSid",
    "ValidityPeriod",
    "From",
    "MessagingServiceSid",
    "Body",
    "MediaUrl",
];

fn error(status: u16, code: u32, message: &str) -> Response<Body> {
    json_resp(
        status,
        &json!({"code": code, "message": message,
                "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
                "status": status}),
    )
}

/// Answers a messaging or lookup request of account `account_sid`; `None` for other paths.
pub fn handle(
    ledger: &Recorder<SmsLedger>,
    req: &SmsRequest<'_>,
    account_sid: &str,
) -> Option<Response<Body>> {
    let messages = format!("/2010-04-01/Accounts/{account_sid}/Messages.json");
    if req.path == messages {
        return Some(send(ledger, req));
    }
    let number = req.path.strip_prefix("/v2/PhoneNumbers/")?;
    Some(lookup(ledger, req, number))
}

fn send(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>) -> Response<Body> {
    let refuse = |status: u16, code: u32, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, code, why)
    };
    if req.method != "POST" {
        return refuse(405, 20004, "Method not allowed");
    }
    if req.content_type() != "application/x-www-form-urlencoded" {
        return refuse(
            415,
            20001,
            "Content-Type must be application/x-www-form-urlencoded",
        );
    }
    let form: Vec<(String, String)> = form_urlencoded::parse(req.body).into_owned().collect();
    if let Some((k, _)) = form.iter().find(|(k, _)| !ORDER.contains(&k.as_str())) {
        return refuse(400, 20001, &format!("Unknown parameter {k}"));
    }
    let mut ordered: Vec<(&str, &str)> = Vec::new();
    for key in ORDER {
        for (k, v) in form.iter().filter(|(k, _)| k == key) {
            ordered.push((k, v));
        }
    }
    if python_urlencode(&ordered).as_bytes() != req.body {
        return refuse(
            400,
            20001,
            "the form is not what the SDK sends (field order or encoding differs)",
        );
    }
    let get = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let Some(to) = get("To").filter(|t| !t.is_empty()) else {
        return refuse(400, 21604, "A 'To' phone number is required.");
    };
    if !is_e164(to) {
        return refuse(400, 21211, &format!("Invalid 'To' Phone Number: {to}"));
    }
    let Some(from) = get("From").filter(|t| !t.is_empty()) else {
        return refuse(400, 21603, "A 'From' phone number is required.");
    };
    if !ledger.snapshot().is_sender(from) {
        return refuse(
            400,
            21606,
            &format!(
                "The From phone number {from} is not a valid, SMS-capable inbound phone number \
                 or short code for your account."
            ),
        );
    }
    if to == from {
        return refuse(400, 21266, "'To' and 'From' number cannot be the same");
    }
    let Some(body) = get("Body").filter(|b| !b.is_empty()) else {
        return refuse(400, 21602, "Message body is required.");
    };
    if body.chars().count() > 1600 {
        return refuse(
            400,
            21617,
            "The concatenated message body exceeds the 1600 character limit.",
        );
    }
    let sid = crate::twilio::new_sid("SM");
    ledger.modify(|l| {
        l.sent.push(SentSms {
            id: sid.clone(),
            from: from.to_string(),
            to: to.to_string(),
            body: body.to_string(),
            raw: String::from_utf8_lossy(req.body).into_owned(),
        })
    });
    json_resp(
        201,
        &json!({"sid": sid, "status": "queued", "to": to, "from": from, "body": body,
                "direction": "outbound-api", "num_segments": "1", "api_version": "2010-04-01"}),
    )
}

fn lookup(ledger: &Recorder<SmsLedger>, req: &SmsRequest<'_>, number: &str) -> Response<Body> {
    let refuse = |status: u16, code: u32, why: &str| {
        ledger.modify(|l| l.refuse(req.method, req.path, status, why));
        error(status, code, why)
    };
    if req.method != "GET" {
        return refuse(405, 20004, "Method not allowed");
    }
    if !number.starts_with('+') || number.contains('%') {
        return refuse(
            404,
            20404,
            "the number is not in the path as the SDK writes it (+ then digits)",
        );
    }
    if req.query != "Fields=line_type_intelligence" {
        return refuse(
            400,
            60200,
            "Fields must be line_type_intelligence (as patterd asks)",
        );
    }
    let (line, _) = {
        let l = ledger.snapshot();
        (l.line(number), ())
    };
    ledger.modify(|l| l.lookups.push(number.to_string()));
    let kind = match line.kind {
        "landline" => "landline",
        "voip" => "nonFixedVoip",
        "toll_free" => "tollFree",
        other => other,
    };
    let lti = line.valid.then(|| {
        json!({"carrier_name": line.carrier, "type": kind, "mobile_country_code": "310",
               "mobile_network_code": "456", "error_code": null})
    });
    json_resp(
        200,
        &json!({"phone_number": number, "valid": line.valid,
                "validation_errors": if line.valid { json!([]) } else { json!(["TOO_SHORT"]) },
                "country_code": if line.valid { json!("US") } else { json!(null) },
                "calling_country_code": "1",
                "national_format": if line.valid { json!(format!("({})", &number[2..5])) } else { json!(null) },
                "line_type_intelligence": lti,
                "url": format!("https://lookups.twilio.com/v2/PhoneNumbers/{number}")}),
    )
}
