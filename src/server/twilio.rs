//! Twilio's routes: `POST /twilio/voice` (signed incoming-call webhook → TwiML with a tokenized
//! `<Connect><Stream>`), `POST /twilio/outbound` (the answer webhook of calls we placed: the same
//! TwiML, or the voicemail message when machine detection heard a machine), `POST
//! /twilio/status` (signed status callbacks, recorded in the store and turned into outcomes) and
//! `WS /twilio/media` (Media Streams, handed to the carrier-neutral pump). The wire details — signatures, TwiML,
//! frames, REST — live in [`crate::carrier::twilio`]; this file only decides.

use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use tracing::{info, warn};

use super::App;
use super::admission::{self, Inbound, Refusal};
use super::http::{Body, empty, read_body, text, xml};
use super::media::{self, CarrierControl, TokenSource};
use super::metrics::Metrics;
use crate::carrier::CarrierKind;
use crate::carrier::twilio::{self as tw, TwilioCodec, TwilioRest};
use crate::config::{Config, Secret};
use crate::security::mask_number;
use crate::store::Write;

/// A configured Twilio account (`[carriers.NAME]` with `kind = "twilio"` and credentials).
pub struct TwilioAccount {
    pub name: String,
    auth_token: Secret,
    pub rest: Arc<TwilioRest>,
}

/// Every configured Twilio account. Empty means Twilio's routes answer 503.
#[derive(Default)]
pub struct TwilioCarriers {
    pub accounts: Vec<TwilioAccount>,
}

impl TwilioCarriers {
    pub fn from_config(config: &Config) -> Self {
        let accounts = config
            .carriers
            .iter()
            .filter(|(_, c)| c.kind == CarrierKind::Twilio && c.missing_credentials().is_empty())
            .filter_map(|(name, c)| match TwilioRest::from_config(c) {
                Ok(rest) => Some(TwilioAccount {
                    name: name.clone(),
                    auth_token: c.auth_token.clone(),
                    rest: Arc::new(rest),
                }),
                Err(e) => {
                    tracing::error!(carrier = %name, error = %e, "twilio account unusable");
                    None
                }
            })
            .collect();
        Self { accounts }
    }

    pub fn account(&self, name: &str) -> Option<&TwilioAccount> {
        self.accounts.iter().find(|a| a.name == name)
    }
}

impl CarrierControl for TwilioRest {
    fn hang_up(
        &self,
        call_id: String,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let rest = self.clone();
        Box::pin(async move { rest.hang_up(&call_id).await.map_err(|e| e.to_string()) })
    }
}

fn not_configured() -> Response<Body> {
    text(
        503,
        "twilio is not configured: set account_sid and auth_token in [carriers.<name>]\n",
    )
}

/// Reads and authenticates a Twilio webhook. `Err` is the response to send.
async fn signed_form(
    app: &App,
    req: Request<Incoming>,
) -> Result<(&TwilioAccount, Vec<(String, String)>), Response<Body>> {
    if app.twilio.accounts.is_empty() {
        return Err(not_configured());
    }
    let (parts, body) = req.into_parts();
    let body = read_body(body, app.config.server.max_body_bytes)
        .await
        .map_err(|e| e.response())?;
    let params: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let url = tw::public_request_url(
        &app.config.server.public_url,
        parts.uri.path(),
        parts.uri.query(),
    );
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let signature = header("X-Twilio-Signature").unwrap_or_default();
    let settings = header("X-Twilio-Webhooks-Signature-Settings");
    let account = app.twilio.accounts.iter().find(|a| {
        !signature.is_empty()
            && tw::validate_signature(
                a.auth_token.expose(),
                &url,
                &params,
                &signature,
                settings.as_deref(),
            )
    });
    match account {
        Some(a) => Ok((a, params)),
        None => {
            Metrics::inc(&app.metrics.webhooks_forbidden);
            let get = |k: &str| {
                params
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("")
            };
            warn!(
                path = parts.uri.path(),
                call_sid = get("CallSid"),
                from = %mask_number(get("From")),
                to = %mask_number(get("To")),
                signature_present = !signature.is_empty(),
                "twilio webhook refused: bad or missing X-Twilio-Signature (check auth_token and server.public_url)"
            );
            Err(empty(403))
        }
    }
}

