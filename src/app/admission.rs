//! The carrier-neutral decision on an incoming call, shared by every carrier's routes: refuse
//! while draining, find the `[[numbers]]` entry for the dialled number on this carrier account
//! (numbers normalized to E.164, so Plivo's `15550001234` matches `+15550001234`), check the
//! caller against `allowed_callers` and the runtime overrides, find the agent's providers, and
//! start the call's actor (which refuses beyond `max_calls`). Carriers reach it through
//! [`crate::carrier::port::Host::admit`] and turn a [`Refusal`] into their own reject;
//! numbers are only ever logged masked. A call id is admitted once: one that is live, recently
//! finished or in the call store is a replayed webhook ([`Refusal::Repeated`]).
//!
//! The order is the cheap local checks first (draining, a live or just-finished call id,
//! number, allow-list, agent), then the claim of the call id ([`super::replay::claim`]: in a
//! cluster one insert of the call's row in the shared store, which only one instance wins; with
//! SQLite a look-up of the store), then the actor. A call refused after its claim closes the
//! claimed row. In a cluster a full instance refuses before the claim, so that the peer it
//! hands the webhook to can claim the call id.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::metrics::{Metrics, RefusalReason};
use super::replay::{self, Claim};
use super::{App, Generation};
use crate::call::registry::InsertError;
use crate::call::{CallSetup, actor};
use crate::carrier::port::{Admitted, Direct, IncomingCall, Refusal};
use crate::security::mask_number;
use crate::store::{NewCall, Write};
use crate::util::phone::normalize_e164;

/// Decides on an incoming call and, when it is accepted, starts its actor (which pre-opens
/// speech-to-text and synthesises the greeting while the phone rings).
pub(crate) async fn admit(app: &App, call: IncomingCall<'_>) -> Result<Admitted, Refusal> {
    let carrier = call.carrier.as_str();
    let call_id = call.call_id;
    let from = mask_number(call.from);
    let to = mask_number(call.to);
    if app.is_draining() || app.is_fenced() {
        Metrics::inc(&app.metrics.calls_rejected_busy);
        app.metrics.webhooks_refused.inc(RefusalReason::Busy);
        let why = if app.is_draining() {
            "draining"
        } else {
            "fenced"
        };
        info!(carrier, call_id, %from, %to, "call refused: {why}");
        return Err(Refusal::Draining);
    }
    if live_here(app, call_id) {
        return Err(repeated_here(app, call_id, "a replayed webhook"));
    }
    if full_in_cluster(app) {
        Metrics::inc(&app.metrics.calls_rejected_busy);
        app.metrics.webhooks_refused.inc(RefusalReason::Busy);
        info!(carrier, call_id, %from, %to, "call refused: max_calls reached");
        return Err(Refusal::Full);
    }
    let dialled = normalize_e164(call.to).unwrap_or_else(|| call.to.to_string());
    // One generation for the whole admission (a reload may swap it meanwhile).
    let generation = app.current();
    let config = &generation.config;
    let Some(number) = config
        .numbers
        .iter()
        .find(|n| n.number == dialled && n.carrier == call.account)
    else {
        Metrics::inc(&app.metrics.calls_rejected_unknown_number);
        app.metrics
            .webhooks_refused
            .inc(RefusalReason::UnknownNumber);
        info!(carrier, call_id, %from, %to, "call refused: number not in [[numbers]] for this carrier");
        return Err(Refusal::UnknownNumber);
    };
    if !number.allows_caller(call.from) {
        Metrics::inc(&app.metrics.calls_rejected_caller);
        app.metrics
            .webhooks_refused
            .inc(RefusalReason::CallerNotAllowed);
        info!(carrier, call_id, %from, %to, "call refused: caller not in allowed_callers");
        return Err(Refusal::CallerNotAllowed);
    }
    let overrides = super::inbound::effective(app, &number.number);
    if overrides.enabled == Some(false) {
        Metrics::inc(&app.metrics.calls_rejected_caller);
        app.metrics
            .webhooks_refused
            .inc(RefusalReason::CallerNotAllowed);
        info!(carrier, call_id, %from, %to, "call refused: inbound disabled by configure_inbound");
        return Err(Refusal::Disabled);
    }
    let Some((agent, providers)) = config
        .agents
        .get(&number.agent)
        .map(|a| overrides.apply(a))
        .and_then(|a| {
            let p = generation.providers.for_agent(&a)?;
            Some((a, p))
        })
    else {
        warn!(carrier, agent = %number.agent, "call refused: the agent's providers are not available");
        return Err(Refusal::AgentUnavailable);
    };
    launch(
        app,
        &generation,
        Launch {
            carrier: call.carrier,
            account: call.account,
            call_id,
            from: normalize_e164(call.from).unwrap_or_else(|| call.from.to_string()),
            to: dialled,
            agent_name: &number.agent,
            agent,
            providers,
        },
        "a replayed webhook",
    )
    .await?;
    Metrics::inc(&app.metrics.calls_accepted);
    info!(carrier, call_id, %from, %to, agent = %number.agent, "call accepted");
    Ok(Admitted {
        agent: number.agent.clone(),
    })
}

/// True in a cluster when this instance already carries `max_calls`: it says so before the
/// claim, so the call id stays free for the ready peer the webhook is handed to
/// (`cluster::handoff`). One instance finds it out when the actor starts, as before.
fn full_in_cluster(app: &App) -> bool {
    #[cfg(feature = "postgres")]
    if app.cluster.is_some() {
        return app.calls.len() >= app.server.max_calls;
    }
    let _ = app;
    false
}

