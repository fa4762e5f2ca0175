//! The carrier registry: the one trait the daemon uses to reach a carrier ([`Carrier`]) and
//! the set of registered carriers ([`Registry`]) built from `[carriers.*]`. The HTTP server
//! asks the registry which route a request is for (and derives 404/405 from the same routes);
//! the API places, cancels and hangs up calls through it; the media pump maps leg ids through
//! it. Nothing outside a carrier's folder branches on which carrier it is.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use super::dial::{Outbound, PlaceCall, PlaceError};
use super::messaging::{NumberInfo, OutgoingSms, SentSms};
use super::port::Host;
use super::{CarrierConfig, CarrierError, CarrierKind, DtmfDelivery, TransferRequest};
use crate::net::http::Body;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A route handler: the request and the daemon's port in, the response out.
pub(crate) type Handler =
    Arc<dyn Fn(Arc<dyn Host>, Request<Incoming>) -> BoxFuture<Response<Body>> + Send + Sync>;

/// Which paths a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePath {
    /// Exactly this path.
    Exact(&'static str),
    /// Every path under this prefix (e.g. `/telnyx/media/` + a token).
    Prefix(&'static str),
}

impl RoutePath {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            RoutePath::Exact(p) => path == *p,
            RoutePath::Prefix(p) => path.starts_with(p),
        }
    }
}

/// One HTTP route a carrier serves.
#[derive(Clone)]
pub struct Route {
    pub(crate) methods: &'static [Method],
    pub path: RoutePath,
    pub handler: Handler,
}

impl Route {
    pub fn new<F, Fut>(methods: &'static [Method], path: RoutePath, f: F) -> Self
    where
        F: Fn(Arc<dyn Host>, Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        Self {
            methods,
            path,
            handler: Arc::new(move |host, req| Box::pin(f(host, req))),
        }
    }

    /// A route whose handler is `f` called with (a clone of) `carrier`, then the host and the
    /// request.
    pub fn to<C, F, Fut>(
        methods: &'static [Method],
        path: RoutePath,
        carrier: &Arc<C>,
        f: F,
    ) -> Self
    where
        C: Send + Sync + 'static,
        F: Fn(Arc<C>, Arc<dyn Host>, Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        let carrier = carrier.clone();
        Self::new(methods, path, move |h, r| f(carrier.clone(), h, r))
    }
}

/// The [`Carrier`] methods a carrier answers from its `accounts` field (an
/// [`Accounts`](super::account::Accounts)): whether any or a given account is usable, and the
/// credential keys an account needs.
macro_rules! account_methods {
    () => {
        fn is_configured(&self) -> bool {
            !self.accounts.is_empty()
        }

        fn has_account(&self, account: &str) -> bool {
            self.accounts.get(account).is_some()
        }

        fn required_keys(&self) -> Vec<&'static str> {
            self.accounts.required.clone()
        }
    };
}
pub(crate) use account_methods;

/// A call operation ([`Carrier::hang_up`], [`Carrier::cancel`]) through an account's REST
/// client: `op(rest, call_id)`, or nothing when there is no such account.
pub(crate) fn through_rest<R, F, Fut>(
    rest: Option<Arc<R>>,
    call_id: &str,
    op: F,
) -> BoxFuture<Result<(), CarrierError>>
where
    R: Send + Sync + 'static,
    F: FnOnce(Arc<R>, String) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), CarrierError>> + Send + 'static,
{
    let id = call_id.to_string();
    Box::pin(async move {
        match rest {
            Some(r) => op(r, id).await,
            None => Ok(()),
        }
    })
}

fn unsupported<T: Send + 'static>(
    kind: CarrierKind,
    what: &'static str,
) -> BoxFuture<Result<T, CarrierError>> {
    Box::pin(std::future::ready(Err(CarrierError::Unsupported {
        carrier: kind.as_str(),
        what,
    })))
}

fn no_messaging<T: Send + 'static>(
    kind: CarrierKind,
    what: &'static str,
) -> BoxFuture<Result<T, CarrierError>> {
    Box::pin(std::future::ready(Err(CarrierError::NoMessaging {
        carrier: kind.as_str(),
        what,
    })))
}

