//! Plivo's routes and its [`Carrier`] implementation: `POST /plivo/answer` (signed answer
//! webhook → admission → Plivo XML with a bidirectional `<Stream>` to
//! `wss://…/plivo/media/{CallUUID}?t=<token>`, or Plivo's own refusal
//! `<Hangup reason="busy|rejected"/>`), `POST /plivo/hangup` (signed hangup callback) and
//! `WS /plivo/media/{call}` (the audio stream, selecting the `audio.drachtio.org` subprotocol
//! Plivo asks for, handed to the carrier-neutral pump). GET works for both webhooks too, with
//! the fields in the query. The wire details live in the sibling modules.
//!
//! Calls we placed (`Direction: outbound`) are known by the `request_uuid` Plivo answered `POST
//! Call/` with; the answer URL brings the `CallUUID`, recorded as the call's leg id so the media
//! stream, REST hang-ups and the hangup callback find the call. The answer is the same
//! `<Stream>` — also when synchronous machine detection says `Machine=true` and the call has a
//! voicemail message, which the call leaves itself after the greeting's beep — or `<Hangup/>`
//! for another machine. A hangup callback before the answer gives the outcome
//! from `HangupCause`: `USER_BUSY` → busy, `NO_ANSWER` → no_answer, `CALL_REJECTED` and
//! unreachable numbers → failed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tracing::{info, warn};

use super::rest::MakeCall;
use super::{self as pv, Config, PlivoCodec, PlivoRest};
use crate::carrier::account::{Account, Accounts};
use crate::carrier::dial::{CallOutcome, Machine, Outbound, PlaceCall, PlaceError, StatusUpdate};
use crate::carrier::port::{Arrived, Counter, Host, IncomingCall, MediaSocket, TokenSource};
use crate::carrier::registry::{BoxFuture, Route, RoutePath, account_methods};
use crate::carrier::rest_client::path_safe;
use crate::carrier::webhook::{
    Answer, answer_outbound, arrive, field, header, refused_or_handed,
};
use crate::carrier::messaging::{NumberInfo, OutgoingSms, SentSms};
use crate::carrier::{
    Carrier, CarrierError, CarrierKind, DtmfDelivery, TransferRequest, public_request_url,
    public_ws_url,
};
use crate::net::http::{Body, empty, text, xml};
use crate::security::mask_number;

/// Every configured Plivo account.
pub(crate) struct PlivoCarrier {
    pub(super) accounts: Accounts<PlivoRest>,
    /// Transfers asked for and not yet fetched by Plivo: `CallUUID` → (to, caller id).
    transfers: Mutex<HashMap<String, (String, String)>>,
}

/// The replay guard's scope of Plivo's V3 nonces ([`Host::first_seen`]).
pub(crate) const NONCE_SCOPE: &str = "plivo_nonce";

/// Most transfers waiting for Plivo's `aleg_url` request at once.
const MAX_PENDING_TRANSFERS: usize = 10_000;
/// How long a transfer's destination rings (`<Dial timeout>`; Plivo has no default).
pub(crate) const TRANSFER_RING_S: u32 = 30;

/// The Plivo carrier with its usable accounts.
pub fn build(configs: Vec<(String, Config)>) -> Arc<dyn Carrier> {
    Arc::new(PlivoCarrier {
        accounts: Accounts::build(CarrierKind::Plivo, configs, |c| {
            Ok((c.auth_token.expose().to_string(), PlivoRest::from_config(c)?))
        }),
        transfers: Mutex::new(HashMap::new()),
    })
}

impl PlivoCarrier {
    fn rest(&self, account: &str) -> Option<Arc<PlivoRest>> {
        self.accounts.get(account).map(|a| a.rest.clone())
    }
}

