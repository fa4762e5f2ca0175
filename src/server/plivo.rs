//! Plivo's routes: `POST /plivo/answer` (signed answer webhook → admission → Plivo XML with a
//! bidirectional `<Stream>` to `wss://…/plivo/media/{CallUUID}?t=<token>`, or Plivo's own
//! refusal `<Hangup reason="busy|rejected"/>`), `POST /plivo/hangup` (signed hangup callback)
//! and `WS /plivo/media/{call}` (the audio stream, selecting the `audio.drachtio.org`
//! subprotocol Plivo asks for, handed to the carrier-neutral pump). GET works for both
//! webhooks too, with the fields in the query. The wire details live in
//! [`crate::carrier::plivo`].
//!
//! Calls we placed (`Direction: outbound`) are known by the `request_uuid` Plivo answered `POST
//! Call/` with; the answer URL brings the `CallUUID`, remembered so the media stream, REST
//! hang-ups and the hangup callback find the call. The answer is the same `<Stream>`, or, when
//! synchronous machine detection says `Machine=true`, `<Speak>` of the voicemail message and
//! `<Hangup/>`. A hangup callback before the answer gives the outcome from `HangupCause`:
//! `USER_BUSY` → busy, `NO_ANSWER` → no_answer, `CALL_REJECTED` and unreachable numbers →
//! failed.

use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tracing::{info, warn};

use super::App;
use super::admission::{self, Inbound, Refusal};
use super::http::{Body, empty, read_body, text, xml};
use super::media::{self, CarrierControl, TokenSource};
use super::metrics::Metrics;
use crate::carrier::plivo::{self as pv, PlivoCodec, PlivoRest};
use crate::carrier::rest_client::path_safe;
use crate::carrier::{CarrierKind, public_request_url, public_ws_url};
use crate::config::{Config, Secret};
use crate::security::mask_number;
use crate::store::Write;

/// A configured Plivo account (`kind = "plivo"` with `auth_id` and `auth_token`).
pub struct PlivoAccount {
    pub name: String,
    auth_token: Secret,
    pub rest: Arc<PlivoRest>,
}

