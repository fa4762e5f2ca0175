//! The originate operation (`POST /v1/calls`, MCP `make_call`). The request is checked before
//! any carrier is contacted — E.164 normalisation, the `from` number's `allowed_destinations`
//! (empty means outbound is refused), the agent and its providers, drain, then a reservation
//! under the concurrent and per-day caps taken atomically ([`crate::app::dialer::reserve`],
//! so parallel requests cannot all pass) — then [`crate::app::dialer::place_reserved`] has the `from` number's carrier place
//! the call and starts its actor. Answers, machine detection and the outcome are each
//! carrier's routes' (`crate::carrier::<name>::routes`). With `wait` the request returns when
//! the call has ended, with its outcome and transcript.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ErrorCode};
use crate::app::App;
use crate::app::dialer::{self, ATTACH_MARGIN, CapError, NewOutbound, OutboundError};
use crate::carrier::dial::PlaceError;
use crate::config::{AgentConfig, Config, NumberConfig};

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
    pub(crate) fn from_json(v: Value) -> Result<Self, ApiError> {
        serde_json::from_value(v).map_err(|e| {
            ApiError::bad_request(format!(
                "{e}; expected {{\"to\": \"+15551234567\", \"from\"?, \"agent\"?, \
                 \"system_prompt\"?, \"first_message\"?, \"voice\"?, \"machine_detection\"?, \
                 \"voicemail_message\"?, \"wait\"?}}"
            ))
        })
    }
}

/// Places the call; see the module docs.
pub async fn originate(app: &Arc<App>, req: Originate) -> Result<Value, ApiError> {
    let generation = app.current();
    let config = &generation.config;
    let to = crate::util::phone::normalize_e164(&req.to).ok_or_else(|| {
        ApiError::new(
            400,
            ErrorCode::InvalidNumber,
            format!(
                "{:?} is not a valid phone number: write it in E.164 with the country code, \
                 e.g. +15551234567",
                req.to
            ),
        )
    })?;
    let number = match &req.from {
        Some(from) => named_from_number(app, config, from, &to)?,
        None => default_from_number(config, &to)?,
    };
    let (agent_name, agent) = call_agent(config, &req, number)?;
    let providers = generation.providers.for_agent(&agent).ok_or_else(|| {
        ApiError::new(
            503,
            ErrorCode::AgentUnavailable,
            format!("the providers of agent {agent_name} are not available; run `patterd check`"),
        )
    })?;
    if app.is_draining() {
        return Err(ApiError::new(
            503,
            ErrorCode::Draining,
            "the daemon is shutting down and places no new calls; try again after it restarts",
        ));
    }
    if app.is_fenced() {
        // Not a drain, but the same answer: no new calls until the heartbeat is renewed.
        return Err(ApiError::new(
            503,
            ErrorCode::Draining,
            "this instance cannot renew its cluster heartbeat and places no new calls until it \
             can; try another instance",
        ));
    }
    // The caps, reserved atomically before the carrier is dialled (released if the dial fails).
    let reservation = dialer::reserve(app, &number.number)
        .await
        .map_err(cap_error)?;
    let placed = dialer::place_reserved(
        app,
        NewOutbound {
            account: number.carrier.clone(),
            from: number.number.clone(),
            to: to.clone(),
            agent_name: agent_name.clone(),
            agent: agent.clone(),
            providers,
            generation: generation.clone(),
            machine_detection: req.machine_detection,
            voicemail_message: req.voicemail_message.clone(),
        },
        reservation,
    )
    .await;
    let sid = placed.map_err(place_error)?;
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

/// The request's `from`: one of our numbers, with outbound enabled and `to` allowed.
fn named_from_number<'c>(
    app: &App,
    config: &'c Config,
    from: &str,
    to: &str,
) -> Result<&'c NumberConfig, ApiError> {
    let n = crate::util::phone::normalize_e164(from)
        .and_then(|f| config.number(&f))
        .ok_or_else(|| {
            ApiError::new(
                400,
                ErrorCode::UnknownNumber,
                format!(
                    "from {from:?} is not one of this daemon's [[numbers]]; configured: {}",
                    super::inbound::configured_numbers(app)
                ),
            )
        })?;
    if n.allowed_destinations.is_empty() {
        return Err(ApiError::new(
            403,
            ErrorCode::OutboundDisabled,
            format!(
                "outbound calls from {} are disabled: add the destinations it may call \
                 (E.164 numbers or prefixes) to allowed_destinations in its [[numbers]] entry",
                n.number
            ),
        ));
    }
    if !n.allows_destination(to) {
        return Err(destination_refused(to, &n.number));
    }
    Ok(n)
}

/// No `from` given: the first number whose `allowed_destinations` admit `to`.
fn default_from_number<'c>(config: &'c Config, to: &str) -> Result<&'c NumberConfig, ApiError> {
    match config.numbers.iter().find(|n| n.allows_destination(to)) {
        Some(n) => Ok(n),
        None if config
            .numbers
            .iter()
            .all(|n| n.allowed_destinations.is_empty()) =>
        {
            Err(ApiError::new(
                403,
                ErrorCode::OutboundDisabled,
                "outbound calls are disabled: no [[numbers]] entry has allowed_destinations; \
                 add the destinations (E.164 numbers or prefixes) a number may call",
            ))
        }
        None => Err(destination_refused(to, "any configured number")),
    }
}

/// The agent's name and its config with the request's prompt, first message and voice applied.
fn call_agent(
    config: &Config,
    req: &Originate,
    number: &NumberConfig,
) -> Result<(String, AgentConfig), ApiError> {
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
        agent.tts = v.as_str().into();
    }
    Ok((agent_name, agent))
}

fn cap_error(e: CapError) -> ApiError {
    match e {
        CapError::Concurrent { .. } => {
            ApiError::new(429, ErrorCode::ConcurrentLimit, e.to_string())
        }
        CapError::Daily { .. } => ApiError::new(429, ErrorCode::DailyLimit, e.to_string()),
        CapError::Store(e) => ApiError::from(e),
        CapError::Unavailable(_) => ApiError::new(503, ErrorCode::CapsUnavailable, e.to_string()),
    }
}

fn place_error(e: OutboundError) -> ApiError {
    match e {
        e @ (OutboundError::NoCarrier(_)
        | OutboundError::Place(PlaceError::Unconfigured { .. })) => {
            ApiError::new(503, ErrorCode::CarrierUnconfigured, e.to_string())
        }
        OutboundError::Place(PlaceError::Carrier(e)) => ApiError::new(
            502,
            ErrorCode::CarrierError,
            format!("Failed to place call: {e}"),
        ),
        e @ OutboundError::Full => ApiError::new(503, ErrorCode::Busy, e.to_string()),
        e @ OutboundError::Duplicate => ApiError::new(409, ErrorCode::Duplicate, e.to_string()),
        e @ OutboundError::Abandoned => ApiError::new(503, ErrorCode::Abandoned, e.to_string()),
    }
}

fn destination_refused(to: &str, from: &str) -> ApiError {
    ApiError::new(
        403,
        ErrorCode::DestinationNotAllowed,
        format!(
            "{to} is not an allowed destination for {from}: add it (or a prefix of it) to \
             allowed_destinations in the [[numbers]] entry of the number calling out"
        ),
    )
}
