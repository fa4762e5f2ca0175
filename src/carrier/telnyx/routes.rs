//! Telnyx's routes and its [`Carrier`] implementation: `POST /telnyx/webhook` (Ed25519-signed
//! Call Control events) and `WS /telnyx/media/{token}` (media streaming, handed to the
//! carrier-neutral pump). Webhooks are acknowledged at once and commands run in the background,
//! as Telnyx retries slow webhooks: `call.initiated` → admission → `answer` (or Telnyx's own
//! `reject`, cause `USER_BUSY` / `CALL_REJECTED`); `call.answered` → `streaming_start` with a
//! single-use media token as the last path segment of `stream_url`; `call.hangup` and
//! `streaming.failed` end the call; anything else gets 200 and is ignored. The wire details
//! live in the sibling modules.
//!
//! Calls we dialled (`POST /v2/calls`) use the same events: `call.initiated` (`outgoing`) is
//! ignored; `call.answered` starts the stream and records the outcome `answered` — unless
//! machine detection was asked for (`detect_beep`), in which case the call waits in
//! [`Phase::Detecting`] for `call.machine.detection.ended` (at most 10 s): a person (or
//! `not_sure`, or no result in time) gets the stream; so does a machine when the call has a
//! voicemail message, which the call leaves in the agent's voice after the greeting's beep
//! (heard in-band, or Telnyx's `call.machine.greeting.ended`, whichever comes first), then
//! hangs up; another machine is hung up on. A `call.hangup` before the answer gives the outcome
//! from its cause: `user_busy` → busy, `no_answer`/`timeout` → no_answer,
//! `call_rejected`/`not_found`/`unallocated_number` → failed.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tracing::{debug, info, warn};

use super::rest::{Dial, OUTBOUND_CLIENT_STATE};
use super::{self as tx, Config, StreamParams, TelnyxCodec, TelnyxRest, WebhookEnvelope};
use crate::carrier::account::{Account, Accounts};
use crate::carrier::dial::{
    CallOutcome, Machine, Outbound, OutboundCall, Phase, PlaceCall, PlaceError, StatusUpdate,
};
use crate::carrier::port::{
    Arrived, Counter, Host, IncomingCall, MediaSocket, Refusal, TokenSource,
};
use crate::carrier::registry::{BoxFuture, Route, RoutePath, account_methods, through_rest};
use crate::carrier::messaging::{NumberInfo, OutgoingSms, SentSms};
use crate::carrier::webhook::{arrive, header, reached_machine, unix_now};
use crate::carrier::{
    Carrier, CarrierError, CarrierKind, DtmfDelivery, TransferRequest, public_request_url,
    public_ws_url,
};
use crate::net::http::{Body, empty, text};

/// How long a webhook's `data.id` is remembered for de-duplication (retries, replays within
/// the 300 s signature window).
const SEEN_TTL: std::time::Duration = std::time::Duration::from_secs(600);
/// The replay guard's scope of Telnyx event ids ([`Host::first_seen`]).
pub(crate) const EVENT_SCOPE: &str = "telnyx_event";

/// How long an answered call waits for machine detection before it is treated as a person
/// (Telnyx's `detect` decides within a few seconds; a lost webhook must not leave the callee
/// listening to silence).
const DETECTION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every configured Telnyx account.
pub(crate) struct TelnyxCarrier {
    pub(super) accounts: Accounts<TelnyxRest>,
    /// `connection_id` of each account (outbound calls).
    connections: Vec<(String, String)>,
}

/// The Telnyx carrier with its usable accounts.
pub fn build(configs: Vec<(String, Config)>) -> Arc<dyn Carrier> {
    let connections = configs
        .iter()
        .map(|(n, c)| (n.clone(), c.connection_id.trim().to_string()))
        .collect();
    Arc::new(TelnyxCarrier {
        accounts: Accounts::build(CarrierKind::Telnyx, configs, |c| {
            tx::signature::decode_public_key(&c.public_key).map_err(|e| {
                CarrierError::Config {
                    carrier: "Telnyx",
                    message: format!("public_key: {e}"),
                }
            })?;
            Ok((c.public_key.trim().to_string(), TelnyxRest::from_config(c)?))
        }),
        connections,
    })
}

