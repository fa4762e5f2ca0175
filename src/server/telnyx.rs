//! Telnyx's routes: `POST /telnyx/webhook` (Ed25519-signed Call Control events) and
//! `WS /telnyx/media/{token}` (media streaming, handed to the carrier-neutral pump). Webhooks
//! are acknowledged at once and commands run in the background, as Telnyx retries slow
//! webhooks: `call.initiated` → admission → `answer` (or Telnyx's own `reject`, cause
//! `USER_BUSY` / `CALL_REJECTED`); `call.answered` → `streaming_start` with a single-use media
//! token as the last path segment of `stream_url`; `call.hangup` and `streaming.failed` end
//! the call; anything else gets 200 and is ignored. The wire details live in
//! [`crate::carrier::telnyx`].
//!
//! Calls we dialled (`POST /v1/calls`, see [`crate::api::outbound`]) use the same events:
//! `call.initiated` (`outgoing`) is ignored; `call.answered` starts the stream and records the
//! outcome `answered` — unless machine detection was asked for, in which case the stream waits
//! for `call.machine.detection.ended` (at most 10 s): a person (or `not_sure`, or no result in
//! time) gets the stream, a machine gets
//! the voicemail message spoken by Telnyx's own `speak` verb (the agent's TTS is never
//! connected to a machine) and a `hangup` when `call.speak.ended` arrives. A `call.hangup` before
//! the answer gives the outcome from its cause: `user_busy` → busy, `no_answer`/`timeout` →
//! no_answer, `call_rejected`/`not_found`/`unallocated_number` → failed.

use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use tracing::{debug, info, warn};

use super::App;
use super::admission::{self, Inbound};
use super::http::{Body, empty, read_body, text};
use super::media::{self, CarrierControl, TokenSource};
use super::metrics::Metrics;
use crate::carrier::telnyx::{self as tx, StreamParams, TelnyxCodec, TelnyxRest, WebhookEnvelope};
use crate::carrier::{CarrierKind, public_ws_url};
use crate::config::Config;
use crate::store::Write;

/// A configured Telnyx account (`kind = "telnyx"` with `api_key` and `public_key`).
pub struct TelnyxAccount {
    pub name: String,
    public_key: String,
    pub rest: Arc<TelnyxRest>,
}

/// How long a webhook's `data.id` is remembered for de-duplication (retries, replays within
/// the 300 s signature window).
const SEEN_TTL_S: u64 = 600;
/// Most event ids remembered.
const SEEN_MAX: usize = 100_000;