/// `POST /twilio/voice`: an incoming call.
pub async fn voice(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (account, params) = match signed_form(&app, req).await {
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
    let inbound = Inbound {
        carrier: CarrierKind::Twilio,
        account: &account.name,
        call_id: &hook.call_sid,
        from: &hook.from,
        to: &hook.to,
    };
    match admission::admit(&app, inbound) {
        Ok(_) => {}
        Err(r) if r.is_busy() => return xml(tw::twiml_reject(Some("busy"))),
        Err(Refusal::CallerNotAllowed | Refusal::Disabled) => {
            return xml(tw::twiml_reject(Some("rejected")));
        }
        Err(_) => return xml(tw::twiml_reject(None)),
    }
    let token = app.tokens.mint(&hook.call_sid);
    let stream_url = tw::public_ws_url(&app.config.server.public_url, "/twilio/media");
    xml(tw::twiml_connect_stream(
        &stream_url,
        &[("token", &token)],
        None,
    ))
}

/// `POST /twilio/status`: how a call ended (or progressed).
pub async fn status(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (_account, params) = match signed_form(&app, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
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
        let known = matches!(
            status,
            "queued"
                | "initiated"
                | "ringing"
                | "in-progress"
                | "completed"
                | "busy"
                | "failed"
                | "no-answer"
                | "canceled"
        );
        app.store.tx.send(Write::Status {
            call_id: call_sid.to_string(),
            // Media start is what makes a call in-progress for us; `initiated` is `queued`.
            status: match status {
                "initiated" => Some("queued".into()),
                "in-progress" | "answered" => None,
                s if known => Some(s.to_string()),
                _ => None,
            },
            outcome: outcome_for(status, answered_by).map(str::to_string),
            answered_by: (!answered_by.is_empty()).then(|| answered_by.to_string()),
            carrier_duration_s: get("CallDuration").parse().ok(),
        });
    }
    if matches!(
        status,
        "completed" | "busy" | "failed" | "no-answer" | "canceled"
    ) && let Some(h) = app.calls.get(call_sid)
    {
        let _ = h.hang_up(&format!("carrier reported {status}"));
    }
    empty(204)
}

/// The outcome a status callback (and machine detection) implies, if any.
fn outcome_for(status: &str, answered_by: &str) -> Option<&'static str> {
    match status {
        "busy" => Some("busy"),
        "no-answer" => Some("no_answer"),
        "failed" | "canceled" => Some("failed"),
        _ if is_machine(answered_by) => Some("voicemail"),
        _ => None,
    }
}

/// Twilio's `AnsweredBy` values for anything but a person.
fn is_machine(answered_by: &str) -> bool {
    answered_by.starts_with("machine") || answered_by == "fax"
}

/// `POST /twilio/outbound`: a call we placed was answered. A person gets the media stream,
/// like an inbound call; a machine (with machine detection) gets the voicemail message, if
/// any, and the call ends.
pub async fn outbound_answer(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (_account, params) = match signed_form(&app, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let call_sid = get("CallSid");
    let answered_by = get("AnsweredBy");
    let (Some(handle), Some(call)) = (app.calls.get(call_sid), app.outbound_call(call_sid)) else {
        warn!(
            call_sid,
            "answer webhook for a call that is not a live outbound call; hanging up"
        );
        return xml(tw::twiml_hangup());
    };
    if is_machine(answered_by) && call.machine_detection {
        info!(call_sid, answered_by, "outbound call reached a machine");
        app.store.tx.send(Write::Status {
            call_id: call_sid.to_string(),
            status: None,
            outcome: Some("voicemail".into()),
            answered_by: Some(answered_by.to_string()),
            carrier_duration_s: None,
        });
        let _ = handle.hang_up("voicemail");
        return xml(match &call.voicemail_message {
            Some(m) => tw::twiml_say_hangup(m),
            None => tw::twiml_hangup(),
        });
    }
    app.store.tx.send(Write::Status {
        call_id: call_sid.to_string(),
        status: None,
        outcome: Some("answered".into()),
        answered_by: (!answered_by.is_empty()).then(|| answered_by.to_string()),
        carrier_duration_s: None,
    });
    let token = app.tokens.mint(call_sid);
    let stream_url = tw::public_ws_url(&app.config.server.public_url, "/twilio/media");
    info!(call_sid, answered_by, "outbound call answered");
    xml(tw::twiml_connect_stream(
        &stream_url,
        &[("token", &token)],
        None,
    ))
}

/// `WS /twilio/media`: Twilio's Media Streams socket.
pub async fn media(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if app.twilio.accounts.is_empty() {
        return not_configured();
    }
    media::accept(
        app,
        req,
        TwilioCodec::new(),
        TokenSource::StartParameter,
        None,
    )
}
