//! A call's leg at its carrier, apart from its media: which carrier, which account, the
//! carrier's id for the leg, and what the carrier needs for its REST commands. The call actor
//! holds one from the moment media attaches and runs hang-up, transfer and DTMF through the
//! [`Carrier`] trait with it; the media pump holds a clone only to hang up a leg whose socket
//! dropped (and to learn that a transfer handed the leg to the carrier).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{Instrument, warn};

use super::registry::{BoxFuture, Carrier};
use super::{ActionResult, DtmfDelivery, TransferRequest};

/// What a transfer or DTMF request answers when the call's account is not configured.
const NO_ACCOUNT: &str = "the call's carrier account is not configured for REST requests";

/// A call's leg at its carrier (cheap to clone; clones share what became of the leg).
#[derive(Clone)]
pub struct Leg {
    /// `None` when the call's account is not (or no longer) a usable account of the carrier.
    carrier: Option<Arc<dyn Carrier>>,
    account: Arc<str>,
    leg_id: Arc<str>,
    /// `server.public_url`, for carriers that fetch a transfer's document from us.
    public_url: Arc<str>,
    /// What transfer and DTMF answer without a carrier.
    refusal: &'static str,
    state: Arc<LegState>,
}

#[derive(Default)]
struct LegState {
    /// A hang-up was asked for (the call ended on our side).
    hung_up: AtomicBool,
    /// The carrier accepted a transfer: the leg is the carrier's now and must not be hung up.
    transferred: AtomicBool,
}

impl Leg {
    /// The leg `leg_id` of `account` at `carrier`; REST commands fail with a message when the
    /// carrier has no such account.
    pub fn new(carrier: Arc<dyn Carrier>, account: &str, leg_id: &str, public_url: &str) -> Self {
        Self {
            carrier: carrier.has_account(account).then_some(carrier),
            account: account.into(),
            leg_id: leg_id.into(),
            public_url: public_url.into(),
            refusal: NO_ACCOUNT,
            state: Arc::default(),
        }
    }

    /// A leg no carrier can reach (a trial call): hang-up does nothing, and transfer and DTMF
    /// fail with `why`.
    pub fn unreachable(why: &'static str) -> Self {
        Self {
            carrier: None,
            account: "".into(),
            leg_id: "".into(),
            public_url: "".into(),
            refusal: why,
            state: Arc::default(),
        }
    }

    /// Hangs the leg up through the carrier's REST API, in a task of its own (the request
    /// must not hold up closing the media socket); `why` goes into the log of a failure.
    pub fn hang_up(&self, why: &'static str) {
        self.state.hung_up.store(true, Ordering::Release);
        let Some(carrier) = &self.carrier else {
            return;
        };
        let request = carrier.hang_up(&self.account, &self.leg_id);
        tokio::spawn(
            async move {
                if let Err(e) = request.await {
                    warn!(error = %e, why, "carrier hang-up request failed");
                }
            }
            .in_current_span(),
        );
    }

    /// Whether [`Leg::hang_up`] was called on this leg (or a clone of it).
    pub(crate) fn is_hung_up(&self) -> bool {
        self.state.hung_up.load(Ordering::Acquire)
    }

    /// Whether the carrier accepted a transfer of this leg.
    pub(crate) fn is_transferred(&self) -> bool {
        self.state.transferred.load(Ordering::Acquire)
    }

    /// Cold-transfers the leg to `to`, showing `caller_id`; what the carrier made of it.
    pub fn transfer(&self, to: String, caller_id: String) -> BoxFuture<ActionResult> {
        let Some(carrier) = &self.carrier else {
            return Box::pin(std::future::ready(ActionResult::Failed(
                self.refusal.into(),
            )));
        };
        let request = TransferRequest {
            to,
            caller_id,
            public_url: self.public_url.to_string(),
        };
        let sent = carrier.transfer(&self.account, &self.leg_id, &request);
        let state = self.state.clone();
        Box::pin(async move {
            match sent.await {
                Ok(()) => {
                    state.transferred.store(true, Ordering::Release);
                    ActionResult::Done
                }
                Err(e) => {
                    warn!(error = %e, "carrier transfer request failed");
                    ActionResult::Failed(e.to_string())
                }
            }
        })
    }

    /// Sends DTMF `digits` with the carrier's own command (or learns they must go in-band).
    pub fn send_dtmf(&self, digits: &str) -> BoxFuture<ActionResult> {
        let Some(carrier) = &self.carrier else {
            return Box::pin(std::future::ready(ActionResult::Failed(
                self.refusal.into(),
            )));
        };
        let sent = carrier.send_dtmf(&self.account, &self.leg_id, digits);
        Box::pin(async move {
            match sent.await {
                Ok(DtmfDelivery::Sent) => ActionResult::Done,
                Ok(DtmfDelivery::InBand) => ActionResult::InBand,
                Err(e) => {
                    warn!(error = %e, "carrier DTMF request failed");
                    ActionResult::Failed(e.to_string())
                }
            }
        })
    }
}