impl Carrier for PlivoCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Plivo
    }

    account_methods!();

    fn routes(self: Arc<Self>) -> Vec<Route> {
        let (a, b, t, m) = (self.clone(), self.clone(), self.clone(), self.clone());
        vec![
            Route::new(
                &[Method::POST, Method::GET],
                RoutePath::Exact("/plivo/message"),
                move |h, r| super::sms::webhook(m.clone(), h, r),
            ),
            Route::new(
                &[Method::POST, Method::GET],
                RoutePath::Exact("/plivo/transfer"),
                move |h, r| transfer_xml(t.clone(), h, r),
            ),
            Route::new(
                &[Method::POST, Method::GET],
                RoutePath::Exact("/plivo/answer"),
                move |h, r| answer(a.clone(), h, r),
            ),
            Route::new(
                &[Method::POST, Method::GET],
                RoutePath::Exact("/plivo/hangup"),
                move |h, r| hangup(b.clone(), h, r),
            ),
            Route::new(
                &[Method::GET],
                RoutePath::Prefix("/plivo/media/"),
                move |h, r| media(self.clone(), h, r),
            ),
        ]
    }

    fn hang_up(&self, account: &str, leg_id: &str) -> BoxFuture<Result<(), CarrierError>> {
        let rest = self.rest(account);
        let id = leg_id.to_string();
        Box::pin(async move {
            match rest {
                Some(r) => r.hang_up(&id).await,
                None => Ok(()),
            }
        })
    }

    fn place_call(&self, account: &str, p: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        let rest = self.rest(account);
        let account = account.to_string();
        Box::pin(async move {
            let rest = rest.ok_or(PlaceError::Unconfigured {
                account,
                what: "auth_id and auth_token",
            })?;
            let url = |path: &str| public_request_url(&p.public_url, path, None);
            let create = MakeCall {
                from: p.from.clone(),
                to: p.to.clone(),
                answer_url: url("/plivo/answer"),
                hangup_url: url("/plivo/hangup"),
                ring_timeout: p.ring_timeout_s,
                time_limit: p.time_limit_s,
                machine_detection: p.machine_detection,
            };
            Ok(rest.make_call(&create).await?)
        })
    }

    /// Cancels the request, or hangs up the call once the answer URL has named it.
    fn cancel(
        &self,
        account: &str,
        call_id: &str,
        outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let rest = self.rest(account);
        let leg = outbound.leg(call_id);
        let id = call_id.to_string();
        Box::pin(async move {
            match (rest, leg) {
                (Some(r), Some(uuid)) => r.hang_up(&uuid).await,
                (Some(r), None) => r.cancel_request(&id).await,
                (None, _) => Ok(()),
            }
        })
    }

    fn transfer(
        &self,
        account: &str,
        leg_id: &str,
        request: &TransferRequest,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let rest = self.rest(account);
        let uuid = leg_id.to_string();
        let aleg_url = public_request_url(&request.public_url, "/plivo/transfer", None);
        {
            let mut pending = self.transfers.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() >= MAX_PENDING_TRANSFERS {
                pending.clear();
            }
            pending.insert(uuid.clone(), (request.to.clone(), request.caller_id.clone()));
        }
        Box::pin(async move {
            match rest {
                Some(r) => r.transfer(&uuid, &aleg_url).await,
                None => Err(CarrierError::Config {
                    carrier: "Plivo",
                    message: "the call's account has no auth_id / auth_token".into(),
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
        let rest = self.rest(account);
        let uuid = leg_id.to_string();
        let digits = digits.to_string();
        Box::pin(async move {
            // Plivo documents only 0-9 * # for its DTMF API; A-D go in-band.
            let rest_ok = digits.chars().all(|c| c.is_ascii_digit() || c == '*' || c == '#');
            match rest {
                Some(r) if rest_ok => r.send_dtmf(&uuid, &digits).await.map(|()| DtmfDelivery::Sent),
                _ => Ok(DtmfDelivery::InBand),
            }
        })
    }

    fn call_id_for_leg(&self, outbound: &Outbound, leg_id: &str) -> Option<String> {
        outbound.call_id_for_leg(leg_id)
    }

    fn send_sms(&self, account: &str, sms: &OutgoingSms) -> BoxFuture<Result<SentSms, CarrierError>> {
        let rest = self.rest(account);
        let sms = sms.clone();
        Box::pin(async move { unconfigured(rest)?.send_message(&sms).await })
    }

    fn lookup_number(
        &self,
        account: &str,
        number: &str,
    ) -> BoxFuture<Result<NumberInfo, CarrierError>> {
        let rest = self.rest(account);
        let number = number.to_string();
        Box::pin(async move { unconfigured(rest)?.lookup(&number).await })
    }
}

/// The account's REST client, or the error saying it has no credentials.
fn unconfigured(rest: Option<Arc<PlivoRest>>) -> Result<Arc<PlivoRest>, CarrierError> {
    rest.ok_or_else(|| CarrierError::Config {
        carrier: "Plivo",
        message: "the account has no auth_id / auth_token".into(),
    })
}

/// Reads and authenticates a Plivo webhook; returns the account and the call's fields (the
/// form for POST, the query for GET). `Err` is the response to send.
async fn signed<'a>(
    me: &'a PlivoCarrier,
    host: &dyn Host,
    req: Request<Incoming>,
) -> Result<(&'a Account<PlivoRest>, Vec<(String, String)>), Response<Body>> {
    let mut arrived = arrive(req, host.max_body_bytes()).await?;
    verified(me, host, &mut arrived).await
}

/// Authenticates a Plivo webhook that has arrived ([`signed`]); the nonce it records is kept
/// in `parts.seen` (released if the webhook is handed to a peer).
pub(super) async fn verified<'a>(
    me: &'a PlivoCarrier,
    host: &dyn Host,
    parts: &mut Arrived,
) -> Result<(&'a Account<PlivoRest>, Vec<(String, String)>), Response<Body>> {
    let post = parts.method == Method::POST;
    let form: Vec<(String, String)> = if post {
        form_urlencoded::parse(&parts.body).into_owned().collect()
    } else {
        Vec::new()
    };
    // Plivo signed the URL it requested: under the shared `public_url` (an application's
    // answer URL) or under this instance's own base (the per-call URLs we handed it).
    let urls: Vec<String> = host
        .signature_bases()
        .into_iter()
        .map(|base| public_request_url(base, parts.uri.path(), parts.uri.query()))
        .collect();
    let method = parts.method.as_str();
    let account = me.accounts.verifying(|auth_token| {
        urls.iter().any(|url| {
            pv::validate_request(auth_token, method, url, &form, |name| {
                header(&parts.headers, name)
            })
        })
    });
    let fields = if post {
        form
    } else {
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect()
    };
    let nonce = header(&parts.headers, pv::signature::NONCE_HEADER).unwrap_or_default();
    // A signature is good once, cluster-wide: the nonce goes through the daemon's replay guard.
    let fresh = match account {
        Some(_) if nonce.is_empty() || nonce.len() > pv::signature::NONCE_MAX_LEN => Ok(false),
        Some(_) => {
            host.first_seen(NONCE_SCOPE, &nonce, pv::signature::NONCE_WINDOW)
                .await
        }
        None => Ok(false),
    };
    match account {
        Some(_) if fresh.is_err() => {
            warn!(
                path = parts.uri.path(),
                error = %fresh.err().map(|e| e.to_string()).unwrap_or_default(),
                "plivo webhook refused for now: its nonce cannot be checked (Plivo retries)"
            );
            Err(text(503, "the replay guard is unavailable; try again\n"))
        }
        Some(a) if fresh == Ok(true) => {
            parts.seen = Some((NONCE_SCOPE, nonce));
            Ok((a, fields))
        }
        Some(_) => {
            host.count(Counter::WebhookForbidden);
            warn!(
                path = parts.uri.path(),
                "plivo webhook refused: its X-Plivo-Signature-V3-Nonce was already used (a \
                 replayed request; nothing to do unless Plivo itself retried with the same nonce)"
            );
            Err(empty(403))
        }
        None => {
            host.count(Counter::WebhookForbidden);
            let get = |k: &str| field(&fields, k).unwrap_or("");
            warn!(
                path = parts.uri.path(),
                call_id = get("CallUUID"),
                from = %mask_number(get("From")),
                to = %mask_number(get("To")),
                "plivo webhook refused: bad or missing X-Plivo-Signature-V3 (check auth_token and server.public_url)"
            );
            Err(empty(403))
        }
    }
}

/// `POST /plivo/transfer`: Plivo fetching the XML of a transfer we asked for (signed like the
/// answer webhook): the `<Dial>` to the destination kept for this `CallUUID`.
async fn transfer_xml(
    me: Arc<PlivoCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let (_, fields) = match signed(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let uuid = field(&fields, "CallUUID").unwrap_or("");
    let pending = me
        .transfers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(uuid);
    match pending {
        Some((to, caller_id)) => {
            info!(to = %mask_number(&to), "plivo fetched the transfer's <Dial>");
            xml(pv::dial_xml(&to, &caller_id, TRANSFER_RING_S))
        }
        None => {
            warn!("plivo asked for a transfer this daemon did not start; hanging up");
            xml(pv::hangup_xml(None))
        }
    }
}

/// The `<Stream>` answer for the leg `call_uuid` with `token`.
fn stream(host: &dyn Host, call_uuid: &str, token: &str) -> Response<Body> {
    let url = format!(
        "{}?t={token}",
        public_ws_url(host.callback_base(), &format!("/plivo/media/{call_uuid}"))
    );
    xml(pv::stream_xml(&url, pv::CONTENT_TYPE))
}

/// `POST /plivo/answer`: a call to answer.
async fn answer(me: Arc<PlivoCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let mut arrived = match arrive(req, host.max_body_bytes()).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (account, fields) = match verified(&me, host.as_ref(), &mut arrived).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (Some(call_id), Some(to)) = (field(&fields, "CallUUID"), field(&fields, "To")) else {
        warn!("plivo answer webhook without CallUUID or To");
        return text(400, "missing CallUUID or To\n");
    };
    if !path_safe(call_id) {
        return text(400, "bad CallUUID\n");
    }
    let from = field(&fields, "From").unwrap_or("");
    if field(&fields, "Direction").is_some_and(|d| d.starts_with("outbound")) {
        return outbound_answer(host.as_ref(), call_id, &fields);
    }
    let inbound = IncomingCall {
        carrier: CarrierKind::Plivo,
        account: &account.name,
        call_id,
        from,
        to,
    };
    match host.admit(inbound).await {
        Ok(_) => {}
        Err(r) if r.is_busy() => {
            let busy = xml(pv::hangup_xml(Some("busy")));
            return refused_or_handed(host.as_ref(), r, arrived, busy).await;
        }
        Err(r) if r.is_rejection() => return xml(pv::hangup_xml(Some("rejected"))),
        Err(_) => return xml(pv::hangup_xml(None)),
    }
    let token = host.mint_token(call_id);
    stream(host.as_ref(), call_id, &token)
}

/// The answer URL of a call we placed: a person gets the stream (the media path keys the call
/// by its `request_uuid`, the stream URL names the `CallUUID`); so does a machine (with
/// synchronous machine detection, `Machine=true`) when the call has a voicemail message, which
/// the call leaves after the greeting's beep in the agent's voice; another machine gets
/// `<Hangup/>`.
fn outbound_answer(host: &dyn Host, call_uuid: &str, fields: &[(String, String)]) -> Response<Body> {
    let request_uuid = field(fields, "RequestUUID")
        .or_else(|| field(fields, "ALegRequestUUID"))
        .unwrap_or("");
    if host.outbound().live(request_uuid).is_some() {
        host.outbound().set_leg(request_uuid, call_uuid);
        // Stored too, so a peer can hang the leg up should this instance be lost.
        host.record_leg(request_uuid, call_uuid);
    }
    let machine = field(fields, "Machine")
        .is_some_and(|m| m.eq_ignore_ascii_case("true"))
        .then_some(Machine::Greeting);
    let answered_by = |machine: bool, call: &crate::carrier::dial::OutboundCall| {
        if machine {
            Some("machine".to_string())
        } else {
            call.machine_detection.then(|| "human".to_string())
        }
    };
    match answer_outbound(host, request_uuid, machine, answered_by) {
        Answer::NotOurs => {
            warn!(
                call_id = call_uuid,
                request_uuid,
                "plivo answer for an outbound leg that is not a live call of ours; hanging up"
            );
            xml(pv::hangup_xml(None))
        }
        Answer::HangUp => xml(pv::hangup_xml(None)),
        Answer::Connect(token) => {
            info!(call_id = request_uuid, call_uuid, "outbound call answered");
            stream(host, call_uuid, &token)
        }
    }
}

/// The outcome of an outbound call that ended with `cause` before anyone answered.
fn unanswered_outcome(cause: &str) -> Option<CallOutcome> {
    match cause {
        "USER_BUSY" => Some(CallOutcome::Busy),
        "NO_ANSWER" | "ALLOTTED_TIMEOUT" => Some(CallOutcome::NoAnswer),
        "CALL_REJECTED" | "UNALLOCATED_NUMBER" | "INVALID_NUMBER_FORMAT" => Some(CallOutcome::Failed),
        _ => None,
    }
}

/// `POST /plivo/hangup`: the call ended.
async fn hangup(me: Arc<PlivoCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let (_account, fields) = match signed(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let call_id = field(&fields, "CallUUID").unwrap_or("");
    info!(
        call_id,
        cause = field(&fields, "HangupCause").unwrap_or(""),
        duration_s = field(&fields, "Duration").unwrap_or(""),
        "plivo call hung up"
    );
    // A call we placed is ours by its request_uuid.
    let ours = field(&fields, "RequestUUID")
        .filter(|r| host.outbound().live(r).is_some())
        .map(str::to_string)
        .or_else(|| host.outbound().call_id_for_leg(call_id));
    let call_id = ours.as_deref().unwrap_or(call_id);
    if ours.is_some() {
        let cause = field(&fields, "HangupCause").unwrap_or("");
        let answered = field(&fields, "AnswerTime").is_some();
        if !answered && let Some(outcome) = unanswered_outcome(cause) {
            host.report(StatusUpdate::unanswered(call_id, outcome));
        }
        if let Some(d) = field(&fields, "Duration").and_then(|d| d.parse().ok()) {
            host.report(StatusUpdate {
                call_id: call_id.to_string(),
                status: None,
                outcome: None,
                answered_by: None,
                carrier_duration_s: Some(d),
            });
        }
    }
    host.end_call(call_id, "carrier reported hangup");
    empty(204)
}

/// `WS /plivo/media/{call}?t=<token>`: Plivo's audio stream.
async fn media(me: Arc<PlivoCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let call_ok = req
        .uri()
        .path()
        .strip_prefix("/plivo/media/")
        .is_some_and(|c| !c.is_empty() && !c.contains('/'));
    if !call_ok {
        return text(404, "not found\n");
    }
    let token = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "t")
        .map(|(_, v)| v.into_owned());
    host.accept_media(
        req,
        MediaSocket {
            carrier: me,
            codec: Box::new(PlivoCodec::new()),
            token: TokenSource::Url(token),
            subprotocol: Some(pv::SUBPROTOCOL),
        },
    )
}