/// What the daemon asks of a carrier and its configured accounts. One value per registered
/// carrier kind; `account` arguments name a `[carriers.NAME]` section of that kind.
pub trait Carrier: Send + Sync + 'static {
    fn kind(&self) -> CarrierKind;

    /// Whether an account of this kind is usable (otherwise its routes answer 503).
    fn is_configured(&self) -> bool;

    /// Whether `account` is a usable account of this carrier.
    fn has_account(&self, account: &str) -> bool;

    /// The credential keys an account needs, for the 503 of an unconfigured carrier.
    fn required_keys(&self) -> Vec<&'static str>;

    /// The HTTP routes this carrier serves (webhooks and media sockets).
    fn routes(self: Arc<Self>) -> Vec<Route>;

    /// Hangs up a live call leg (the carrier's id for it).
    fn hang_up(&self, account: &str, leg_id: &str) -> BoxFuture<Result<(), CarrierError>>;

    /// Places an outbound call; returns our id for it (the carrier's call id, or for Plivo its
    /// `request_uuid`).
    fn place_call(&self, account: &str, call: PlaceCall) -> BoxFuture<Result<String, PlaceError>>;

    /// Ends a call we placed that has not been answered (it has no media stream to close).
    fn cancel(
        &self,
        account: &str,
        call_id: &str,
        outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>>;

    /// Our call id for the carrier's leg id, when the two differ (Plivo calls we placed are
    /// ours by `request_uuid`, their media stream names the `CallUUID`).
    fn call_id_for_leg(&self, _outbound: &Outbound, _leg_id: &str) -> Option<String> {
        None
    }

    /// Cold-transfers a live, streaming call leg. Unsupported
    /// unless the carrier implements it.
    fn transfer(
        &self,
        _account: &str,
        _leg_id: &str,
        _request: &TransferRequest,
    ) -> BoxFuture<Result<(), CarrierError>> {
        unsupported(self.kind(), "be transferred")
    }

    /// Sends DTMF `digits` (`0-9*#A-D`, already checked) on a live, streaming call leg with
    /// the carrier's own command, or answers [`DtmfDelivery::InBand`] when the carrier has
    /// none (the default): the caller then sends tones on the media stream.
    fn send_dtmf(
        &self,
        _account: &str,
        _leg_id: &str,
        _digits: &str,
    ) -> BoxFuture<Result<DtmfDelivery, CarrierError>> {
        Box::pin(std::future::ready(Ok(DtmfDelivery::InBand)))
    }

    /// Sends a text message from one of the account's numbers. Unsupported unless the
    /// carrier implements it.
    fn send_sms(
        &self,
        _account: &str,
        _sms: &OutgoingSms,
    ) -> BoxFuture<Result<SentSms, CarrierError>> {
        no_messaging(self.kind(), "send text messages")
    }

    /// Looks a number up (validity, country, operator, line type) with the carrier's lookup
    /// API. Unsupported unless the carrier implements it.
    fn lookup_number(
        &self,
        _account: &str,
        _number: &str,
    ) -> BoxFuture<Result<NumberInfo, CarrierError>> {
        no_messaging(self.kind(), "look numbers up")
    }
}

/// What a request's method and path resolve to.
pub enum Resolved<'a> {
    /// A carrier's route.
    Route(&'a Arc<dyn Carrier>, &'a Route),
    /// A carrier serves this path, but not with this method.
    MethodNotAllowed,
    NotFound,
}

/// The registered carriers with their configured accounts, and their routes.
pub struct Registry {
    carriers: Vec<Arc<dyn Carrier>>,
    routes: Vec<(Arc<dyn Carrier>, Route)>,
}

impl Registry {
    pub(crate) fn from_config(configs: &BTreeMap<String, CarrierConfig>) -> Self {
        let carriers = super::build_all(configs);
        let routes = carriers
            .iter()
            .flat_map(|c| {
                let c2 = c.clone();
                c.clone().routes().into_iter().map(move |r| (c2.clone(), r))
            })
            .collect();
        Self { carriers, routes }
    }

    /// The carrier of `kind`.
    pub fn get(&self, kind: CarrierKind) -> Option<&Arc<dyn Carrier>> {
        self.carriers.iter().find(|c| c.kind() == kind)
    }

    /// The carrier with the usable account `account`.
    pub(crate) fn for_account(&self, account: &str) -> Option<&Arc<dyn Carrier>> {
        self.carriers.iter().find(|c| c.has_account(account))
    }

    /// The route for `method` and `path`.
    pub fn resolve(&self, method: &Method, path: &str) -> Resolved<'_> {
        let mut path_known = false;
        for (carrier, route) in &self.routes {
            if route.path.matches(path) {
                if route.methods.contains(method) {
                    return Resolved::Route(carrier, route);
                }
                path_known = true;
            }
        }
        if path_known {
            Resolved::MethodNotAllowed
        } else {
            Resolved::NotFound
        }
    }
}

/// Runs `route` of `carrier`: 503 with what to set while the carrier has no usable account.
pub(crate) async fn serve(
    carrier: &Arc<dyn Carrier>,
    route: &Route,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    if !carrier.is_configured() {
        return crate::net::http::text_owned(
            503,
            format!(
                "{} is not configured: set {} in [carriers.<name>]\n",
                carrier.kind().as_str(),
                carrier.required_keys().join(" and ")
            ),
        );
    }
    (route.handler)(host, req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_resolve_and_405_comes_from_the_same_table() {
        let registry = Registry::from_config(&BTreeMap::new());
        let found = |m: Method, p: &str| match registry.resolve(&m, p) {
            Resolved::Route(c, _) => Some(c.kind()),
            _ => None,
        };
        for kind in CarrierKind::ALL {
            let c = registry.get(*kind).expect("every kind is registered");
            // The browser phone needs no credentials (its routes authenticate each request).
            let needs_credentials = *kind != CarrierKind::Web;
            assert_eq!(c.is_configured(), !needs_credentials);
            assert_eq!(c.required_keys().is_empty(), !needs_credentials);
        }
        assert_eq!(found(Method::GET, "/phone"), Some(CarrierKind::Web));
        assert_eq!(
            found(Method::POST, "/twilio/voice"),
            Some(CarrierKind::Twilio)
        );
        assert_eq!(
            found(Method::GET, "/telnyx/media/tok"),
            Some(CarrierKind::Telnyx)
        );
        assert_eq!(
            found(Method::GET, "/plivo/answer"),
            Some(CarrierKind::Plivo)
        );
        assert!(matches!(
            registry.resolve(&Method::GET, "/twilio/voice"),
            Resolved::MethodNotAllowed
        ));
        assert!(matches!(
            registry.resolve(&Method::GET, "/nope"),
            Resolved::NotFound
        ));
        assert!(registry.for_account("tw").is_none());
    }
}