impl Carrier for TelnyxCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Telnyx
    }

    account_methods!();

    fn routes(self: Arc<Self>) -> Vec<Route> {
        vec![
            Route::to(&[Method::POST], RoutePath::Exact("/telnyx/webhook"), &self, webhook),
            Route::to(&[Method::GET], RoutePath::Prefix("/telnyx/media/"), &self, media),
            Route::to(
                &[Method::POST],
                RoutePath::Exact("/telnyx/sms"),
                &self,
                super::sms::webhook,
            ),
        ]
    }

    fn hang_up(&self, account: &str, leg_id: &str) -> BoxFuture<Result<(), CarrierError>> {
        through_rest(self.accounts.rest(account), leg_id, |r, id| async move {
            r.hang_up(&id).await
        })
    }

    fn transfer(
        &self,
        account: &str,
        leg_id: &str,
        request: &TransferRequest,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let request = request.clone();
        through_rest(self.accounts.rest(account), leg_id, |r, id| async move {
            r.transfer(&id, &request.to, &request.caller_id).await
        })
    }

    fn send_dtmf(
        &self,
        account: &str,
        leg_id: &str,
        digits: &str,
    ) -> BoxFuture<Result<DtmfDelivery, CarrierError>> {
        let digits = digits.to_string();
        let rest = self.accounts.rest(account);
        let id = leg_id.to_string();
        Box::pin(async move {
            match rest {
                Some(r) => r.send_dtmf(&id, &digits).await.map(|()| DtmfDelivery::Sent),
                None => Ok(DtmfDelivery::InBand),
            }
        })
    }

    fn place_call(&self, account: &str, p: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        let rest = self.accounts.rest(account);
        let connection_id = self
            .connections
            .iter()
            .find(|(n, _)| n == account)
            .map(|(_, c)| c.clone())
            .filter(|c| !c.is_empty());
        let account = account.to_string();
        Box::pin(async move {
            let rest = rest.ok_or_else(|| PlaceError::Unconfigured {
                account: account.clone(),
                what: "api_key and public_key",
            })?;
            let connection_id = connection_id.ok_or(PlaceError::Unconfigured {
                account,
                what: "connection_id (the Call Control application placing outbound calls)",
            })?;
            let dial = Dial {
                connection_id,
                from: p.from.clone(),
                to: p.to.clone(),
                webhook_url: public_request_url(&p.public_url, "/telnyx/webhook", None),
                client_state: Some(OUTBOUND_CLIENT_STATE.into()),
                timeout_secs: Some(p.ring_timeout_s),
                // `detect_beep`: `call.machine.greeting.ended` follows a machine's beep.
                answering_machine_detection: p
                    .machine_detection
                    .then(|| "detect_beep".to_string()),
                stream_url: None,
            };
            Ok(rest.dial(&dial).await?)
        })
    }

    fn cancel(
        &self,
        account: &str,
        call_id: &str,
        outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let _ = outbound;
        self.hang_up(account, call_id)
    }

    fn send_sms(&self, account: &str, sms: &OutgoingSms) -> BoxFuture<Result<SentSms, CarrierError>> {
        let rest = self.accounts.rest(account);
        let sms = sms.clone();
        Box::pin(async move { unconfigured(rest)?.send_message(&sms).await })
    }

    fn lookup_number(
        &self,
        account: &str,
        number: &str,
    ) -> BoxFuture<Result<NumberInfo, CarrierError>> {
        let rest = self.accounts.rest(account);
        let number = number.to_string();
        Box::pin(async move { unconfigured(rest)?.lookup(&number).await })
    }
}

