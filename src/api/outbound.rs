//! Placing outbound calls (`POST /v1/calls`, MCP `make_call`). The request is checked before
//! any carrier is contacted — E.164 normalisation, the `from` number's `allowed_destinations`
//! (empty means outbound is refused), the concurrent and per-day caps, drain — then the `from`
//! number's carrier places the call: Twilio `POST Calls.json` (answer URL, status callback,
//! `MachineDetection`), Telnyx `POST /v2/calls` (dial: `connection_id`, webhook URL,
//! `answering_machine_detection`), Plivo `POST Call/` (answer and hangup URLs, synchronous
//! `machine_detection`). The call's actor is created as soon as the carrier returns the call id
//! (for Plivo, the `request_uuid`, which stays our id for the call), so the answered call joins
//! the same media path as an inbound one. Answers, machine detection and the outcome live in
//! each carrier's routes ([`crate::server::twilio`], [`crate::server::telnyx`],
//! [`crate::server::plivo`]). With `wait` the request returns when the call has ended, with its
//! outcome and transcript.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::ApiError;
use crate::call::{CallSetup, actor, registry::InsertError};
use crate::carrier::CarrierKind;
use crate::carrier::twilio::rest::CreateCall;
use crate::security::mask_number;
use crate::server::App;
use crate::store::{NewCall, Write, now_ms};

/// Extra time an outbound call's actor waits for media beyond the ring time: answering-machine
/// detection (up to 30 s at Twilio) and a margin.
const ATTACH_MARGIN: Duration = Duration::from_secs(90);

/// How long a Plivo call's `CallUUID` stays mapped to its `request_uuid` after it ends.
const PLIVO_LEG_KEEP: Duration = Duration::from_secs(120);

/// An originate request (`POST /v1/calls`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Originate {
    pub to: String,
    /// One of our `[[numbers]]`; default: the first whose `allowed_destinations` admit `to`.
    #[serde(default)]
    pub from: Option<String>,
    /// `[agents.NAME]`; default: the `from` number's agent.
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub first_message: Option<String>,
    /// A `[tts.NAME]` to speak with (unknown names keep the agent's voice).
    #[serde(default)]
    pub voice: Option<String>,
    #[serde(default)]
    pub machine_detection: bool,
    #[serde(default)]
    pub voicemail_message: Option<String>,
    #[serde(default)]
    pub wait: bool,
}

impl Originate {
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        serde_json::from_value(v).map_err(|e| {
            ApiError::bad_request(format!(
                "{e}; expected {{\"to\": \"+15551234567\", \"from\"?, \"agent\"?, \
                 \"system_prompt\"?, \"first_message\"?, \"voice\"?, \"machine_detection\"?, \
                 \"voicemail_message\"?, \"wait\"?}}"
            ))
        })
    }
}

/// What the answer webhook needs to know about a call we placed.
#[derive(Debug, Clone)]
pub struct OutboundCall {
    pub voicemail_message: Option<String>,
    pub machine_detection: bool,
}

