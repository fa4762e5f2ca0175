//! The browser phone's routes and its [`Carrier`]: `GET /phone` (the page) and
//! `GET /phone/socket` (its media WebSocket, handed to the carrier-neutral pump with
//! [`WebCodec`]). Nothing here is open: both need the control API's credentials (as the server
//! decided, [`ControlAccess`]) or a valid phone link (signed, unexpired; the socket also uses it
//! up — its call id is admitted once). A link opens only the one agent it names; choosing an
//! agent and seeing the configured agents' names need the control API's credentials. The
//! socket refuses an `Origin` that is not `public_url`'s — with a phone link, a loopback
//! page's too — so another web site (or, in token-less mode, another local web server's page)
//! cannot open a microphone stream. A call
//! here goes through [`Host::admit_direct`]: the same checks, call actor, providers, store and
//! events as a phone call, with carrier kind `web`.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tracing::info;

use super::{Config, WebCodec, page};
use crate::carrier::dial::{Outbound, PlaceCall, PlaceError};
use crate::carrier::port::{ControlAccess, Direct, Host, MediaSocket, Refusal, TokenSource};
use crate::carrier::registry::{BoxFuture, Route, RoutePath};
use crate::carrier::{Carrier, CarrierError, CarrierKind, ProgressView};
use crate::net::http::{Body, text, text_owned};
use crate::security::link::{LinkError, unix_now};

/// The account name of browser calls when no `[carriers.NAME]` of kind `web` exists.
pub(crate) const DEFAULT_ACCOUNT: &str = "web";

/// The browser phone (always served; its routes authenticate every request themselves).
pub(crate) struct WebCarrier {
    account: String,
    agent: Option<String>,
}

/// The browser phone with its (optional) settings: the first `kind = "web"` section, if any.
pub fn build(configs: Vec<(String, Config)>) -> Arc<dyn Carrier> {
    let (account, agent) = match configs.into_iter().next() {
        Some((name, c)) => (name, c.agent),
        None => (DEFAULT_ACCOUNT.to_string(), None),
    };
    Arc::new(WebCarrier { account, agent })
}

impl Carrier for WebCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Web
    }

    fn is_configured(&self) -> bool {
        true
    }

    fn has_account(&self, account: &str) -> bool {
        account == self.account
    }

    fn required_keys(&self) -> Vec<&'static str> {
        Vec::new()
    }

    fn routes(self: Arc<Self>) -> Vec<Route> {
        vec![
            Route::to(&[Method::GET], RoutePath::Exact("/phone"), &self, phone_page),
            Route::to(&[Method::GET], RoutePath::Exact("/phone/socket"), &self, socket),
        ]
    }

    /// The media pump closes the page's socket; there is no leg elsewhere to end.
    fn hang_up(&self, _account: &str, _leg_id: &str) -> BoxFuture<Result<(), CarrierError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn place_call(&self, _account: &str, _p: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        Box::pin(std::future::ready(Err(PlaceError::Carrier(
            CarrierError::Unsupported {
                carrier: "web",
                what: "be placed (open /phone in a browser instead)",
            },
        ))))
    }

    fn cancel(
        &self,
        _account: &str,
        _call_id: &str,
        _outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A query parameter's value, percent-decoded.
fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

fn has_control_access(req: &Request<Incoming>) -> bool {
    req.extensions()
        .get::<ControlAccess>()
        .is_some_and(|a| a.0)
}

/// An `Origin` a socket may come from: none (not a browser), a page of `public_url`, or — when
/// `loopback_ok` (the caller brings a phone link, its own credential) — any loopback page.
/// A caller let in by the control API's verdict gets `public_url`'s origin only, as `/v1`
/// does: in token-less mode that verdict is ambient (any loopback peer), so another local web
/// server's page must not ride on it.
pub(crate) fn origin_allowed(origin: Option<&str>, public_url: &str, loopback_ok: bool) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let Ok(o) = url::Url::parse(origin) else {
        return false;
    };
    let loopback = match o.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    let ours = url::Url::parse(public_url)
        .ok()
        .map(|u| u.origin().ascii_serialization())
        .filter(|s| s != "null");
    (loopback && loopback_ok) || ours.is_some_and(|ours| ours == o.origin().ascii_serialization())
}

fn link_refusal(e: &LinkError) -> Response<Body> {
    match e {
        LinkError::Missing => text(
            401,
            "the browser phone needs a link from `patterd phone-link` (or, without \
             server.api_token, to be opened from this machine)\n",
        ),
        LinkError::Expired => text(403, "this phone link has expired; make a new one\n"),
        LinkError::Unbound | LinkError::TooLong => {
            text(403, "this phone link is no longer accepted; make a new one\n")
        }
        LinkError::Malformed | LinkError::BadSignature => text(403, "invalid phone link\n"),
    }
}