/// The account's REST client, or the error saying it has no credentials.
fn unconfigured(rest: Option<Arc<TelnyxRest>>) -> Result<Arc<TelnyxRest>, CarrierError> {
    rest.ok_or_else(|| CarrierError::Config {
        carrier: "Telnyx",
        message: "the account has no api_key / public_key".into(),
    })
}

/// `POST /telnyx/webhook`: a Call Control event.
async fn webhook(me: Arc<TelnyxCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let mut arrived = match arrive(req, host.max_body_bytes()).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let now = unix_now();
    let Some(account) =
        verified_account(&me, host.as_ref(), &arrived.headers, &arrived.body, now)
    else {
        return empty(403);
    };
    let event = match WebhookEnvelope::parse(&arrived.body) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "telnyx webhook without the fields patterd needs");
            return text(400, "not a Call Control event\n");
        }
    };
    let id = event.call.call_control_id.clone();
    // Each event is handled once, cluster-wide (Telnyx retries, and may deliver a retry to
    // another instance); an event without an id cannot be told from its retries.
    if !event.id.is_empty() {
        match host.first_seen(EVENT_SCOPE, &event.id, SEEN_TTL).await {
            Ok(true) => arrived.seen = Some((EVENT_SCOPE, event.id.clone())),
            Ok(false) => {
                debug!(call_id = %id, event_id = %event.id, "telnyx webhook already handled");
                return empty(200);
            }
            Err(e) => {
                warn!(call_id = %id, error = %e, "telnyx webhook refused for now (Telnyx retries)");
                return text(503, "the replay guard is unavailable; try again\n");
            }
        }
    }
    let outbound = host.outbound().live(&id);
    match event.event_type.as_str() {
        "call.initiated" => {
            if let Some(answer) = on_initiated(&host, account, &event, arrived).await {
                return answer;
            }
        }
        "call.answered" => on_answered_event(&me, &host, account, outbound, &id),
        "call.machine.detection.ended" => {
            let pending = host
                .outbound()
                .advance(&id, Phase::Detecting, Phase::Connected);
            if let Some(call) = outbound.filter(|_| pending) {
                let result = event.call.result.as_deref().unwrap_or("not_sure");
                if result == "machine" {
                    on_machine(&host, account, &id, &call);
                } else {
                    host.report(StatusUpdate::outcome(
                        &id,
                        CallOutcome::Answered,
                        Some(result.to_string()),
                    ));
                    on_answered(&host, account, &id);
                }
            }
        }
        "call.machine.greeting.ended" => {
            // The beep (or the greeting's end) as Telnyx heard it: the message goes now, if
            // the call has not heard the beep itself already.
            let result = event.call.result.as_deref().unwrap_or("");
            if let Some(call) = outbound.filter(|c| c.phase == Phase::Voicemail)
                && result != "not_sure"
                && let Some(message) = &call.voicemail_message
            {
                debug!(call_id = %id, result, "telnyx heard the greeting end");
                host.machine_answered(&id, message, Machine::GreetingEnded);
            }
        }
        "call.hangup" => {
            let cause = event.call.hangup_cause.as_deref().unwrap_or("");
            info!(
                call_id = %id,
                cause,
                source = event.call.hangup_source.as_deref().unwrap_or(""),
                "telnyx call hung up"
            );
            if outbound.is_some()
                && let Some(outcome) = unanswered_outcome(cause)
            {
                host.report(StatusUpdate::unanswered(&id, outcome));
            }
            host.outbound().set_phase(&id, Phase::Ended);
            host.end_call(&id, "carrier reported hangup");
        }
        "streaming.failed" => {
            warn!(
                call_id = %id,
                reason = event.call.failure_reason.as_deref().unwrap_or(""),
                "telnyx could not open the media stream"
            );
            host.end_call(&id, "media stream failed");
        }
        other => debug!(call_id = %id, event = other, "telnyx event ignored"),
    }
    empty(200)
}