/// Places the call; see the module docs.
pub async fn originate(app: &Arc<App>, req: Originate) -> Result<Value, ApiError> {
    let config = &app.config;
    let to = crate::config::normalize_e164(&req.to).ok_or_else(|| {
        ApiError::new(
            400,
            "invalid_number",
            format!(
                "{:?} is not a valid phone number: write it in E.164 with the country code, \
                 e.g. +15551234567",
                req.to
            ),
        )
    })?;
    let number = match &req.from {
        Some(from) => {
            let n = crate::config::normalize_e164(from)
                .and_then(|f| config.number(&f))
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "unknown_number",
                        format!(
                            "from {from:?} is not one of this daemon's [[numbers]]; configured: {}",
                            super::inbound::configured_numbers(app)
                        ),
                    )
                })?;
            if n.allowed_destinations.is_empty() {
                return Err(ApiError::new(
                    403,
                    "outbound_disabled",
                    format!(
                        "outbound calls from {} are disabled: add the destinations it may call \
                         (E.164 numbers or prefixes) to allowed_destinations in its [[numbers]] entry",
                        n.number
                    ),
                ));
            }
            if !n.allows_destination(&to) {
                return Err(destination_refused(&to, &n.number));
            }
            n
        }
        None => match config.numbers.iter().find(|n| n.allows_destination(&to)) {
            Some(n) => n,
            None if config
                .numbers
                .iter()
                .all(|n| n.allowed_destinations.is_empty()) =>
            {
                return Err(ApiError::new(
                    403,
                    "outbound_disabled",
                    "outbound calls are disabled: no [[numbers]] entry has allowed_destinations; \
                     add the destinations (E.164 numbers or prefixes) a number may call",
                ));
            }
            None => return Err(destination_refused(&to, "any configured number")),
        },
    };
    let agent_name = req.agent.clone().unwrap_or_else(|| number.agent.clone());
    let base_agent = config.agent(&agent_name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "agent {agent_name:?} is not configured; configured: {}",
            config.agents.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    })?;
    let mut agent = base_agent.clone();
    if let Some(p) = &req.system_prompt {
        agent.system_prompt = p.clone();
    }
    if let Some(m) = &req.first_message {
        agent.first_message = m.clone();
    }
    if let Some(v) = &req.voice
        && config.tts.contains_key(v)
    {
        agent.tts = v.clone();
    }
    let providers = app.providers.for_agent(&agent).ok_or_else(|| {
        ApiError::new(
            503,
            "agent_unavailable",
            format!("the providers of agent {agent_name} are not available; run `patterd check`"),
        )
    })?;
    if app.is_draining() {
        return Err(ApiError::new(
            503,
            "draining",
            "the daemon is shutting down and places no new calls; try again after it restarts",
        ));
    }
    let live = app.outbound_live();
    if live >= config.outbound.max_concurrent {
        return Err(ApiError::new(
            429,
            "concurrent_limit",
            format!(
                "{live} outbound calls are live, the limit ([outbound] max_concurrent); wait for \
                 one to end (get_calls) and try again"
            ),
        ));
    }
    let day_start = now_ms() - now_ms().rem_euclid(86_400_000);
    let today = app.store.outbound_since(day_start).await?;
    if today >= u64::from(config.outbound.max_per_day) {
        return Err(ApiError::new(
            429,
            "daily_limit",
            format!(
                "{today} outbound calls were placed today (UTC), the limit ([outbound] \
                 max_per_day); try again tomorrow or raise the limit"
            ),
        ));
    }
    let carrier = config.carrier(&number.carrier).map(|c| c.kind);
    let place = Place {
        account: &number.carrier,
        from: &number.number,
        to: &to,
        machine_detection: req.machine_detection,
        time_limit_s: agent.max_duration_s,
    };
    let placed = match carrier {
        Some(CarrierKind::Twilio) => place_twilio(app, &place).await?,
        Some(CarrierKind::Telnyx) => place_telnyx(app, &place).await?,
        Some(CarrierKind::Plivo) => place_plivo(app, &place).await?,
        None => {
            return Err(ApiError::new(
                503,
                "carrier_unconfigured",
                format!("[carriers.{}] is not configured", number.carrier),
            ));
        }
    };
    let Placed { call_id: sid, kind } = placed;
    let account_name = number.carrier.clone();
    app.store.tx.send(Write::Call(NewCall {
        call_id: sid.clone(),
        carrier: kind.as_str().to_string(),
        carrier_account: account_name.clone(),
        direction: "outbound",
        from: number.number.clone(),
        to: to.clone(),
        agent: agent_name.clone(),
        status: "queued".into(),
    }));
    app.register_outbound(
        &sid,
        OutboundCall {
            voicemail_message: req
                .voicemail_message
                .clone()
                .filter(|m| !m.trim().is_empty()),
            machine_detection: req.machine_detection,
        },
    );
    let setup = CallSetup {
        call_id: sid.clone(),
        carrier: kind,
        carrier_account: account_name.clone(),
        from: number.number.clone(),
        to: to.clone(),
        outbound: true,
        agent_name: agent_name.clone(),
        agent: Arc::new(agent.clone()),
        providers,
        attach_timeout: Duration::from_secs(u64::from(config.outbound.ring_timeout_s))
            + ATTACH_MARGIN,
        media_timeout: Duration::from_secs(30),
        store: Some(app.store.tx.clone()),
    };
    if let Err(e) = actor::start(setup, app.calls.clone(), config.server.max_calls) {
        app.forget_outbound(&sid);
        cancel_unanswered(app, &account_name, &sid).await;
        app.store.tx.send(Write::Status {
            call_id: sid.clone(),
            status: Some("canceled".into()),
            outcome: Some("failed".into()),
            answered_by: None,
            carrier_duration_s: None,
        });
        return Err(match e {
            InsertError::Full => ApiError::new(
                503,
                "busy",
                "the daemon is at max_calls; try again when a call ends",
            ),
            InsertError::Duplicate => ApiError::new(409, "duplicate", "duplicate call id"),
        });
    }
    info!(call_sid = %sid, to = %mask_number(&to), from = %number.number, agent = %agent_name, "outbound call placed");
    // Forget the outbound bookkeeping when the call ends.
    let watcher = app.clone();
    let watched = sid.clone();
    tokio::spawn(async move {
        watcher.calls.wait_finished(&watched).await;
        watcher.forget_outbound(&watched);
        if kind == CarrierKind::Plivo {
            // Plivo's hangup callback follows the end of the call; keep its leg id a while.
            tokio::time::sleep(PLIVO_LEG_KEEP).await;
            watcher.plivo.forget(&watched);
        }
    });
    if req.wait {
        let limit = Duration::from_secs(agent.max_duration_s)
            + Duration::from_secs(u64::from(config.outbound.ring_timeout_s))
            + ATTACH_MARGIN;
        let _ = tokio::time::timeout(limit, app.calls.wait_finished(&sid)).await;
        app.store.tx.flush().await?;
        return super::transcript_json(app, &sid).await;
    }
    app.store.tx.flush().await?;
    let mut v = super::call_json(app, &sid).await?;
    v["message"] = json!("call placed; poll GET /v1/calls/{id} or get_transcript for the result");
    Ok(v)
}