/// Every configured Plivo account. Empty means Plivo's routes answer 503.
#[derive(Default)]
pub struct PlivoCarriers {
    pub accounts: Vec<PlivoAccount>,
    /// Calls we placed: `request_uuid` (our call id) → the `CallUUID` the answer URL named.
    legs: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl PlivoCarriers {
    pub fn from_config(config: &Config) -> Self {
        let accounts = config
            .carriers
            .iter()
            .filter(|(_, c)| c.kind == CarrierKind::Plivo && c.missing_credentials().is_empty())
            .filter_map(|(name, c)| match PlivoRest::from_config(c) {
                Ok(rest) => Some(PlivoAccount {
                    name: name.clone(),
                    auth_token: c.auth_token.clone(),
                    rest: Arc::new(rest),
                }),
                Err(e) => {
                    tracing::error!(carrier = %name, error = %e, "plivo account unusable");
                    None
                }
            })
            .collect();
        Self {
            accounts,
            legs: Default::default(),
        }
    }

    fn legs(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.legs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `CallUUID` of an outbound call we know by its `request_uuid`, once answered.
    pub fn call_uuid(&self, request_uuid: &str) -> Option<String> {
        self.legs().get(request_uuid).cloned()
    }

    /// Our call id (the `request_uuid`) for the `CallUUID` of an outbound leg.
    pub fn our_call_id(&self, call_uuid: &str) -> Option<String> {
        self.legs()
            .iter()
            .find(|(_, c)| c.as_str() == call_uuid)
            .map(|(r, _)| r.clone())
    }

    /// Forgets an outbound call's ids (it has ended).
    pub fn forget(&self, request_uuid: &str) {
        self.legs().remove(request_uuid);
    }

    pub fn account(&self, name: &str) -> Option<&PlivoAccount> {
        self.accounts.iter().find(|a| a.name == name)
    }
}

impl CarrierControl for PlivoRest {
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
        "plivo is not configured: set auth_id and auth_token in [carriers.<name>]\n",
    )
}

/// Reads and authenticates a Plivo webhook; returns the account and the call's fields (the
/// form for POST, the query for GET). `Err` is the response to send.
async fn signed(
    app: &App,
    req: Request<Incoming>,
) -> Result<(&PlivoAccount, Vec<(String, String)>), Response<Body>> {
    if app.plivo.accounts.is_empty() {
        return Err(not_configured());
    }
    let (parts, body) = req.into_parts();
    let body = read_body(body, app.config.server.max_body_bytes)
        .await
        .map_err(|e| e.response())?;
    let post = parts.method == Method::POST;
    let form: Vec<(String, String)> = if post {
        form_urlencoded::parse(&body).into_owned().collect()
    } else {
        Vec::new()
    };
    let url = public_request_url(
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
    let method = parts.method.as_str();
    let account = app
        .plivo
        .accounts
        .iter()
        .find(|a| pv::validate_request(a.auth_token.expose(), method, &url, &form, header));
    let fields = if post {
        form
    } else {
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect()
    };
    match account {
        Some(a) => Ok((a, fields)),
        None => {
            Metrics::inc(&app.metrics.webhooks_forbidden);
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

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// `POST /plivo/answer`: a call to answer.
pub async fn answer(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (account, fields) = match signed(&app, req).await {
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
        return outbound_answer(&app, call_id, &fields);
    }
    let inbound = Inbound {
        carrier: CarrierKind::Plivo,
        account: &account.name,
        call_id,
        from,
        to,
    };
    match admission::admit(&app, inbound) {
        Ok(_) => {}
        Err(r) if r.is_busy() => return xml(pv::hangup_xml(Some("busy"))),
        Err(Refusal::CallerNotAllowed | Refusal::Disabled) => {
            return xml(pv::hangup_xml(Some("rejected")));
        }
        Err(_) => return xml(pv::hangup_xml(None)),
    }
    let token = app.tokens.mint(call_id);
    let url = format!(
        "{}?t={token}",
        public_ws_url(
            &app.config.server.public_url,
            &format!("/plivo/media/{call_id}")
        )
    );
    xml(pv::stream_xml(&url, pv::CONTENT_TYPE))
}

/// The answer URL of a call we placed: a person gets the stream (the media path keys the call
/// by its `request_uuid`, the stream URL names the `CallUUID`); a machine (with synchronous
/// machine detection, `Machine=true`) gets the voicemail message spoken by Plivo's `<Speak>`
/// and `<Hangup/>`, as Twilio's `<Say>` does.
fn outbound_answer(app: &Arc<App>, call_uuid: &str, fields: &[(String, String)]) -> Response<Body> {
    let request_uuid = field(fields, "RequestUUID")
        .or_else(|| field(fields, "ALegRequestUUID"))
        .unwrap_or("");
    let (Some(handle), Some(call)) = (app.calls.get(request_uuid), app.outbound_call(request_uuid))
    else {
        warn!(
            call_id = call_uuid,
            request_uuid,
            "plivo answer for an outbound leg that is not a live call of ours; hanging up"
        );
        return xml(pv::hangup_xml(None));
    };
    app.plivo
        .legs()
        .insert(request_uuid.to_string(), call_uuid.to_string());
    let machine = field(fields, "Machine").is_some_and(|m| m.eq_ignore_ascii_case("true"));
    if machine && call.machine_detection {
        info!(call_id = request_uuid, "outbound call reached a machine");
        app.store.tx.send(Write::Status {
            call_id: request_uuid.to_string(),
            status: None,
            outcome: Some("voicemail".into()),
            answered_by: Some("machine".into()),
            carrier_duration_s: None,
        });
        let _ = handle.hang_up("voicemail");
        return xml(match &call.voicemail_message {
            Some(m) => pv::speak_hangup_xml(m),
            None => pv::hangup_xml(None),
        });
    }
    app.store.tx.send(Write::Status {
        call_id: request_uuid.to_string(),
        status: None,
        outcome: Some("answered".into()),
        answered_by: call.machine_detection.then(|| "human".to_string()),
        carrier_duration_s: None,
    });
    let token = app.tokens.mint(request_uuid);
    let url = format!(
        "{}?t={token}",
        public_ws_url(
            &app.config.server.public_url,
            &format!("/plivo/media/{call_uuid}")
        )
    );
    info!(call_id = request_uuid, call_uuid, "outbound call answered");
    xml(pv::stream_xml(&url, pv::CONTENT_TYPE))
}

/// The status and outcome of an outbound call that ended with `cause` before anyone answered.
fn unanswered_outcome(cause: &str) -> Option<(&'static str, &'static str)> {
    match cause {
        "USER_BUSY" => Some(("busy", "busy")),
        "NO_ANSWER" | "ALLOTTED_TIMEOUT" => Some(("no-answer", "no_answer")),
        "CALL_REJECTED" | "UNALLOCATED_NUMBER" | "INVALID_NUMBER_FORMAT" => {
            Some(("failed", "failed"))
        }
        _ => None,
    }
}

/// `POST /plivo/hangup`: the call ended.
pub async fn hangup(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (_account, fields) = match signed(&app, req).await {
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
        .filter(|r| app.outbound_call(r).is_some())
        .map(str::to_string)
        .or_else(|| app.plivo.our_call_id(call_id));
    let call_id = ours.as_deref().unwrap_or(call_id);
    if ours.is_some() {
        let cause = field(&fields, "HangupCause").unwrap_or("");
        let answered = field(&fields, "AnswerTime").is_some();
        if !answered && let Some((status, outcome)) = unanswered_outcome(cause) {
            app.store.tx.send(Write::Status {
                call_id: call_id.to_string(),
                status: Some(status.into()),
                outcome: Some(outcome.into()),
                answered_by: None,
                carrier_duration_s: None,
            });
        }
        if let Some(d) = field(&fields, "Duration").and_then(|d| d.parse().ok()) {
            app.store.tx.send(Write::Status {
                call_id: call_id.to_string(),
                status: None,
                outcome: None,
                answered_by: None,
                carrier_duration_s: Some(d),
            });
        }
    }
    if let Some(h) = app.calls.get(call_id) {
        let _ = h.hang_up("carrier reported hangup");
    }
    empty(204)
}

/// `WS /plivo/media/{call}?t=<token>`: Plivo's audio stream.
pub async fn media(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if app.plivo.accounts.is_empty() {
        return not_configured();
    }
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
    media::accept(
        app,
        req,
        PlivoCodec::new(),
        TokenSource::Url(token),
        Some(pv::SUBPROTOCOL),
    )
}