/// The account whose public key signed this webhook, or `None` (counted and logged) when none
/// did.
pub(super) fn verified_account<'a>(
    me: &'a TelnyxCarrier,
    host: &dyn Host,
    headers: &http::HeaderMap,
    body: &[u8],
    now: u64,
) -> Option<&'a Account<TelnyxRest>> {
    let signature = header(headers, tx::SIGNATURE_HEADER);
    let timestamp = header(headers, tx::TIMESTAMP_HEADER);
    let mut last_error = None;
    let account = me.accounts.verifying(|public_key| {
        match tx::verify_webhook(
            public_key,
            signature.as_deref(),
            timestamp.as_deref(),
            body,
            now,
        ) {
            Ok(()) => true,
            Err(e) => {
                last_error = Some(e);
                false
            }
        }
    });
    let Some(account) = account else {
        host.count(Counter::WebhookForbidden);
        if let Some(suppressed) = crate::security::peer_warning_allowed() {
            warn!(
                error = %crate::security::truncate_for_log(
                    &last_error.map(|e| e.to_string()).unwrap_or_default(),
                    crate::security::LOG_FIELD_MAX,
                ),
                suppressed,
                "telnyx webhook refused: bad or missing telnyx-signature-ed25519 (check public_key and the server clock)"
            );
        }
        return None;
    };
    Some(account)
}

/// `call.answered`: an inbound call or a person starts streaming; an outbound call with machine
/// detection waits for its result (or, after [`DETECTION_WAIT`], takes the callee for a person).
fn on_answered_event(
    me: &Arc<TelnyxCarrier>,
    host: &Arc<dyn Host>,
    account: &Account<TelnyxRest>,
    outbound: Option<OutboundCall>,
    id: &str,
) {
    let id = id.to_string();
    match outbound {
        Some(call) if call.machine_detection => {
            debug!(call_id = %id, "outbound call answered; waiting for machine detection");
            host.outbound().set_phase(&id, Phase::Detecting);
            let host = host.clone();
            let me = me.clone();
            let account = account.name.clone();
            tokio::spawn(async move {
                tokio::time::sleep(DETECTION_WAIT).await;
                if host
                    .outbound()
                    .advance(&id, Phase::Detecting, Phase::Connected)
                    && let Some(a) = me.accounts.get(&account)
                {
                    warn!(call_id = %id, "no machine detection result; treating the callee as a person");
                    host.report(StatusUpdate::outcome(
                        &id,
                        CallOutcome::Answered,
                        Some("unknown".into()),
                    ));
                    on_answered(&host, a, &id);
                }
            });
        }
        Some(_) => {
            host.report(StatusUpdate::outcome(&id, CallOutcome::Answered, None));
            host.outbound().set_phase(&id, Phase::Connected);
            on_answered(host, account, &id);
        }
        None => on_answered(host, account, &id),
    }
}

/// The outcome of an outbound call that ended with `cause` before anyone answered.
fn unanswered_outcome(cause: &str) -> Option<CallOutcome> {
    match cause {
        "user_busy" => Some(CallOutcome::Busy),
        "no_answer" | "timeout" => Some(CallOutcome::NoAnswer),
        "call_rejected" | "not_found" | "unallocated_number" => Some(CallOutcome::Failed),
        _ => None,
    }
}

/// Machine detection heard a machine: the stream, for the call to leave its voicemail message
/// (see [`reached_machine`]), or a hang-up at once.
fn on_machine(host: &Arc<dyn Host>, account: &Account<TelnyxRest>, id: &str, call: &OutboundCall) {
    if reached_machine(host.as_ref(), id, call, Machine::Greeting, Some("machine".into())) {
        on_answered(host, account, id);
        return;
    }
    let rest = account.rest.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        if let Err(e) = rest.hang_up(&id).await {
            warn!(call_id = %id, error = %e, "telnyx hangup of a machine failed");
        }
    });
}

