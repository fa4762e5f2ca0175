//! Vonage's routes and its [`Carrier`] implementation: `GET|POST /vonage/answer` (signed
//! answer webhook with `to`, `from`, `uuid`, `conversation_uuid` → admission → an NCCO whose
//! `connect` action opens `wss://…/vonage/media/{uuid}?t=<token>`, or an empty NCCO, which
//! ends the call, for a refusal), `POST /vonage/event` (signed call events: `completed` ends
//! the call; `busy`, `timeout`, `unanswered`, `rejected`, `failed` and `cancelled` before an
//! answer give a call we placed its outcome) and `WS /vonage/media/{uuid}` (the media socket,
//! handed to the carrier-neutral pump). Every webhook must carry a valid signature JWT
//! ([`super::signature`]); anything else is 403.
//!
//! Calls we placed are known by the `uuid` Vonage answered `POST /v1/calls` with, which is also
//! the leg's id on the answer webhook and the media socket.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::Value;
use tracing::{info, warn};

use super::rest::CreateCall;
use super::signature::{self, Jtis};
use super::{Config, VonageCodec, VonageRest, ncco};
use crate::carrier::account::{Account, Accounts};
use crate::carrier::dial::{Outbound, CallOutcome, PlaceCall, PlaceError, StatusUpdate};
use crate::carrier::port::{Counter, Host, IncomingCall, MediaSocket, TokenSource};
use crate::carrier::registry::{BoxFuture, Route, RoutePath, account_methods, through_rest};
use crate::carrier::rest_client::path_safe;
use crate::carrier::webhook::{Answer, answer_outbound, field, header, unix_now};
use crate::carrier::{
    Carrier, CarrierError, CarrierKind, DtmfDelivery, TransferRequest, public_request_url,
    public_ws_url,
};
use crate::net::http::{Body, empty, json, read_body, text};
use crate::security::mask_number;

/// Every configured Vonage account.
pub(crate) struct VonageCarrier {
    accounts: Accounts<VonageRest>,
    /// `jti`s of webhook tokens that verified: each is good once.
    jtis: Jtis,
}

/// The Vonage carrier with its usable accounts.
pub fn build(configs: Vec<(String, Config)>) -> Arc<dyn Carrier> {
    Arc::new(VonageCarrier {
        accounts: Accounts::build(CarrierKind::Vonage, configs, |c| {
            Ok((c.signature_secret.expose().to_string(), VonageRest::from_config(c)?))
        }),
        jtis: Jtis::default(),
    })
}

impl Carrier for VonageCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Vonage
    }

    account_methods!();

    fn routes(self: Arc<Self>) -> Vec<Route> {
        vec![
            Route::to(&[Method::POST, Method::GET], RoutePath::Exact("/vonage/answer"), &self, answer),
            Route::to(&[Method::POST, Method::GET], RoutePath::Exact("/vonage/event"), &self, event),
            Route::to(&[Method::GET], RoutePath::Prefix("/vonage/media/"), &self, media),
        ]
    }

    fn hang_up(&self, account: &str, leg_id: &str) -> BoxFuture<Result<(), CarrierError>> {
        through_rest(self.accounts.rest(account), leg_id, |r, id| async move { r.hang_up(&id).await })
    }

    fn place_call(&self, account: &str, p: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        let rest = self.accounts.rest(account);
        let account = account.to_string();
        Box::pin(async move {
            let rest = rest.ok_or(PlaceError::Unconfigured {
                account,
                what: "application_id, private_key and signature_secret",
            })?;
            let url = |path: &str| public_request_url(&p.public_url, path, None);
            let create = CreateCall {
                from: p.from.clone(),
                to: p.to.clone(),
                answer_url: url("/vonage/answer"),
                event_url: url("/vonage/event"),
                ringing_timer: p.ring_timeout_s,
                length_timer: p.time_limit_s,
            };
            Ok(rest.create_call(&create).await?)
        })
    }

    fn cancel(&self, account: &str, call_id: &str, _: &Outbound) -> BoxFuture<Result<(), CarrierError>> {
        through_rest(self.accounts.rest(account), call_id, |r, id| async move { r.hang_up(&id).await })
    }

    fn transfer(
        &self,
        account: &str,
        leg_id: &str,
        request: &TransferRequest,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let rest = self.accounts.rest(account);
        let (uuid, to, caller_id) = (leg_id.to_string(), request.to.clone(), request.caller_id.clone());
        Box::pin(async move {
            match rest {
                Some(r) => r.transfer(&uuid, &to, &caller_id).await,
                None => Err(CarrierError::Config {
                    carrier: "Vonage",
                    message: "the call's account has no application_id / private_key".into(),
                }),
            }
        })
    }

    fn send_dtmf(
        &self,
        account: &str,
        leg_id: &str,
        digits: &str,
    ) -> BoxFuture<Result<DtmfDelivery, CarrierError>> {
        let rest = self.accounts.rest(account);
        let (uuid, digits) = (leg_id.to_string(), digits.to_string());
        Box::pin(async move {
            match rest {
                Some(r) => r.send_dtmf(&uuid, &digits).await.map(|()| DtmfDelivery::Sent),
                None => Ok(DtmfDelivery::InBand),
            }
        })
    }
}

