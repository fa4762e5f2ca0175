//! The outbound call lifecycle, driven from one place: the `[carriers.NAME]` account's carrier
//! places the call (through the registry, no per-carrier code here), the call is recorded
//! (`queued`) and registered in [`crate::carrier::dial::Outbound`], its actor is created as
//! soon as the carrier returns the call id (for Plivo the `request_uuid`, which stays our id),
//! so the answered call joins the same media path as an inbound one; when the actor ends the
//! call is marked ended (kept a while for late callbacks). The carrier's routes move the call
//! through its phases (answer, machine detection, voicemail) and report outcomes. Request
//! validation is the API's (`crate::api::originate`).
//!
//! The caps (`[outbound] max_concurrent`, `max_per_day`) are a [`Reservation`] taken with
//! [`reserve`] before the carrier is dialled, atomically (one lock over the live calls and the
//! reservations in flight), so N parallel requests cannot all pass the check before any of them
//! is registered. The reservation is released if the dial fails and becomes the placed call when
//! it succeeds. With the PostgreSQL store the caps hold across the cluster: a reservation is a
//! row granted under a row lock (`app::cluster::caps`), bound to the call id the carrier
//! returns, freed when the call ends; with SQLite they are this process's. [`place_reserved`] dials in a task of its own: a requester that goes away
//! mid-dial (an HTTP client disconnecting drops the request's future) cannot leave a call the
//! carrier placed that we never recorded — when the dial returns and nobody waits for it, the
//! call is cancelled at the carrier and recorded as canceled.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::App;
use crate::call::registry::InsertError;
use crate::call::{CallSetup, actor};
use crate::carrier::dial::{
    CallOutcome, CallStatus, OutboundCall, Phase, PlaceCall, PlaceError, StatusUpdate,
};
use crate::carrier::port::Host;
use crate::config::AgentConfig;
use crate::provider::AgentProviders;
use crate::security::mask_number;
use crate::store::{NewCall, StoreError, Write, now_ms};

/// Extra time an outbound call's actor waits for media beyond the ring time: answering-machine
/// detection (up to 30 s at Twilio) and a margin.
pub(crate) const ATTACH_MARGIN: Duration = Duration::from_secs(90);

/// A checked outbound call to place.
pub(crate) struct NewOutbound {
    /// `[carriers.NAME]` of the calling number.
    pub account: String,
    pub from: String,
    pub to: String,
    pub(crate) agent_name: String,
    pub agent: AgentConfig,
    pub providers: AgentProviders,
    /// The generation `agent` and `providers` came from (the call's tools come from it too).
    pub generation: Arc<super::Generation>,
    pub machine_detection: bool,
    pub voicemail_message: Option<String>,
}

/// Why a call was not placed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboundError {
    #[error("[carriers.{0}] is not configured")]
    NoCarrier(String),
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("the daemon is at max_calls; try again when a call ends")]
    Full,
    #[error("duplicate call id")]
    Duplicate,
    #[error(
        "the request went away while the carrier was dialling; the call was cancelled at the \
         carrier — place it again if it is still wanted"
    )]
    Abandoned,
}

/// Why a reservation was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapError {
    #[error(
        "{live} outbound calls are live or being placed, the limit ([outbound] max_concurrent); \
         wait for one to end (get_calls) and try again"
    )]
    Concurrent { live: usize },
    #[error(
        "{today} outbound calls were placed today (UTC), the limit ([outbound] max_per_day); \
         try again tomorrow or raise the limit"
    )]
    Daily { today: u64 },
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The shared store could not answer (PostgreSQL): refused, since nobody can tell whether
    /// the caps still have room.
    #[error(
        "the cluster's outbound caps could not be checked in the store ({0}); no call was \
         placed — check that the PostgreSQL at [store] url is reachable, then try again"
    )]
    Unavailable(String),
}