/// `call.initiated`: admits an incoming call. Returns the answer to send instead of the plain
/// acknowledgement when the call was refused busy here and handed to a peer (`webhook`, as it
/// arrived), which then answers or rejects it.
async fn on_initiated(
    host: &Arc<dyn Host>,
    account: &Account<TelnyxRest>,
    event: &WebhookEnvelope,
    webhook: Arrived,
) -> Option<Response<Body>> {
    let call = &event.call;
    if call.direction != "incoming" {
        debug!(call_id = %call.call_control_id, direction = %call.direction, "telnyx call.initiated for a call we did not receive; ignored");
        return None;
    }
    let inbound = IncomingCall {
        carrier: CarrierKind::Telnyx,
        account: &account.name,
        call_id: &call.call_control_id,
        from: &call.from,
        to: &call.to,
    };
    let rest = account.rest.clone();
    let id = call.call_control_id.clone();
    let admitted = host.admit(inbound).await;
    match admitted {
        // A replayed `call.initiated` for a call we already handled: leave that call alone.
        Err(Refusal::Repeated) => {}
        Ok(_) => {
            // The call's later events come to this instance, its owner, when it has a base of
            // its own; otherwise to the application's URL, as before.
            let webhook_url = (host.callback_base() != host.public_url())
                .then(|| public_request_url(host.callback_base(), "/telnyx/webhook", None));
            let host = host.clone();
            tokio::spawn(async move {
                if let Err(e) = rest
                    .answer(&id, &format!("answer-{id}"), None, webhook_url.as_deref())
                    .await
                {
                    warn!(call_id = %id, error = %e, "telnyx answer failed; ending the call");
                    host.end_call(&id, "carrier answer failed");
                }
            });
        }
        Err(r) => {
            // Busy here, but a ready peer may take it: the peer answers or rejects it.
            if matches!(r, Refusal::Draining | Refusal::Full)
                && let Some(answer) = host.hand_off(r, webhook).await
            {
                return Some(answer);
            }
            let cause = if r.is_busy() {
                "USER_BUSY"
            } else {
                "CALL_REJECTED"
            };
            tokio::spawn(async move {
                if let Err(e) = rest.reject(&id, cause).await {
                    warn!(call_id = %id, error = %e, "telnyx reject failed");
                }
            });
        }
    }
    None
}

fn on_answered(host: &Arc<dyn Host>, account: &Account<TelnyxRest>, id: &str) {
    let Some(call_account) = host.live_call_account(id) else {
        debug!(call_id = %id, "telnyx call.answered for a call that is not live");
        return;
    };
    if call_account != account.name {
        warn!(call_id = %id, "telnyx call.answered signed by another account; ignored");
        return;
    }
    let token = host.mint_token(id);
    let params = StreamParams {
        stream_url: public_ws_url(host.callback_base(), &format!("/telnyx/media/{token}")),
        ..StreamParams::default()
    };
    let rest = account.rest.clone();
    let id = id.to_string();
    let host = host.clone();
    tokio::spawn(async move {
        if let Err(e) = rest
            .streaming_start(&id, &format!("stream-{id}"), &params)
            .await
        {
            warn!(call_id = %id, error = %e, "telnyx streaming_start failed; ending the call");
            host.end_call(&id, "carrier stream failed");
        }
    });
}

/// `WS /telnyx/media/{token}`: Telnyx's media stream; the last path segment is the call's
/// single-use media token.
async fn media(me: Arc<TelnyxCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let token = req
        .uri()
        .path()
        .strip_prefix("/telnyx/media/")
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .map(str::to_string);
    let Some(token) = token else {
        return text(404, "not found\n");
    };
    host.accept_media(
        req,
        MediaSocket {
            carrier: me,
            codec: Box::new(TelnyxCodec::new()),
            token: TokenSource::Url(Some(token)),
            subprotocol: None,
        },
    )
}