/// A JSON body's fields as strings (numbers and booleans written out; objects left out).
fn json_fields(body: &[u8]) -> Vec<(String, String)> {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k, s)),
            Value::Number(n) => Some((k, n.to_string())),
            Value::Bool(b) => Some((k, b.to_string())),
            _ => None,
        })
        .collect()
}

/// Reads and authenticates a Vonage webhook; returns the account and the call's fields (the
/// JSON body for POST, the query for GET). `Err` is the response to send.
async fn signed<'a>(
    me: &'a VonageCarrier,
    host: &dyn Host,
    req: Request<Incoming>,
) -> Result<(&'a Account<VonageRest>, Vec<(String, String)>), Response<Body>> {
    let (parts, body) = req.into_parts();
    let body = read_body(body, host.max_body_bytes())
        .await
        .map_err(|e| e.response())?;
    let authorization = header(&parts.headers, "authorization");
    let now = unix_now();
    let mut why = signature::JwtError::Missing;
    let mut jti = None;
    let account = match signature::bearer(authorization.as_deref()) {
        Ok(token) => me.accounts.verifying(|secret| match signature::verify(secret, token, &body, now) {
            Ok(claims) => {
                jti = Some(claims.jti);
                true
            }
            Err(e) => {
                why = e;
                false
            }
        }),
        Err(e) => {
            why = e;
            None
        }
    };
    let fields = if parts.method == Method::POST {
        json_fields(&body)
    } else {
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect()
    };
    if let (Some(a), Some(j)) = (account, &jti) {
        if me.jtis.first_use(j) {
            return Ok((a, fields));
        }
        why = signature::JwtError::Replayed;
    }
    host.count(Counter::WebhookForbidden);
    let get = |k: &str| field(&fields, k).unwrap_or("");
    warn!(
        path = parts.uri.path(),
        call_id = get("uuid"),
        from = %mask_number(get("from")),
        to = %mask_number(get("to")),
        reason = %why,
        "vonage webhook refused: bad, missing or replayed signature JWT (check signature_secret)"
    );
    Err(empty(403))
}

/// The NCCO connecting leg `uuid` to our media socket with `token`.
fn connect(host: &dyn Host, uuid: &str, token: &str) -> Response<Body> {
    let uri = format!(
        "{}?t={token}",
        public_ws_url(host.callback_base(), &format!("/vonage/media/{uuid}"))
    );
    let headers = BTreeMap::from([("call_uuid".to_string(), uuid.to_string())]);
    json(200, &ncco::connect_websocket(&uri, &headers))
}