/// `GET /phone`: the page, for a caller with the API's credentials or a valid link.
async fn phone_page(
    me: Arc<WebCarrier>,
    host: Arc<dyn Host>,
    req: Request<Incoming>,
) -> Response<Body> {
    let link = query_param(&req, "link");
    let bound_agent = if has_control_access(&req) && link.is_none() {
        None
    } else {
        let checked = match host.phone_links() {
            Some(links) => links.verify(link.as_deref(), unix_now()),
            None => Err(LinkError::Missing),
        };
        match checked {
            Ok(claims) => Some(claims.agent),
            Err(e) => {
                host.count(crate::carrier::port::Counter::MediaRejected);
                return link_refusal(&e);
            }
        }
    };
    let agents = match bound_agent {
        Some(a) => vec![a],
        None => {
            let mut all = host.agents();
            // The configured default first.
            if let Some(d) = &me.agent
                && let Some(i) = all.iter().position(|a| a == d)
            {
                let d = all.remove(i);
                all.insert(0, d);
            }
            all
        }
    };
    page::response(&agents)
}

/// `GET /phone/socket`: checks the origin and the caller, admits the call, then hands the
/// upgrade to the media pump.
async fn socket(me: Arc<WebCarrier>, host: Arc<dyn Host>, req: Request<Incoming>) -> Response<Body> {
    let link = query_param(&req, "link");
    let asked = query_param(&req, "agent");
    let controlled = has_control_access(&req) && link.is_none();
    let origin = req
        .headers()
        .get(hyper::header::ORIGIN)
        .map(|v| v.to_str().unwrap_or("\u{0}"));
    if !origin_allowed(origin, host.public_url(), !controlled) {
        host.count(crate::carrier::port::Counter::MediaRejected);
        return text(
            403,
            if controlled {
                "the browser phone without a link only accepts pages of server.public_url \
                 (open /phone at public_url's address)\n"
            } else {
                "the browser phone only accepts pages served by this daemon (a loopback origin \
                 or server.public_url)\n"
            },
        );
    }
    let (call_id, agent) = if controlled {
        (
            crate::security::link::PhoneLinks::new_call_id(),
            asked.or_else(|| me.agent.clone()),
        )
    } else {
        let checked = match host.phone_links() {
            Some(links) => links.verify(link.as_deref(), unix_now()),
            None => Err(LinkError::Missing),
        };
        match checked {
            Ok(claims) => {
                if asked.is_some_and(|a| a != claims.agent) {
                    return text(403, "this phone link is for another agent\n");
                }
                (claims.call_id, Some(claims.agent))
            }
            Err(e) => {
                host.count(crate::carrier::port::Counter::MediaRejected);
                return link_refusal(&e);
            }
        }
    };
    let upgrade = req
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return text(400, "expected a WebSocket upgrade\n");
    }
    let direct = Direct {
        carrier: CarrierKind::Web,
        account: &me.account,
        call_id: &call_id,
        from: "browser",
        agent: agent.as_deref(),
    };
    match host.admit_direct(direct).await {
        Ok(a) => info!(call_id, agent = %a.agent, "browser call admitted"),
        Err(Refusal::Repeated) => return text(409, "this phone link was already used\n"),
        Err(Refusal::UnknownAgent) if !controlled => {
            return text(
                404,
                "the agent of this phone link is not configured any more; make a new link\n",
            );
        }
        Err(Refusal::UnknownAgent) => {
            return text_owned(
                404,
                format!(
                    "no agent named {:?}; configured: {}\n",
                    crate::security::truncate_for_log(agent.as_deref().unwrap_or(""), 64),
                    host.agents().join(", ")
                ),
            );
        }
        Err(r) if r.is_busy() => return text(503, "busy: try again later\n"),
        Err(_) => return text(503, "the agent is not available (check its providers)\n"),
    }
    let token = host.mint_token(&call_id);
    let resp = host.clone().accept_media(
        req,
        MediaSocket {
            carrier: me,
            // The whole timeline only with the API token (a link or a token-less loopback
            // page sees what a caller may: `ProgressView::Caller`).
            codec: Box::new(WebCodec::new(
                &call_id,
                if controlled && host.phone_links().is_some() {
                    ProgressView::Full
                } else {
                    ProgressView::Caller
                },
            )),
            token: TokenSource::Url(Some(token)),
            subprotocol: None,
        },
    );
    if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        host.end_call(&call_id, "the browser's media socket was refused");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_loopback_or_our_own() {
        let public = "https://voice.example.com/pd";
        let allowed = |o| origin_allowed(o, public, true);
        assert!(allowed(None));
        assert!(allowed(Some("http://127.0.0.1:8080")));
        assert!(allowed(Some("http://localhost:3000")));
        assert!(allowed(Some("http://[::1]:8080")));
        assert!(allowed(Some("https://voice.example.com")));
        assert!(!allowed(Some("https://evil.example.com")));
        assert!(!allowed(Some("http://voice.example.com")));
        assert!(!allowed(Some("null")));
        assert!(!allowed(Some("http://127.0.0.1.evil.com")));
    }

    /// Without a link (the control API's verdict, ambient in token-less mode) only
    /// `public_url`'s own origin passes: another local web server's page does not.
    #[test]
    fn without_a_link_only_our_own_origin() {
        let public = "http://127.0.0.1:8080";
        let allowed = |o| origin_allowed(o, public, false);
        assert!(allowed(None));
        assert!(allowed(Some("http://127.0.0.1:8080")));
        assert!(!allowed(Some("http://localhost:3000")));
        assert!(!allowed(Some("http://127.0.0.1:3000")));
        assert!(!allowed(Some("http://[::1]:8080")));
    }
}