/// Every configured Telnyx account. Empty means Telnyx's routes answer 503.
#[derive(Default)]
pub struct TelnyxCarriers {
    pub accounts: Vec<TelnyxAccount>,
    /// Event ids already handled, with when.
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Outbound calls speaking their voicemail message: hung up on `call.speak.ended`.
    voicemail: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Answered outbound calls waiting for `call.machine.detection.ended`.
    detecting: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// How long an answered call waits for machine detection before it is treated as a person
/// (Telnyx's `detect` decides within a few seconds; a lost webhook must not leave the callee
/// listening to silence).
const DETECTION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl TelnyxCarriers {
    pub fn from_config(config: &Config) -> Self {
        let accounts = config
            .carriers
            .iter()
            .filter(|(_, c)| c.kind == CarrierKind::Telnyx && c.missing_credentials().is_empty())
            .filter_map(|(name, c)| {
                if let Err(e) = tx::signature::decode_public_key(&c.public_key) {
                    tracing::error!(carrier = %name, error = %e, "telnyx account unusable");
                    return None;
                }
                match TelnyxRest::from_config(c) {
                    Ok(rest) => Some(TelnyxAccount {
                        name: name.clone(),
                        public_key: c.public_key.trim().to_string(),
                        rest: Arc::new(rest),
                    }),
                    Err(e) => {
                        tracing::error!(carrier = %name, error = %e, "telnyx account unusable");
                        None
                    }
                }
            })
            .collect();
        Self {
            accounts,
            seen: Default::default(),
            voicemail: Default::default(),
            detecting: Default::default(),
        }
    }

    /// Records an event id; false if it was already handled recently (a retry or a replay).
    fn first_time(&self, id: &str, now: u64) -> bool {
        if id.is_empty() {
            return true;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= SEEN_MAX {
            seen.retain(|_, t| now.saturating_sub(*t) <= SEEN_TTL_S);
            if seen.len() >= SEEN_MAX {
                seen.clear();
            }
        }
        seen.insert(id.to_string(), now).is_none()
    }

    pub fn account(&self, name: &str) -> Option<&TelnyxAccount> {
        self.accounts.iter().find(|a| a.name == name)
    }

    fn detecting(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.detecting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CarrierControl for TelnyxRest {
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
        "telnyx is not configured: set api_key and public_key in [carriers.<name>]\n",
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `POST /telnyx/webhook`: a Call Control event.
pub async fn webhook(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if app.telnyx.accounts.is_empty() {
        return not_configured();
    }
    let (parts, body) = req.into_parts();
    let body = match read_body(body, app.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.response(),
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let signature = header(tx::SIGNATURE_HEADER);
    let timestamp = header(tx::TIMESTAMP_HEADER);
    let now = unix_now();
    let mut last_error = None;
    let account = app.telnyx.accounts.iter().find(|a| {
        match tx::verify_webhook(
            &a.public_key,
            signature.as_deref(),
            timestamp.as_deref(),
            &body,
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
        Metrics::inc(&app.metrics.webhooks_forbidden);
        warn!(
            error = %last_error.map(|e| e.to_string()).unwrap_or_default(),
            "telnyx webhook refused: bad or missing telnyx-signature-ed25519 (check public_key and the server clock)"
        );
        return empty(403);
    };
    let event = match WebhookEnvelope::parse(&body) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "telnyx webhook without the fields patterd needs");
            return text(400, "not a Call Control event\n");
        }
    };
    let id = event.call.call_control_id.clone();
    if !app.telnyx.first_time(&event.id, now) {
        debug!(call_id = %id, event_id = %event.id, "telnyx webhook already handled");
        return empty(200);
    }
    let outbound = app.outbound_call(&id);
    match event.event_type.as_str() {
        "call.initiated" => on_initiated(&app, account, &event),
        "call.answered" => match outbound {
            Some(call) if call.machine_detection => {
                debug!(call_id = %id, "outbound call answered; waiting for machine detection");
                app.telnyx.detecting().insert(id.clone());
                let app = app.clone();
                let account = account.name.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(DETECTION_WAIT).await;
                    if app.telnyx.detecting().remove(&id)
                        && let Some(a) = app.telnyx.account(&account)
                    {
                        warn!(call_id = %id, "no machine detection result; treating the callee as a person");
                        record_outcome(&app, &id, None, "answered", Some("unknown"));
                        on_answered(&app, a, &id);
                    }
                });
            }
            Some(_) => {
                record_outcome(&app, &id, None, "answered", None);
                on_answered(&app, account, &id);
            }
            None => on_answered(&app, account, &id),
        },
        "call.machine.detection.ended" => {
            let pending = app.telnyx.detecting().remove(&id);
            if let Some(call) = outbound.filter(|_| pending) {
                let result = event.call.result.as_deref().unwrap_or("not_sure");
                if result == "machine" {
                    on_machine(&app, account, &id, call.voicemail_message);
                } else {
                    record_outcome(&app, &id, None, "answered", Some(result));
                    on_answered(&app, account, &id);
                }
            }
        }
        "call.speak.ended" => {
            let pending = app
                .telnyx
                .voicemail
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            if pending {
                let rest = account.rest.clone();
                tokio::spawn(async move {
                    if let Err(e) = rest.hang_up(&id).await {
                        warn!(call_id = %id, error = %e, "telnyx hangup after the voicemail message failed");
                    }
                });
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
                && let Some((status, outcome)) = unanswered_outcome(cause)
            {
                record_outcome(&app, &id, Some(status), outcome, None);
            }
            app.telnyx
                .voicemail
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            app.telnyx.detecting().remove(&id);
            if let Some(h) = app.calls.get(&id) {
                let _ = h.hang_up("carrier reported hangup");
            }
        }
        "streaming.failed" => {
            warn!(
                call_id = %id,
                reason = event.call.failure_reason.as_deref().unwrap_or(""),
                "telnyx could not open the media stream"
            );
            if let Some(h) = app.calls.get(&id) {
                let _ = h.hang_up("media stream failed");
            }
        }
        other => debug!(call_id = %id, event = other, "telnyx event ignored"),
    }
    empty(200)
}

/// The status and outcome of an outbound call that ended with `cause` before anyone answered.
fn unanswered_outcome(cause: &str) -> Option<(&'static str, &'static str)> {
    match cause {
        "user_busy" => Some(("busy", "busy")),
        "no_answer" | "timeout" => Some(("no-answer", "no_answer")),
        "call_rejected" | "not_found" | "unallocated_number" => Some(("failed", "failed")),
        _ => None,
    }
}

fn record_outcome(
    app: &App,
    id: &str,
    status: Option<&str>,
    outcome: &str,
    answered_by: Option<&str>,
) {
    app.store.tx.send(Write::Status {
        call_id: id.to_string(),
        status: status.map(str::to_string),
        outcome: Some(outcome.to_string()),
        answered_by: answered_by.map(str::to_string),
        carrier_duration_s: None,
    });
}

/// Machine detection heard a machine: the voicemail message (Telnyx speaks it, then we hang
/// up on `call.speak.ended`) or a hang-up at once. The call's actor ends; it never had media.
fn on_machine(app: &Arc<App>, account: &TelnyxAccount, id: &str, message: Option<String>) {
    info!(call_id = %id, "outbound call reached a machine");
    record_outcome(app, id, None, "voicemail", Some("machine"));
    if let Some(h) = app.calls.get(id) {
        let _ = h.hang_up("voicemail");
    }
    let rest = account.rest.clone();
    let id = id.to_string();
    if message.is_some() {
        app.telnyx
            .voicemail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
    }
    tokio::spawn(async move {
        let result = match message {
            Some(m) => rest.speak(&id, &m).await,
            None => rest.hang_up(&id).await,
        };
        if let Err(e) = result {
            warn!(call_id = %id, error = %e, "telnyx voicemail command failed; hanging up");
            let _ = rest.hang_up(&id).await;
        }
    });
}

fn on_initiated(app: &Arc<App>, account: &TelnyxAccount, event: &WebhookEnvelope) {
    let call = &event.call;
    if call.direction != "incoming" {
        debug!(call_id = %call.call_control_id, direction = %call.direction, "telnyx call.initiated for a call we did not receive; ignored");
        return;
    }
    let inbound = Inbound {
        carrier: CarrierKind::Telnyx,
        account: &account.name,
        call_id: &call.call_control_id,
        from: &call.from,
        to: &call.to,
    };
    let rest = account.rest.clone();
    let id = call.call_control_id.clone();
    match admission::admit(app, inbound) {
        Ok(a) if a.repeated => {}
        Ok(_) => {
            let app = app.clone();
            tokio::spawn(async move {
                if let Err(e) = rest.answer(&id, &format!("answer-{id}"), None).await {
                    warn!(call_id = %id, error = %e, "telnyx answer failed; ending the call");
                    if let Some(h) = app.calls.get(&id) {
                        let _ = h.hang_up("carrier answer failed");
                    }
                }
            });
        }
        Err(r) => {
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
}

fn on_answered(app: &Arc<App>, account: &TelnyxAccount, id: &str) {
    let Some(h) = app.calls.get(id) else {
        debug!(call_id = %id, "telnyx call.answered for a call that is not live");
        return;
    };
    if *h.carrier_account != *account.name {
        warn!(call_id = %id, "telnyx call.answered signed by another account; ignored");
        return;
    }
    let token = app.tokens.mint(id);
    let params = StreamParams {
        stream_url: public_ws_url(
            &app.config.server.public_url,
            &format!("/telnyx/media/{token}"),
        ),
        ..StreamParams::default()
    };
    let rest = account.rest.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        if let Err(e) = rest
            .streaming_start(&id, &format!("stream-{id}"), &params)
            .await
        {
            warn!(call_id = %id, error = %e, "telnyx streaming_start failed; ending the call");
            let _ = h.hang_up("carrier stream failed");
        }
    });
}

/// `WS /telnyx/media/{token}`: Telnyx's media stream; the last path segment is the call's
/// single-use media token.
pub async fn media(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if app.telnyx.accounts.is_empty() {
        return not_configured();
    }
    let token = req
        .uri()
        .path()
        .strip_prefix("/telnyx/media/")
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .map(str::to_string);
    let Some(token) = token else {
        return text(404, "not found\n");
    };
    media::accept(
        app,
        req,
        TelnyxCodec::new(),
        TokenSource::Url(Some(token)),
        None,
    )
}