/// Where a call is placed from and to.
struct Place<'a> {
    /// `[carriers.NAME]`.
    account: &'a str,
    from: &'a str,
    to: &'a str,
    machine_detection: bool,
    /// The agent's maximum call duration (Plivo's `time_limit`).
    time_limit_s: u64,
}

/// A call the carrier accepted: our call id (the carrier's call id; for Plivo, its
/// `request_uuid`) and the carrier.
struct Placed {
    call_id: String,
    kind: CarrierKind,
}

fn unconfigured(account: &str, what: &str) -> ApiError {
    ApiError::new(
        503,
        "carrier_unconfigured",
        format!("[carriers.{account}] has no credentials; set {what}"),
    )
}

fn carrier_failed(to: &str, e: impl std::fmt::Display) -> ApiError {
    warn!(to = %mask_number(to), error = %e, "outbound call failed");
    ApiError::new(502, "carrier_error", format!("Failed to place call: {e}"))
}

/// Twilio: `POST Calls.json` with our answer URL and status callback.
async fn place_twilio(app: &Arc<App>, p: &Place<'_>) -> Result<Placed, ApiError> {
    let account = app
        .twilio
        .account(p.account)
        .ok_or_else(|| unconfigured(p.account, "account_sid and auth_token"))?;
    let public = &app.config.server.public_url;
    let create = CreateCall {
        to: p.to.to_string(),
        from: p.from.to_string(),
        twiml: None,
        url: Some(crate::carrier::twilio::public_request_url(
            public,
            "/twilio/outbound",
            None,
        )),
        status_callback: Some(crate::carrier::twilio::public_request_url(
            public,
            "/twilio/status",
            None,
        )),
        status_callback_events: ["initiated", "ringing", "answered", "completed"]
            .map(String::from)
            .to_vec(),
        timeout_s: Some(app.config.outbound.ring_timeout_s),
        machine_detection: p.machine_detection.then(|| "Enable".to_string()),
        async_amd_status_callback: None,
    };
    let sid = account
        .rest
        .create_call(&create)
        .await
        .map_err(|e| carrier_failed(p.to, e))?;
    Ok(Placed {
        call_id: sid,
        kind: CarrierKind::Twilio,
    })
}

