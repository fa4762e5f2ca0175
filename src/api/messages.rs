//! Text messages and number lookups on the control surface: `POST /v1/messages` (send one,
//! `{to, body, from?}`; the checks, the allow-list and `[outbound] max_sms_per_day` are
//! `app::messaging`'s and run before any carrier is contacted), `GET /v1/messages` (the stored
//! messages, newest first, filtered by `number`, `direction`, `since`) and `GET
//! /v1/numbers/{e164}/lookup` (the carrier's lookup: validity, country, operator, line type;
//! `?account=` picks the `[carriers.NAME]` account). MCP's `send_sms` and `lookup_number` are
//! these routes.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ErrorCode};
use crate::app::App;
use crate::app::messaging::{self, SendRequest, Sender, SmsError};
use crate::store::MessageFilter;

/// The body of `POST /v1/messages`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSms {
    to: String,
    body: String,
    /// One of our `[[numbers]]`; default: the first whose `allowed_destinations` admit `to`.
    #[serde(default)]
    from: Option<String>,
}

/// `POST /v1/messages`.
pub(crate) async fn send(app: &Arc<App>, body: Value) -> Result<Value, ApiError> {
    let req: NewSms = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; expected {{\"to\": \"+15551234567\", \"body\": \"text\", \"from\"?}}"
        ))
    })?;
    let sent = messaging::send(
        app,
        SendRequest {
            to: req.to,
            body: req.body,
            sender: Sender::Api { from: req.from },
        },
    )
    .await
    .map_err(sms_error)?;
    Ok(sent)
}

/// `GET /v1/messages`.
pub(crate) async fn list(
    app: &Arc<App>,
    param: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Value, ApiError> {
    let limit = match param("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=1000).contains(l))
            .ok_or_else(|| ApiError::bad_request("limit must be a number from 1 to 1000"))?,
        None => 50,
    };
    let direction = param("direction");
    if direction
        .as_deref()
        .is_some_and(|d| d != "inbound" && d != "outbound")
    {
        return Err(ApiError::bad_request(
            "direction must be `inbound` or `outbound`",
        ));
    }
    let number = match param("number") {
        Some(n) => Some(crate::util::phone::normalize_e164(&n).ok_or_else(|| {
            ApiError::bad_request(format!(
                "number {n:?} is not a phone number; use E.164, e.g. +15551234567"
            ))
        })?),
        None => None,
    };
    let since_ms = match param("since") {
        Some(s) => Some(super::parse_since(&s, crate::store::now_ms()).ok_or_else(|| {
            ApiError::bad_request(
                "since must be milliseconds since the Unix epoch or a look-back like 15m, 2h, 7d",
            )
        })?),
        None => None,
    };
    let messages = app
        .store
        .messages(MessageFilter {
            number,
            pair: None,
            direction,
            since_ms,
            limit,
        })
        .await?;
    Ok(json!({"messages": messages}))
}

/// `GET /v1/numbers/{e164}/lookup`.
pub(crate) async fn lookup(
    app: &Arc<App>,
    number: &str,
    account: Option<String>,
) -> Result<Value, ApiError> {
    let (info, account) = messaging::lookup(app, number, account.as_deref())
        .await
        .map_err(sms_error)?;
    let mut v = json!(info);
    v["carrier_account"] = json!(account);
    Ok(v)
}

/// The API error of a refused or failed message or lookup.
fn sms_error(e: SmsError) -> ApiError {
    let (status, code) = match &e {
        SmsError::InvalidNumber(_) => (400, ErrorCode::InvalidNumber),
        SmsError::EmptyBody => (400, ErrorCode::InvalidRequest),
        SmsError::TooLong { .. } => (400, ErrorCode::BodyTooLong),
        SmsError::UnknownFrom(_) => (400, ErrorCode::UnknownNumber),
        SmsError::Disabled(_) | SmsError::NoNumber(_) => (403, ErrorCode::OutboundDisabled),
        SmsError::NotAllowed { .. } => (403, ErrorCode::DestinationNotAllowed),
        SmsError::NoCarrier(_) => (503, ErrorCode::CarrierUnconfigured),
        SmsError::Unsupported(_) => (422, ErrorCode::MessagingUnsupported),
        SmsError::Daily { .. } => (429, ErrorCode::SmsDailyLimit),
        SmsError::Unavailable(_) => (503, ErrorCode::CapsUnavailable),
        SmsError::Store(_) => (500, ErrorCode::StoreError),
        SmsError::Carrier(_) => (502, ErrorCode::CarrierError),
    };
    match e {
        SmsError::Store(s) => ApiError::from(s),
        e => ApiError::new(status, code, e.to_string()),
    }
}
