//! The port between carrier routes and the rest of the daemon. A carrier's webhook handlers
//! know their carrier's wire format and nothing else: to admit a call, mint a media token, end
//! a call's actor, record a status or serve a media socket they ask the [`Host`] (implemented
//! by the composition root, `crate::app::App`). This keeps `carrier` below the modules that
//! hold call state, so a carrier never imports them.
//!
//! Admission and the replay guard ([`Host::first_seen`]) are asynchronous: in a cluster they
//! are one round trip to the shared store, awaited by the webhook handler. URLs come in two
//! kinds: [`Host::callback_base`] is where the carrier reaches *this* instance for a call it
//! owns (media sockets, per-call callbacks), [`Host::signature_bases`] every base a carrier
//! may have signed a webhook against (the shared `public_url` and this instance's own).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};

use super::dial::{Machine, Outbound, StatusUpdate};
use super::messaging::{InboundSms, SmsReceipt};
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
    /// The call id was already handled (it is live, or in the call store — in a cluster,
    /// claimed by any instance): a replayed webhook. The carrier answers it without touching
    /// the call.
    Repeated,
    /// The shared call store could not be asked whether the call id is new (a cluster's
    /// claim failed): refused busy rather than risk two instances answering one call.
    Unclaimed,
}

impl Refusal {
    /// Busy-type refusals (try again later) as opposed to rejections.
    pub(crate) fn is_busy(self) -> bool {
        matches!(self, Refusal::Draining | Refusal::Full | Refusal::Unclaimed)
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

/// A boxed, sendable future that may borrow from its caller for `'a`.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What [`Host::admit`] and [`Host::admit_direct`] answer.
pub type Admission<'a> = Pending<'a, Result<Admitted, Refusal>>;

/// A new-call webhook as it arrived (method, URI, headers, body), kept by the route that
/// admits calls so that a busy refusal can hand it verbatim to a peer ([`Host::hand_off`]).
#[derive(Debug, Clone)]
pub struct Arrived {
    pub method: hyper::Method,
    pub uri: hyper::Uri,
    pub headers: hyper::HeaderMap,
    pub body: bytes::Bytes,
    /// The replay-guard key this instance recorded for the webhook ([`Host::first_seen`]'s
    /// scope and key: a Plivo nonce, a Telnyx event id), released before a peer gets it so the
    /// peer's guard takes it as new.
    pub seen: Option<(&'static str, String)>,
}

/// The shared replay guard could not be asked ([`Host::first_seen`]); the webhook is refused
/// (fail closed) and the carrier retries it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the replay guard (the shared call store) cannot be reached: {0}")]
pub struct GuardUnavailable(pub String);

/// What carrier routes may ask of the daemon.
pub trait Host: Send + Sync + 'static {
    /// The shared `server.public_url`: what a browser loads pages from (the browser phone's
    /// origin check). Carriers' URLs use [`Host::callback_base`] and
    /// [`Host::signature_bases`].
    fn public_url(&self) -> &str;
    /// Where the carrier reaches this instance for a call it owns: the base of media stream
    /// URLs in answer documents and of every per-call callback URL (outbound answer and status
    /// URLs, transfer documents). `[cluster] advertise_url` in a cluster, else `public_url`.
    fn callback_base(&self) -> &str {
        self.public_url()
    }
    /// Every base URL a carrier may have signed a webhook against: the shared `public_url`
    /// (new-call webhooks through the load balancer) and, when it differs, this instance's
    /// `advertise_url` (per-call callbacks). Never a base taken from the request.
    fn signature_bases(&self) -> Vec<&str> {
        let mut bases = vec![self.public_url()];
        if self.callback_base() != self.public_url() {
            bases.push(self.callback_base());
        }
        bases
    }
    /// `server.max_body_bytes`.
    fn max_body_bytes(&self) -> usize;
    fn count(&self, counter: Counter);
    /// Decides on an incoming call and, when accepted, starts its actor. In a cluster the
    /// decision includes claiming the call id in the shared store: only one instance ever
    /// admits a given call id.
    fn admit<'a>(&'a self, call: IncomingCall<'a>) -> Admission<'a>;
    /// True the first time `key` is seen in `scope` within `ttl` (a webhook's nonce or event
    /// id), false for a repeat — across the cluster when the store is shared.
    fn first_seen(
        &self,
        scope: &'static str,
        key: &str,
        ttl: Duration,
    ) -> Pending<'static, Result<bool, GuardUnavailable>>;
    /// A new-call webhook this instance refused busy (`refusal`: draining or at `max_calls`):
    /// in a cluster it is handed verbatim to a ready peer and the peer's answer is returned, to
    /// be relayed to the carrier as it is (for a webhook a peer handed here: the answer that
    /// tells that peer to try another). `None` — refuse as before — without a cluster, for
    /// another refusal, or when no ready peer took it.
    fn hand_off<'a>(
        &'a self,
        _refusal: Refusal,
        _webhook: Arrived,
    ) -> Pending<'a, Option<Response<Body>>> {
        Box::pin(std::future::ready(None))
    }
    /// A single-use media token for `call_id`.
    fn mint_token(&self, call_id: &str) -> String;
    /// The `[carriers.NAME]` account of the live call `call_id`.
    fn live_call_account(&self, call_id: &str) -> Option<String>;
    /// Ends the live call's actor; false when no such call is live.
    fn end_call(&self, call_id: &str, reason: &str) -> bool;
    /// A machine answered the call we placed, `call_id` ([`Machine::Greeting`] or
    /// [`Machine::GreetingEnded`]): its actor stops the conversation and leaves `message` in
    /// the agent's voice after the greeting. False when no such call is live (the carrier then
    /// hangs up instead of connecting media).
    fn machine_answered(&self, _call_id: &str, _message: &str, _machine: Machine) -> bool {
        false
    }
    /// The outbound calls we placed.
    fn outbound(&self) -> &Outbound;
    /// Records what the carrier reported about a call.
    fn report(&self, update: StatusUpdate);
    /// Records the carrier's own id for the leg of our call `call_id` when the two differ
    /// (Plivo's `CallUUID` of a call we placed by `request_uuid`), so that any instance can
    /// hang the leg up.
    fn record_leg(&self, _call_id: &str, _leg_id: &str) {}
    /// The configured agents' names, in order.
    fn agents(&self) -> Vec<String> {
        Vec::new()
    }
    /// Decides on a call that names its agent ([`Direct`]) and, when accepted, starts its
    /// actor — the same checks and call actor as [`Host::admit`] without a number.
    fn admit_direct<'a>(&'a self, _call: Direct<'a>) -> Admission<'a> {
        Box::pin(std::future::ready(Err(Refusal::AgentUnavailable)))
    }
    /// The phone-link key, when the configuration has secret material for one.
    fn phone_links(&self) -> Option<Arc<crate::security::link::PhoneLinks>> {
        None
    }
    /// A text message a carrier's signed webhook delivered to one of our numbers: stored once
    /// per carrier message id (a retry or replay is [`SmsReceipt::Repeated`]) and, when the
    /// number has `sms = true`, answered by its agent by text message in the background. Fails
    /// only while the replay guard cannot be asked (the carrier retries).
    fn incoming_sms<'a>(
        self: Arc<Self>,
        _sms: InboundSms<'a>,
    ) -> Pending<'a, Result<SmsReceipt, GuardUnavailable>> {
        Box::pin(std::future::ready(Ok(SmsReceipt::Stored)))
    }
    /// Upgrades `req` and serves the media socket in the background.
    fn accept_media(self: Arc<Self>, req: Request<Incoming>, socket: MediaSocket)
    -> Response<Body>;
}