/// The outbound caps' shared state: reservations in flight and calls placed today.
pub struct Caps {
    state: Mutex<CapState>,
    /// Requests waiting in [`place_reserved`] for their dial (observability and tests: a
    /// request that went away is no longer counted).
    waiting: tokio::sync::watch::Sender<usize>,
    /// The cluster's slots this process holds (PostgreSQL store).
    #[cfg(feature = "postgres")]
    pub(crate) slots: super::cluster::caps::HeldSlots,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            waiting: tokio::sync::watch::Sender::new(0),
            #[cfg(feature = "postgres")]
            slots: Default::default(),
        }
    }
}

/// Counts one request waiting for its dial while it lives.
struct Waiting<'a>(&'a Caps);

impl<'a> Waiting<'a> {
    fn new(caps: &'a Caps) -> Self {
        caps.waiting.send_modify(|n| *n += 1);
        Self(caps)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[derive(Default)]
struct CapState {
    /// Start of the UTC day `base` and `placed` count (ms since the epoch).
    day: i64,
    /// Outbound calls the store held for `day` when it was first needed (earlier runs).
    base: Option<u64>,
    /// Reservations of `day` that became placed calls since.
    placed: u64,
    /// Reservations whose dial is in flight.
    pending: usize,
}

impl Caps {
    fn lock(&self) -> std::sync::MutexGuard<'_, CapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reservations whose dial is in flight.
    pub fn pending(&self) -> usize {
        self.lock().pending
    }

    /// The number of requests waiting for their dial, as it changes.
    pub fn requests_waiting(&self) -> tokio::sync::watch::Receiver<usize> {
        self.waiting.subscribe()
    }
}

/// The start (ms) of the UTC day holding `ms`.
pub(crate) fn day_start(ms: i64) -> i64 {
    ms - ms.rem_euclid(86_400_000)
}

/// A place under the outbound caps, held while the carrier is dialled. Dropped uncommitted it
/// is released; committed (the call was placed and registered) it counts as today's call.
#[must_use = "a reservation is released when dropped"]
pub(crate) struct Reservation {
    app: Arc<App>,
    held: Held,
    committed: bool,
}

/// What a reservation holds.
enum Held {
    /// A place in this process's count (SQLite store), for the UTC day starting at `day`.
    Local { day: i64 },
    /// A cluster slot (PostgreSQL store) and the call it was bound to.
    #[cfg(feature = "postgres")]
    Slot { slot: i64, call_id: Option<String> },
}

impl Reservation {
    /// The carrier placed the call as `call_id`: a cluster slot is bound to it (before the
    /// call's row is queued, see `app::cluster::caps`).
    pub(crate) async fn bind(&mut self, call_id: &str) {
        match &mut self.held {
            Held::Local { .. } => {}
            #[cfg(feature = "postgres")]
            Held::Slot {
                slot,
                call_id: bound,
            } => {
                if let Some(cluster) = &self.app.cluster {
                    super::cluster::caps::bind(cluster, *slot, call_id).await;
                }
                *bound = Some(call_id.to_string());
            }
        }
    }

    /// The call was placed (and is registered as live): the reservation becomes it, counted
    /// toward the day; a cluster slot is freed when the call ends.
    pub(crate) fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        match &mut self.held {
            Held::Local { day } => {
                let mut s = self.app.outbound_caps.lock();
                s.pending = s.pending.saturating_sub(1);
                if self.committed && s.day == *day {
                    s.placed += 1;
                }
            }
            #[cfg(feature = "postgres")]
            Held::Slot { slot, call_id } => super::cluster::caps::release_later(
                &self.app,
                *slot,
                call_id.take(),
                self.committed,
            ),
        }
    }
}

/// Reserves a place under `[outbound] max_concurrent` and `max_per_day` for a call from `from`,
/// atomically with every other reservation (of the cluster, with the PostgreSQL store); see the
/// module docs.
pub(crate) async fn reserve(app: &Arc<App>, from: &str) -> Result<Reservation, CapError> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = &app.cluster {
        let slot = super::cluster::caps::reserve(app, cluster, from).await?;
        return Ok(Reservation {
            app: app.clone(),
            held: Held::Slot {
                slot,
                call_id: None,
            },
            committed: false,
        });
    }
    let _ = from;
    let limits = &app.config().outbound;
    loop {
        let day = day_start(now_ms());
        let known = {
            let s = app.outbound_caps.lock();
            s.day == day && s.base.is_some()
        };
        if !known {
            // Calls of earlier runs today; read once a day (this run's own are counted here).
            let stored = app.store.outbound_since(day).await?;
            let mut s = app.outbound_caps.lock();
            if s.day != day || s.base.is_none() {
                s.day = day;
                s.base = Some(stored);
                s.placed = 0;
            }
        }
        let mut s = app.outbound_caps.lock();
        if s.day != day {
            continue; // the day turned meanwhile
        }
        let live = app.outbound.live_count() + s.pending;
        if live >= limits.max_concurrent {
            return Err(CapError::Concurrent { live });
        }
        let today = s.base.unwrap_or(0) + s.placed + s.pending as u64;
        if today >= u64::from(limits.max_per_day) {
            return Err(CapError::Daily { today });
        }
        s.pending += 1;
        return Ok(Reservation {
            app: app.clone(),
            held: Held::Local { day },
            committed: false,
        });
    }
}

