//! The port between carrier routes and the rest of the daemon. A carrier's webhook handlers
//! know their carrier's wire format and nothing else: to admit a call, mint a media token, end
//! a call's actor, record a status or serve a media socket they ask the [`Host`] (implemented
//! by the composition root, `crate::app::App`). This keeps `carrier` below the modules that
//! hold call state, so a carrier never imports them.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};

use super::dial::{Outbound, StatusUpdate};
use super::{Carrier, CarrierKind, SharedCodec};
use crate::net::http::Body;

/// An incoming call as a carrier's webhook describes it.
#[derive(Debug, Clone, Copy)]
pub struct IncomingCall<'a> {
    pub carrier: CarrierKind,
    /// Name of the `[carriers.NAME]` account whose signature the webhook carried.
    pub account: &'a str,
    pub call_id: &'a str,
    pub from: &'a str,
    pub to: &'a str,
}

/// A call that names its agent instead of a dialled number (the browser phone): no
/// `[[numbers]]` entry, the agent chosen by the caller (or the only / first agent).
#[derive(Debug, Clone, Copy)]
pub struct Direct<'a> {
    pub carrier: CarrierKind,
    pub account: &'a str,
    pub call_id: &'a str,
    /// Shown as the caller in the call store (e.g. `browser`).
    pub from: &'a str,
    pub agent: Option<&'a str>,
}

/// Set by the HTTP server on every carrier request: whether it carries the control API's
/// credentials (the bearer token, or in token-less local mode a loopback peer and `Host`
/// without proxy headers), as `/v1` would decide. Carriers whose routes open calls without a
/// carrier signature (the browser phone) require it or their own signed link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ControlAccess(pub bool);

/// Why a call is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The daemon is draining.
    Draining,
    /// `max_calls` is reached.
    Full,
    /// The dialled number is not in `[[numbers]]` for this account.
    UnknownNumber,
    /// The caller is not in the number's `allowed_callers`.
    CallerNotAllowed,
    /// The agent's providers could not be built.
    AgentUnavailable,
    /// Inbound calls to this number were turned off at runtime (`configure_inbound`).
    Disabled,
    /// The agent the call asked for is not configured.
    UnknownAgent,
    /// The call id was already handled (it is live, or in the call store): a replayed
    /// webhook. The carrier answers it without touching the call.
    Repeated,
}

impl Refusal {
    /// Busy-type refusals (try again later) as opposed to rejections.
    pub(crate) fn is_busy(self) -> bool {
        matches!(self, Refusal::Draining | Refusal::Full)
    }

    /// Rejections a carrier reports as "rejected" rather than a plain hang-up.
    pub(crate) fn is_rejection(self) -> bool {
        matches!(self, Refusal::CallerNotAllowed | Refusal::Disabled)
    }
}

/// An accepted call (a new actor was started for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub agent: String,
}

/// Carrier-edge counters (exported at `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// A webhook with a bad or missing signature.
    WebhookForbidden,
    /// A media socket closed for a bad token or unknown call.
    MediaRejected,
    /// A malformed media frame.
    MediaFrameBad,
}

/// How the media token reaches us: in the URL (Telnyx, Plivo) or as a stream parameter named
/// `token` in `start` (Twilio).
pub enum TokenSource {
    Url(Option<String>),
    StartParameter,
}

/// A carrier's media WebSocket, ready to be served by the carrier-neutral pump.
pub struct MediaSocket {
    /// The carrier that owns the route (hang-ups and leg ids go through it).
    pub carrier: Arc<dyn Carrier>,
    pub codec: Box<dyn SharedCodec>,
    pub token: TokenSource,
    /// Selected in the upgrade response when the client offers it (Plivo's
    /// `audio.drachtio.org`).
    pub subprotocol: Option<&'static str>,
}

/// What carrier routes may ask of the daemon.
pub trait Host: Send + Sync + 'static {
    /// `server.public_url`.
    fn public_url(&self) -> &str;
    /// `server.max_body_bytes`.
    fn max_body_bytes(&self) -> usize;
    fn count(&self, counter: Counter);
    /// Decides on an incoming call and, when accepted, starts its actor.
    fn admit(&self, call: IncomingCall<'_>) -> Result<Admitted, Refusal>;
    /// A single-use media token for `call_id`.
    fn mint_token(&self, call_id: &str) -> String;
    /// The `[carriers.NAME]` account of the live call `call_id`.
    fn live_call_account(&self, call_id: &str) -> Option<String>;
    /// Ends the live call's actor; false when no such call is live.
    fn end_call(&self, call_id: &str, reason: &str) -> bool;
    /// The outbound calls we placed.
    fn outbound(&self) -> &Outbound;
    /// Records what the carrier reported about a call.
    fn report(&self, update: StatusUpdate);
    /// The configured agents' names, in order.
    fn agents(&self) -> Vec<String> {
        Vec::new()
    }
    /// Decides on a call that names its agent ([`Direct`]) and, when accepted, starts its
    /// actor — the same checks and call actor as [`Host::admit`] without a number.
    fn admit_direct(&self, _call: Direct<'_>) -> Result<Admitted, Refusal> {
        Err(Refusal::AgentUnavailable)
    }
    /// The phone-link key, when the configuration has secret material for one.
    fn phone_links(&self) -> Option<Arc<crate::security::link::PhoneLinks>> {
        None
    }
    /// Upgrades `req` and serves the media socket in the background.
    fn accept_media(self: Arc<Self>, req: Request<Incoming>, socket: MediaSocket)
    -> Response<Body>;
}