/// A call that is accepted: what [`launch`] needs to start it.
struct Launch<'a> {
    carrier: crate::carrier::CarrierKind,
    account: &'a str,
    call_id: &'a str,
    from: String,
    to: String,
    agent_name: &'a str,
    agent: crate::config::AgentConfig,
    providers: crate::provider::AgentProviders,
}

/// Claims the call id of an accepted call ([`replay::claim`]; `repeat` says what a repeat
/// means, for the log), then starts its actor and records it (`max_calls` and a racing
/// duplicate still refuse it here; a refused call's claimed row is closed).
async fn launch(
    app: &App,
    generation: &Generation,
    l: Launch<'_>,
    repeat: &str,
) -> Result<(), Refusal> {
    let carrier = l.carrier.as_str();
    let call_id = l.call_id;
    let record = NewCall {
        call_id: call_id.to_string(),
        carrier: carrier.into(),
        carrier_account: l.account.to_string(),
        direction: "inbound",
        from: l.from.clone(),
        to: l.to.clone(),
        agent: l.agent_name.to_string(),
        status: "ringing".into(),
    };
    let claim = replay::claim(app, &record, repeat).await?;
    let setup = CallSetup {
        call_id: call_id.to_string(),
        carrier: l.carrier,
        carrier_account: l.account.to_string(),
        from: l.from,
        to: l.to,
        outbound: false,
        agent_name: l.agent_name.to_string(),
        agent: Arc::new(l.agent),
        providers: l.providers,
        attach_timeout: super::MEDIA_TOKEN_TTL,
        media_timeout: Duration::from_secs(30),
        log: None,
        tools: None,
        recording: None,
        turn_model: None,
        call_token: None,
        tracing: None,
    };
    let setup = CallSetup {
        log: Some(app.call_log(&setup)),
        ..setup
    };
    let setup = super::with_tools(app, generation, setup);
    match actor::start(setup, app.calls.clone(), generation.config.server.max_calls) {
        // A shared claim already wrote the row; a local one queues it now.
        Ok(_) if claim == Claim::Shared => true,
        Ok(_) => app.store.tx.send(Write::Call(record)),
        Err(InsertError::Full) => {
            Metrics::inc(&app.metrics.calls_rejected_busy);
            app.metrics.webhooks_refused.inc(RefusalReason::Busy);
            info!(carrier, call_id, "call refused: max_calls reached");
            replay::unstarted(app, claim, call_id, "refused: max_calls reached").await;
            return Err(Refusal::Full);
        }
        Err(InsertError::Duplicate) => {
            // Two copies of one webhook racing: the first one started the call.
            Metrics::inc(&app.metrics.webhooks_replayed);
            app.metrics.webhooks_refused.inc(RefusalReason::Replayed);
            info!(carrier, call_id, "repeated webhook for a live call refused");
            return Err(Refusal::Repeated);
        }
    };
    Ok(())
}

/// Decides on a call that names its agent (the browser phone): refuse while draining or for a
/// call id already handled (a phone link used twice), pick the agent (the named one, else the
/// first configured), build its providers and start the same call actor as a phone call.
pub(crate) async fn admit_direct(app: &App, call: Direct<'_>) -> Result<Admitted, Refusal> {
    let carrier = call.carrier.as_str();
    let call_id = call.call_id;
    if app.is_draining() || app.is_fenced() {
        Metrics::inc(&app.metrics.calls_rejected_busy);
        info!(carrier, call_id, "call refused: draining or fenced");
        return Err(Refusal::Draining);
    }
    if live_here(app, call_id) {
        return Err(repeated_here(app, call_id, "a link used twice"));
    }
    let generation = app.current();
    let config = &generation.config;
    let name = match call.agent {
        Some(a) => a.to_string(),
        None => match config.agents.keys().next() {
            Some(a) => a.clone(),
            None => return Err(Refusal::UnknownAgent),
        },
    };
    let Some(agent) = config.agents.get(&name) else {
        info!(carrier, call_id, "call refused: no such agent");
        return Err(Refusal::UnknownAgent);
    };
    let Some(providers) = generation.providers.for_agent(agent) else {
        warn!(carrier, agent = %name, "call refused: the agent's providers are not available");
        return Err(Refusal::AgentUnavailable);
    };
    launch(
        app,
        &generation,
        Launch {
            carrier: call.carrier,
            account: call.account,
            call_id,
            from: call.from.to_string(),
            to: format!("agent:{name}"),
            agent_name: &name,
            agent: agent.clone(),
            providers,
        },
        "a link used twice",
    )
    .await?;
    Metrics::inc(&app.metrics.calls_accepted);
    info!(carrier, call_id, agent = %name, "call accepted");
    Ok(Admitted { agent: name })
}

/// True when `call_id` is live or recently finished on this instance (the cheap check before
/// the store is asked).
fn live_here(app: &App, call_id: &str) -> bool {
    app.calls.get(call_id).is_some() || app.calls.finished(call_id).is_some()
}

/// Counts and logs a call id this instance already handled; `what` it means.
fn repeated_here(app: &App, call_id: &str, what: &str) -> Refusal {
    Metrics::inc(&app.metrics.webhooks_replayed);
    app.metrics.webhooks_refused.inc(RefusalReason::Replayed);
    app.log_limited(&format!(
        "call refused: call id {} was already handled ({what})",
        crate::security::truncate_for_log(call_id, crate::security::LOG_FIELD_MAX)
    ));
    Refusal::Repeated
}
