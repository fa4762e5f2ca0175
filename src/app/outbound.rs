//! The outbound call lifecycle, driven from one place: the `[carriers.NAME]` account's carrier
//! places the call (through the registry, no per-carrier code here), the call is recorded
//! (`queued`) and registered in [`crate::carrier::outbound::Outbound`], its actor is created as
//! soon as the carrier returns the call id (for Plivo the `request_uuid`, which stays our id),
//! so the answered call joins the same media path as an inbound one; when the actor ends the
//! call is marked ended (kept a while for late callbacks). The carrier's routes move the call
//! through its phases (answer, machine detection, voicemail) and report outcomes. Request
//! validation and limits are the API's (`crate::api::outbound`).

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::App;
use crate::call::registry::InsertError;
use crate::call::{CallSetup, actor};
use crate::carrier::outbound::{
    CallStatus, OutboundCall, Outcome, Phase, PlaceCall, PlaceError, StatusUpdate,
};
use crate::carrier::port::Host;
use crate::config::AgentConfig;
use crate::provider::AgentProviders;
use crate::security::mask_number;
use crate::store::{NewCall, Write};

/// Extra time an outbound call's actor waits for media beyond the ring time: answering-machine
/// detection (up to 30 s at Twilio) and a margin.
pub const ATTACH_MARGIN: Duration = Duration::from_secs(90);

/// A checked outbound call to place.
pub struct NewOutbound {
    /// `[carriers.NAME]` of the calling number.
    pub account: String,
    pub from: String,
    pub to: String,
    pub agent_name: String,
    pub agent: AgentConfig,
    pub providers: AgentProviders,
    pub machine_detection: bool,
    pub voicemail_message: Option<String>,
}

/// Why a call was not placed.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("[carriers.{0}] is not configured")]
    NoCarrier(String),
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("the daemon is at max_calls; try again when a call ends")]
    Full,
    #[error("duplicate call id")]
    Duplicate,
}

/// Places `call` and starts its actor; returns our call id.
pub async fn place(app: &Arc<App>, call: NewOutbound) -> Result<String, OutboundError> {
    let config = &app.config;
    let kind = config
        .carrier(&call.account)
        .map(|c| c.kind())
        .ok_or_else(|| OutboundError::NoCarrier(call.account.clone()))?;
    let carrier = app
        .carriers
        .get(kind)
        .ok_or_else(|| OutboundError::NoCarrier(call.account.clone()))?;
    let request = PlaceCall {
        from: call.from.clone(),
        to: call.to.clone(),
        machine_detection: call.machine_detection,
        ring_timeout_s: config.outbound.ring_timeout_s,
        time_limit_s: call.agent.max_duration_s,
        public_url: config.server.public_url.clone(),
    };
    let id = carrier
        .place_call(&call.account, request)
        .await
        .inspect_err(|e| {
            warn!(to = %mask_number(&call.to), error = %e, "outbound call failed");
        })?;
    app.store.tx.send(Write::Call(NewCall {
        call_id: id.clone(),
        carrier: kind.as_str().to_string(),
        carrier_account: call.account.clone(),
        direction: "outbound",
        from: call.from.clone(),
        to: call.to.clone(),
        agent: call.agent_name.clone(),
        status: CallStatus::Queued.as_str().into(),
    }));
    app.outbound.register(
        &id,
        OutboundCall {
            account: call.account.clone(),
            kind,
            machine_detection: call.machine_detection,
            voicemail_message: call.voicemail_message.filter(|m| !m.trim().is_empty()),
            leg_id: None,
            phase: Phase::Ringing,
        },
    );
    let setup = CallSetup {
        call_id: id.clone(),
        carrier: kind,
        carrier_account: call.account.clone(),
        from: call.from.clone(),
        to: call.to.clone(),
        outbound: true,
        agent_name: call.agent_name.clone(),
        agent: Arc::new(call.agent),
        providers: call.providers,
        attach_timeout: Duration::from_secs(u64::from(config.outbound.ring_timeout_s))
            + ATTACH_MARGIN,
        media_timeout: Duration::from_secs(30),
        log: Some(std::sync::Arc::new(app.store.tx.clone())),
    };
    if let Err(e) = actor::start(setup, app.calls.clone(), config.server.max_calls) {
        cancel_unanswered(app, &call.account, &id).await;
        app.outbound.remove(&id);
        app.report(StatusUpdate {
            status: Some(CallStatus::Canceled),
            ..StatusUpdate::outcome(&id, Outcome::Failed, None)
        });
        return Err(match e {
            InsertError::Full => OutboundError::Full,
            InsertError::Duplicate => OutboundError::Duplicate,
        });
    }
    info!(call_sid = %id, to = %mask_number(&call.to), from = %call.from, agent = %call.agent_name, "outbound call placed");
    // The call is over for the lifecycle when its actor ends.
    let watcher = app.clone();
    let watched = id.clone();
    tokio::spawn(async move {
        watcher.calls.wait_finished(&watched).await;
        watcher.outbound.ended(&watched);
    });
    Ok(id)
}

/// Ends a call we placed that has not been answered (it has no media stream to close), through
/// its carrier.
pub async fn cancel_unanswered(app: &Arc<App>, account: &str, id: &str) {
    let Some(carrier) = app.carriers.for_account(account) else {
        return;
    };
    if let Err(e) = carrier.cancel(account, id, &app.outbound).await {
        warn!(call_id = %id, error = %e, "could not cancel an unanswered outbound call");
    }
}