/// `GET|POST /vonage/answer`: a call to answer.
async fn answer(me: Arc<VonageCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let (account, fields) = match signed(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (Some(uuid), Some(to)) = (field(&fields, "uuid"), field(&fields, "to")) else {
        warn!("vonage answer webhook without uuid or to");
        return text(400, "missing uuid or to\n");
    };
    if !path_safe(uuid) {
        return text(400, "bad uuid\n");
    }
    if host.outbound().live(uuid).is_some() {
        return outbound_answer(host.as_ref(), uuid);
    }
    let inbound = IncomingCall {
        carrier: CarrierKind::Vonage,
        account: &account.name,
        call_id: uuid,
        from: field(&fields, "from").unwrap_or(""),
        to,
    };
    if host.admit(inbound).await.is_err() {
        // Vonage has no busy or reject answer: an empty NCCO ends the call.
        return json(200, &ncco::hang_up());
    }
    let token = host.mint_token(uuid);
    connect(host.as_ref(), uuid, &token)
}

/// The answer webhook of a call we placed (Vonage gives the same `uuid` as `POST /v1/calls`).
fn outbound_answer(host: &dyn Host, uuid: &str) -> Response<Body> {
    // patterd asks Vonage for no machine detection: whoever answers gets the stream.
    match answer_outbound(host, uuid, None, |_, _| None) {
        Answer::NotOurs | Answer::HangUp => json(200, &ncco::hang_up()),
        Answer::Connect(token) => {
            info!(call_id = uuid, "outbound call answered");
            connect(host, uuid, &token)
        }
    }
}

/// The outcome of a call we placed that ended with `status` before anyone answered.
fn unanswered_outcome(status: &str) -> Option<CallOutcome> {
    match status {
        "busy" => Some(CallOutcome::Busy),
        "timeout" | "unanswered" | "cancelled" => Some(CallOutcome::NoAnswer),
        "rejected" | "failed" => Some(CallOutcome::Failed),
        _ => None,
    }
}

/// `POST /vonage/event`: the call's progress.
async fn event(me: Arc<VonageCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let (_, fields) = match signed(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let uuid = field(&fields, "uuid").unwrap_or("");
    let status = field(&fields, "status").unwrap_or("");
    info!(call_id = uuid, status, "vonage call event");
    let ours = host.outbound().live(uuid).is_some();
    if ours && let Some(outcome) = unanswered_outcome(status) {
        host.report(StatusUpdate::unanswered(uuid, outcome));
        host.end_call(uuid, "carrier reported hangup");
    }
    if status == "completed" {
        if ours && let Some(d) = field(&fields, "duration").and_then(|d| d.parse().ok()) {
            host.report(StatusUpdate {
                call_id: uuid.to_string(),
                status: None,
                outcome: None,
                answered_by: None,
                carrier_duration_s: Some(d),
            });
        }
        host.end_call(uuid, "carrier reported hangup");
    }
    empty(204)
}

/// `WS /vonage/media/{uuid}?t=<token>`: Vonage's media socket.
async fn media(me: Arc<VonageCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let Some(uuid) = req
        .uri()
        .path()
        .strip_prefix("/vonage/media/")
        .filter(|c| path_safe(c))
        .map(str::to_string)
    else {
        return text(404, "not found\n");
    };
    let token = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "t")
        .map(|(_, v)| v.into_owned());
    host.accept_media(
        req,
        MediaSocket {
            carrier: me,
            codec: Box::new(VonageCodec::new(&uuid)),
            token: TokenSource::Url(token),
            subprotocol: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_webhook_fields_are_read_as_strings() {
        let f = json_fields(br#"{"uuid":"u1","to":"15550001111","duration":"12","size":3,"x":{}}"#);
        assert_eq!(field(&f, "uuid"), Some("u1"));
        assert_eq!(field(&f, "size"), Some("3"));
        assert_eq!(field(&f, "x"), None);
        assert!(json_fields(b"not json").is_empty());
        assert_eq!(unanswered_outcome("busy"), Some(CallOutcome::Busy));
        assert_eq!(unanswered_outcome("answered"), None);
    }
}