/// Places `call` under `reservation` in a task of its own and waits for it; see the module
/// docs. If this future is dropped mid-dial, the task still finishes the dial and cancels the
/// placed call at the carrier; the reservation is released (or becomes the call) either way.
pub(crate) async fn place_reserved(
    app: &Arc<App>,
    call: NewOutbound,
    mut reservation: Reservation,
) -> Result<String, OutboundError> {
    let _waiting = Waiting::new(&app.outbound_caps);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_app = app.clone();
    tokio::spawn(async move {
        let account = call.account.clone();
        let wanted = || !tx.is_closed();
        let placed = place_if(&task_app, call, &wanted, &mut reservation).await;
        // The reservation is settled before anything else happens: a placed call (even one
        // cancelled below) counts toward the day; a failed dial is released.
        match &placed {
            Ok(_) => reservation.commit(),
            Err(_) => drop(reservation),
        }
        let id = match placed {
            Ok(Placed::Live(id)) => match tx.send(Ok(id)) {
                Ok(()) => return,
                Err(sent) => {
                    // Gone between the check and now: nobody knows the call's id.
                    let id = sent.unwrap_or_default();
                    if let Some(h) = task_app.calls.get(&id) {
                        let _ = h.hang_up("the request that placed it went away");
                    }
                    id
                }
            },
            Ok(Placed::Abandoned(id)) => id,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        warn!(call_id = %id, "outbound request went away mid-dial; cancelling the call at the carrier");
        cancel_unanswered(&task_app, &account, &id).await;
    });
    rx.await.unwrap_or(Err(OutboundError::Abandoned))
}

/// A call the carrier placed.
enum Placed {
    /// Registered, its actor started.
    Live(String),
    /// Nobody waited for it any more: recorded as canceled, not registered; the caller
    /// cancels it at the carrier.
    Abandoned(String),
}

/// Places `call` and starts its actor (our call id), unless `wanted` says nobody waits for the call any more once the carrier has
/// answered the dial: then the call is recorded as canceled and returned as abandoned. The
/// reservation is bound to the call id before the call is recorded.
async fn place_if(
    app: &Arc<App>,
    call: NewOutbound,
    wanted: &(dyn Fn() -> bool + Send + Sync),
    reservation: &mut Reservation,
) -> Result<Placed, OutboundError> {
    let config = &app.config();
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
        // The call's callbacks come to this instance, its owner.
        public_url: crate::carrier::port::Host::callback_base(app.as_ref()).to_string(),
    };
    let id = carrier
        .place_call(&call.account, request)
        .await
        .inspect_err(|e| {
            warn!(to = %mask_number(&call.to), error = %e, "outbound call failed");
        })?;
    reservation.bind(&id).await;
    let abandoned = !wanted();
    app.store.tx.send(Write::Call(NewCall {
        call_id: id.clone(),
        carrier: kind.as_str().to_string(),
        carrier_account: call.account.clone(),
        direction: "outbound",
        from: call.from.clone(),
        to: call.to.clone(),
        agent: call.agent_name.clone(),
        status: if abandoned {
            CallStatus::Canceled
        } else {
            CallStatus::Queued
        }
        .as_str()
        .into(),
    }));
    if abandoned {
        app.report(StatusUpdate::outcome(&id, CallOutcome::Failed, None));
        return Ok(Placed::Abandoned(id));
    }
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
    let setup = super::with_tools(app, &call.generation, setup);
    if let Err(e) = actor::start(setup, app.calls.clone(), config.server.max_calls) {
        cancel_unanswered(app, &call.account, &id).await;
        app.outbound.remove(&id);
        app.report(StatusUpdate {
            status: Some(CallStatus::Canceled),
            ..StatusUpdate::outcome(&id, CallOutcome::Failed, None)
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
    Ok(Placed::Live(id))
}

/// Ends a call we placed that has not been answered (it has no media stream to close), through
/// its carrier.
pub(crate) async fn cancel_unanswered(app: &Arc<App>, account: &str, id: &str) {
    let Some(carrier) = app.carriers.for_account(account) else {
        return;
    };
    if let Err(e) = carrier.cancel(account, id, &app.outbound).await {
        warn!(call_id = %id, error = %e, "could not cancel an unanswered outbound call");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(max_concurrent: usize, max_per_day: u32, dir: &tempfile::TempDir) -> Arc<App> {
        let text = format!(
            "[server]\ndata_dir = {:?}\n\n[outbound]\nmax_concurrent = {max_concurrent}\n\
             max_per_day = {max_per_day}\n\n[carriers.tw]\nkind = \"twilio\"\n",
            dir.path().display().to_string()
        );
        let loaded = crate::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
        App::new(loaded.config).expect("app")
    }

    /// Twenty parallel reservations against `max_concurrent = 2`: exactly two pass, and a
    /// released one makes room again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reservations_are_atomic_and_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let app = app(2, 100, &dir);
        let tries = (0..20).map(|_| {
            let app = app.clone();
            tokio::spawn(async move { reserve(&app, "+15550001111").await })
        });
        let mut held = Vec::new();
        let mut refused = 0;
        for t in tries {
            match t.await.expect("task") {
                Ok(r) => held.push(r),
                Err(CapError::Concurrent { live }) => {
                    assert_eq!(live, 2);
                    refused += 1;
                }
                Err(e) => panic!("unexpected refusal: {e}"),
            }
        }
        assert_eq!((held.len(), refused), (2, 18));
        assert_eq!(app.outbound_caps.pending(), 2);
        drop(held.pop());
        assert_eq!(app.outbound_caps.pending(), 1);
        let again = reserve(&app, "+15550001111")
            .await
            .expect("a released place is free again");
        drop(again);
        drop(held);
        assert_eq!(app.outbound_caps.pending(), 0);
    }

    /// Committed reservations count toward the day; released ones do not.
    #[tokio::test]
    async fn the_daily_cap_counts_committed_and_pending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let app = app(10, 3, &dir);
        reserve(&app, "+15550001111").await.expect("first").commit();
        drop(
            reserve(&app, "+15550001111")
                .await
                .expect("second, released"),
        );
        let pending = reserve(&app, "+15550001111").await.expect("second");
        reserve(&app, "+15550001111").await.expect("third").commit();
        match reserve(&app, "+15550001111").await {
            Err(CapError::Daily { today }) => assert_eq!(today, 3),
            Err(e) => panic!("wrong refusal: {e}"),
            Ok(_) => panic!("the fourth call of the day passed max_per_day = 3"),
        }
        drop(pending);
        reserve(&app, "+15550001111")
            .await
            .expect("the released place")
            .commit();
        assert!(matches!(
            reserve(&app, "+15550001111").await,
            Err(CapError::Daily { today: 3 })
        ));
    }
}