/// Telnyx: `POST /v2/calls` (dial) with the connection's id and our webhook URL; the stream
/// starts on `call.answered` (or after machine detection), see [`crate::server::telnyx`].
async fn place_telnyx(app: &Arc<App>, p: &Place<'_>) -> Result<Placed, ApiError> {
    let account = app
        .telnyx
        .account(p.account)
        .ok_or_else(|| unconfigured(p.account, "api_key and public_key"))?;
    let connection_id = app
        .config
        .carrier(p.account)
        .map(|c| c.connection_id.trim().to_string())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            unconfigured(
                p.account,
                "connection_id (the Call Control application placing outbound calls)",
            )
        })?;
    let dial = crate::carrier::telnyx::rest::Dial {
        connection_id,
        from: p.from.to_string(),
        to: p.to.to_string(),
        webhook_url: crate::carrier::public_request_url(
            &app.config.server.public_url,
            "/telnyx/webhook",
            None,
        ),
        client_state: Some(crate::carrier::telnyx::rest::OUTBOUND_CLIENT_STATE.into()),
        timeout_secs: Some(app.config.outbound.ring_timeout_s),
        answering_machine_detection: p.machine_detection.then(|| "detect".to_string()),
        stream_url: None,
    };
    let id = account
        .rest
        .dial(&dial)
        .await
        .map_err(|e| carrier_failed(p.to, e))?;
    Ok(Placed {
        call_id: id,
        kind: CarrierKind::Telnyx,
    })
}

/// Plivo: `POST Call/` with our answer and hangup URLs; the call is known by its
/// `request_uuid` until the answer URL names its `CallUUID`, see [`crate::server::plivo`].
async fn place_plivo(app: &Arc<App>, p: &Place<'_>) -> Result<Placed, ApiError> {
    let account = app
        .plivo
        .account(p.account)
        .ok_or_else(|| unconfigured(p.account, "auth_id and auth_token"))?;
    let public = &app.config.server.public_url;
    let url = |path: &str| crate::carrier::public_request_url(public, path, None);
    let create = crate::carrier::plivo::rest::MakeCall {
        from: p.from.to_string(),
        to: p.to.to_string(),
        answer_url: url("/plivo/answer"),
        hangup_url: url("/plivo/hangup"),
        ring_timeout: app.config.outbound.ring_timeout_s,
        time_limit: p.time_limit_s,
        machine_detection: p.machine_detection,
    };
    let id = account
        .rest
        .make_call(&create)
        .await
        .map_err(|e| carrier_failed(p.to, e))?;
    Ok(Placed {
        call_id: id,
        kind: CarrierKind::Plivo,
    })
}

/// Ends a call we placed that has not been answered (it has no media stream to close): Twilio
/// `Status=canceled`, Telnyx `hangup`, Plivo cancels the request (or hangs up the call once
/// the answer URL has named it).
pub async fn cancel_unanswered(app: &Arc<App>, account: &str, id: &str) {
    let result = if let Some(a) = app.twilio.account(account) {
        a.rest
            .update_call(id, &[("Status", "canceled")])
            .await
            .map(|_| ())
    } else if let Some(a) = app.telnyx.account(account) {
        a.rest.hang_up(id).await
    } else if let Some(a) = app.plivo.account(account) {
        match app.plivo.call_uuid(id) {
            Some(uuid) => a.rest.hang_up(&uuid).await,
            None => a.rest.cancel_request(id).await,
        }
    } else {
        Ok(())
    };
    if let Err(e) = result {
        warn!(call_id = %id, error = %e, "could not cancel an unanswered outbound call");
    }
}

fn destination_refused(to: &str, from: &str) -> ApiError {
    ApiError::new(
        403,
        "destination_not_allowed",
        format!(
            "{to} is not an allowed destination for {from}: add it (or a prefix of it) to \
             allowed_destinations in the [[numbers]] entry of the number calling out"
        ),
    )
}
