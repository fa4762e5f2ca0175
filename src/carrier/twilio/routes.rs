//! Twilio's routes and its [`Carrier`] implementation: `POST /twilio/voice` (signed
//! incoming-call webhook → TwiML with a tokenized `<Connect><Stream>`), `POST /twilio/outbound`
//! (the answer webhook of calls we placed: the same TwiML — for a machine too when the call
//! has a voicemail message, which the call leaves itself after the beep — or a hang-up), `POST /twilio/status` (signed status callbacks, recorded and
//! turned into outcomes) and `WS /twilio/media` (Media Streams, handed to the carrier-neutral
//! pump). Placing a call is `POST Calls.json` with our answer URL and status callback;
//! cancelling a ringing one is `Status=canceled`. The wire details — signatures, TwiML, frames,
//! REST — live in the sibling modules; this file only decides.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tracing::{info, warn};

use super::rest::CreateCall;
use super::{self as tw, Config, TwilioCodec, TwilioRest};
use crate::carrier::account::{Account, Accounts};
use crate::carrier::dial::{
    CallOutcome, CallStatus, Machine, Outbound, PlaceCall, PlaceError, StatusUpdate,
};
use crate::carrier::port::{Arrived, Counter, Host, IncomingCall, MediaSocket, TokenSource};
use crate::carrier::registry::{BoxFuture, Route, RoutePath, account_methods, through_rest};
use crate::carrier::webhook::{
    Answer, answer_outbound, arrive, field_or_empty, header, refused_or_handed,
};
use crate::carrier::messaging::{NumberInfo, OutgoingSms, SentSms};
use crate::carrier::{Carrier, CarrierError, CarrierKind, TransferRequest};
use crate::net::http::{Body, empty, text, xml};
use crate::security::{LOG_FIELD_MAX, mask_number, peer_warning_allowed, truncate_for_log};

/// Every configured Twilio account.
pub(crate) struct TwilioCarrier {
    pub(super) accounts: Accounts<TwilioRest>,
}

/// The Twilio carrier with its usable accounts.
pub fn build(configs: Vec<(String, Config)>) -> Arc<dyn Carrier> {
    Arc::new(TwilioCarrier {
        accounts: Accounts::build(CarrierKind::Twilio, configs, |c| {
            Ok((
                c.auth_token.expose().to_string(),
                TwilioRest::from_config(c)?,
            ))
        }),
    })
}

impl Carrier for TwilioCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Twilio
    }

    account_methods!();

    fn routes(self: Arc<Self>) -> Vec<Route> {
        vec![
            Route::to(&[Method::POST], RoutePath::Exact("/twilio/voice"), &self, voice),
            Route::to(&[Method::POST], RoutePath::Exact("/twilio/status"), &self, status),
            Route::to(
                &[Method::POST],
                RoutePath::Exact("/twilio/outbound"),
                &self,
                outbound_answer,
            ),
            Route::to(&[Method::GET], RoutePath::Exact("/twilio/media"), &self, media),
            Route::to(
                &[Method::POST],
                RoutePath::Exact("/twilio/sms"),
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

    fn place_call(&self, account: &str, p: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        let rest = self.accounts.rest(account);
        let account = account.to_string();
        Box::pin(async move {
            let rest = rest.ok_or(PlaceError::Unconfigured {
                account,
                what: "account_sid and auth_token",
            })?;
            let create = CreateCall {
                to: p.to.clone(),
                from: p.from.clone(),
                twiml: None,
                url: Some(tw::public_request_url(
                    &p.public_url,
                    "/twilio/outbound",
                    None,
                )),
                status_callback: Some(tw::public_request_url(
                    &p.public_url,
                    "/twilio/status",
                    None,
                )),
                status_callback_events: ["initiated", "ringing", "answered", "completed"]
                    .map(String::from)
                    .to_vec(),
                timeout_s: Some(p.ring_timeout_s),
                machine_detection: p.machine_detection.then(|| "Enable".to_string()),
                async_amd_status_callback: None,
            };
            Ok(rest.create_call(&create).await?)
        })
    }

    fn cancel(
        &self,
        account: &str,
        call_id: &str,
        _outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>> {
        through_rest(self.accounts.rest(account), call_id, |r, id| async move {
            r.update_call(&id, &[("Status", "canceled")])
                .await
                .map(|_| ())
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

    // DTMF: Twilio has no REST command while `<Connect><Stream>` runs;
    // the default answers `InBand` and the tones go on the media stream.

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
fn unconfigured(rest: Option<Arc<TwilioRest>>) -> Result<Arc<TwilioRest>, CarrierError> {
    rest.ok_or_else(|| CarrierError::Config {
        carrier: "Twilio",
        message: "the account has no account_sid / auth_token".into(),
    })
}

/// Reads and authenticates a Twilio webhook. `Err` is the response to send.
pub(super) async fn signed_form<'a>(
    me: &'a TwilioCarrier,
    host: &dyn Host,
    req: Request<Incoming>,
) -> Result<(&'a Account<TwilioRest>, Vec<(String, String)>), Response<Body>> {
    let arrived = arrive(req, host.max_body_bytes()).await?;
    verified_form(me, host, &arrived).await
}

/// Authenticates a Twilio webhook that has arrived ([`signed_form`]).
async fn verified_form<'a>(
    me: &'a TwilioCarrier,
    host: &dyn Host,
    parts: &Arrived,
) -> Result<(&'a Account<TwilioRest>, Vec<(String, String)>), Response<Body>> {
    let params: Vec<(String, String)> =
        form_urlencoded::parse(&parts.body).into_owned().collect();
    // Twilio signed the URL it requested: under the shared `public_url` (a number's webhook)
    // or under this instance's own base (the per-call URLs we handed it).
    let urls: Vec<String> = host
        .signature_bases()
        .into_iter()
        .map(|base| tw::public_request_url(base, parts.uri.path(), parts.uri.query()))
        .collect();
    let signature = header(&parts.headers, tw::SIGNATURE_HEADER).unwrap_or_default();
    let settings = header(&parts.headers, "X-Twilio-Webhooks-Signature-Settings");
    let account = me.accounts.verifying(|auth_token| {
        !signature.is_empty()
            && urls.iter().any(|url| {
                tw::validate_signature(auth_token, url, &params, &signature, settings.as_deref())
            })
    });
    match account {
        Some(a) => Ok((a, params)),
        None => {
            host.count(Counter::WebhookForbidden);
            let get = |k: &str| truncate_for_log(field_or_empty(&params, k), LOG_FIELD_MAX);
            if let Some(suppressed) = peer_warning_allowed() {
                warn!(
                    path = %truncate_for_log(parts.uri.path(), LOG_FIELD_MAX),
                    call_sid = %get("CallSid"),
                    from = %mask_number(&get("From")),
                    to = %mask_number(&get("To")),
                    signature_present = !signature.is_empty(),
                    suppressed,
                    "twilio webhook refused: bad or missing X-Twilio-Signature (check auth_token and server.public_url)"
                );
            }
            Err(empty(403))
        }
    }
}

/// TwiML connecting the media stream with `token`.
fn connect(host: &dyn Host, token: &str) -> Response<Body> {
    let stream_url = tw::public_ws_url(host.callback_base(), "/twilio/media");
    xml(tw::twiml_connect_stream(
        &stream_url,
        &[("token", token)],
        None,
    ))
}

/// `POST /twilio/voice`: an incoming call.
async fn voice(me: Arc<TwilioCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let arrived = match arrive(req, host.max_body_bytes()).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (account, params) = match verified_form(&me, host.as_ref(), &arrived).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let hook = match tw::VoiceWebhook::from_params(&params) {
        Ok(h) => h,
        Err(e) => {
            warn!(error = %e, "twilio voice webhook without the fields a call needs");
            return text(400, "missing CallSid, From or To\n");
        }
    };
    let inbound = IncomingCall {
        carrier: CarrierKind::Twilio,
        account: &account.name,
        call_id: &hook.call_sid,
        from: &hook.from,
        to: &hook.to,
    };
    match host.admit(inbound).await {
        Ok(_) => {}
        Err(r) if r.is_busy() => {
            let busy = xml(tw::twiml_reject(Some("busy")));
            return refused_or_handed(host.as_ref(), r, arrived, busy).await;
        }
        Err(r) if r.is_rejection() => return xml(tw::twiml_reject(Some("rejected"))),
        Err(_) => return xml(tw::twiml_reject(None)),
    }
    let token = host.mint_token(&hook.call_sid);
    connect(host.as_ref(), &token)
}

/// `POST /twilio/status`: how a call ended (or progressed).
async fn status(me: Arc<TwilioCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let (_account, params) = match signed_form(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let get = |k: &str| field_or_empty(&params, k);
    let call_sid = get("CallSid");
    let status = get("CallStatus");
    let answered_by = get("AnsweredBy");
    info!(
        call_sid,
        status,
        answered_by,
        duration_s = get("CallDuration"),
        "twilio call status"
    );
    if !call_sid.is_empty() {
        host.report(StatusUpdate {
            call_id: call_sid.to_string(),
            // Media start is what makes a call in-progress for us; `initiated` is `queued`.
            status: match status {
                "initiated" => Some(CallStatus::Queued),
                "in-progress" | "answered" => None,
                s => CallStatus::parse(s),
            },
            outcome: outcome_for(status, answered_by),
            answered_by: (!answered_by.is_empty()).then(|| answered_by.to_string()),
            carrier_duration_s: get("CallDuration").parse().ok(),
        });
    }
    if matches!(
        status,
        "completed" | "busy" | "failed" | "no-answer" | "canceled"
    ) {
        host.end_call(call_sid, &format!("carrier reported {status}"));
    }
    empty(204)
}

/// The outcome a status callback (and machine detection) implies, if any.
fn outcome_for(status: &str, answered_by: &str) -> Option<CallOutcome> {
    match status {
        "busy" => Some(CallOutcome::Busy),
        "no-answer" => Some(CallOutcome::NoAnswer),
        "failed" | "canceled" => Some(CallOutcome::Failed),
        _ if is_machine(answered_by) => Some(CallOutcome::Voicemail),
        _ => None,
    }
}

/// Twilio's `AnsweredBy` values for anything but a person.
fn is_machine(answered_by: &str) -> bool {
    machine(answered_by).is_some()
}

/// What Twilio's `AnsweredBy` says about a machine: `machine_start` (what
/// `MachineDetection=Enable` answers, early in the greeting), `machine_end_beep`,
/// `machine_end_silence`, `machine_end_other` (`DetectMessageEnd`: the greeting is over),
/// `fax`. `None`: a person (`human`) or nobody knows (`unknown`, empty).
fn machine(answered_by: &str) -> Option<Machine> {
    match answered_by {
        "fax" => Some(Machine::Fax),
        a if a.starts_with("machine_end") => Some(Machine::GreetingEnded),
        a if a.starts_with("machine") => Some(Machine::Greeting),
        _ => None,
    }
}

/// `POST /twilio/outbound`: a call we placed was answered. A person gets the media stream,
/// like an inbound call; so does a machine (with machine detection) when the call has a
/// voicemail message, which the call leaves after the greeting's beep in the agent's voice;
/// another machine is hung up on.
async fn outbound_answer(
    me: Arc<TwilioCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let (_account, params) = match signed_form(&me, host.as_ref(), req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let call_sid = field_or_empty(&params, "CallSid");
    let answered_by = field_or_empty(&params, "AnsweredBy");
    let by = (!answered_by.is_empty()).then(|| answered_by.to_string());
    match answer_outbound(host.as_ref(), call_sid, machine(answered_by), |_, _| by) {
        Answer::NotOurs => {
            warn!(
                call_sid,
                "answer webhook for a call that is not a live outbound call; hanging up"
            );
            xml(tw::twiml_hangup())
        }
        Answer::HangUp => xml(tw::twiml_hangup()),
        Answer::Connect(token) => {
            info!(call_sid, answered_by, "outbound call answered");
            connect(host.as_ref(), &token)
        }
    }
}

/// `WS /twilio/media`: Twilio's Media Streams socket.
async fn media(me: Arc<TwilioCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    host.accept_media(
        req,
        MediaSocket {
            carrier: me,
            codec: Box::new(TwilioCodec::new()),
            token: TokenSource::StartParameter,
            subprotocol: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AnsweredBy` as Twilio sends it; anything else (a person, `unknown`, a value Twilio
    /// does not send) is a person.
    #[test]
    fn answered_by_names_the_machine() {
        assert_eq!(machine("machine_start"), Some(Machine::Greeting));
        for end in ["machine_end_beep", "machine_end_silence", "machine_end_other"] {
            assert_eq!(machine(end), Some(Machine::GreetingEnded), "{end}");
        }
        assert_eq!(machine("fax"), Some(Machine::Fax));
        for person in ["human", "unknown", "", "MACHINE_START", "robot", "machin"] {
            assert_eq!(machine(person), None, "{person:?}");
        }
        assert_eq!(
            outcome_for("in-progress", "machine_start"),
            Some(CallOutcome::Voicemail)
        );
        assert_eq!(outcome_for("in-progress", "human"), None);
    }
}
