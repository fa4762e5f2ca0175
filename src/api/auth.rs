//! Who may use the API (`/v1/*` and `/mcp` alike), what they may do, and how requests must
//! look.
//!
//! - **Bearer tokens and scopes.** With `server.api_token` set, every request needs
//!   `Authorization: Bearer <token>` (compared in constant time), and the token decides the
//!   request's [`Grant`]: `api_token` and `operator` entries of `[[server.api_tokens]]` may do
//!   everything, `read` entries only read, and a call's own token (minted by patterd and handed
//!   to its brain, [`crate::security::call_token`]) only reads and acts on that live call.
//!   Each route and MCP tool declares its [`Permission`]; [`Grant::permits`] decides (403
//!   `forbidden_scope`). The configuration refuses an empty token unless both `listen` and
//!   `public_url` are loopback ([`ServerConfig::api_is_local`]), so a daemon behind a reverse
//!   proxy always has one.
//! - **Token-less local mode** (both loopback, no token): the peer must be a loopback address,
//!   the `Host` header a loopback name (DNS rebinding), and a request that carries `Forwarded`,
//!   `X-Forwarded-*` or `Via` — i.e. came through a proxy — is refused. Every accepted request
//!   is an operator's.
//! - **Failed authentications** are counted per peer
//!   ([`crate::security::auth_limit::AuthFailures`]): past
//!   [`AUTH_FAILURES_PER_WINDOW`] in a minute the peer gets 429 with `Retry-After`, its token
//!   unchecked, while other peers go on.
//! - **Cross-site requests.** A request whose `Origin` is not `public_url`'s origin is refused,
//!   and a `POST`/`PUT` must say `Content-Type: application/json` (a web page cannot send that
//!   without a CORS preflight, which we never answer).

use std::net::SocketAddr;
use std::time::Instant;

use hyper::{HeaderMap, Method};

use super::{ApiError, ErrorCode};
use crate::config::{ServerConfig, TokenScope};
use crate::security::auth_limit::AUTH_FAILURES_PER_WINDOW;
pub(crate) use crate::security::auth_limit::peer_key;
use crate::security::call_token::CallTokens;
pub(crate) use crate::security::link::unix_now;

/// What a request's credential may do (the scope of its [`Grant`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything: `server.api_token`, an `operator` entry of `[[server.api_tokens]]`, or an
    /// accepted request in token-less local mode.
    Operator,
    /// Reads only (a `read` entry).
    Read,
    /// Reads of and actions on this one live call (its call token).
    Call(String),
    /// A peer instance of the cluster forwarding a request (the cluster token, presented with
    /// `X-Patterd-Forwarded-By`; [`super::peer`]): an operator's rights on calls — reads and
    /// actions, not placing calls or changing settings — and never forwarded again.
    Peer,
    /// A call token this instance did not mint, for a call it does not run (in a cluster, the
    /// call's owner minted it): only that owner can check it, so nothing is answered here on
    /// its strength — requests on its call are forwarded with it and the owner decides
    /// ([`super::forward`]).
    ForeignCall {
        call: String,
        token: crate::util::secret::Secret,
    },
}

/// What a route or MCP tool does: the input of the scope check. Every route of
/// [`super::dispatch`] and every MCP tool declares one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Reads across calls: call lists, totals, the call-list page, `/metrics`.
    ReadAll,
    /// Reads one call: its record, transcript, events, metrics, recording and timeline.
    ReadCall,
    /// Acts on one live call: hang up, transfer, DTMF, say.
    ActOnCall,
    /// Changes what the daemon does: places calls, sets inbound overrides, opens browser calls.
    Operator,
}

/// An accepted request's credential: its scope and who holds it (for logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub scope: Scope,
    /// `api_token`, the `[[server.api_tokens]]` entry's name, `call token` or `local`.
    pub name: String,
}

impl Grant {
    /// An operator's grant.
    pub fn operator(name: &str) -> Self {
        Self {
            scope: Scope::Operator,
            name: name.to_string(),
        }
    }

    /// True when this grant covers `permission` on some call (what MCP's `tools/list` offers).
    pub fn may_use(&self, permission: Permission) -> bool {
        match &self.scope {
            Scope::Operator => true,
            Scope::Read => matches!(permission, Permission::ReadAll | Permission::ReadCall),
            Scope::Call(_) | Scope::ForeignCall { .. } => {
                matches!(permission, Permission::ReadCall | Permission::ActOnCall)
            }
            Scope::Peer => !matches!(permission, Permission::Operator),
        }
    }

    /// The one call a call token reaches (checked here or to be checked by its owner).
    pub fn own_call(&self) -> Option<&str> {
        match &self.scope {
            Scope::Call(c) | Scope::ForeignCall { call: c, .. } => Some(c),
            _ => None,
        }
    }

    /// `Ok` when this grant covers `permission` (for the per-call permissions, on `call`);
    /// otherwise a 403 `forbidden_scope` that says what the token may do.
    pub fn permits(&self, permission: Permission, call: Option<&str>) -> Result<(), ApiError> {
        let refuse = |message: String| Err(ApiError::new(403, ErrorCode::ForbiddenScope, message));
        // A foreign call token follows a checked one's rule here (its owner checks the token
        // itself; whoever serves a request locally must refuse it: `api::forward`).
        match (&self.scope, permission) {
            (Scope::Operator, _) => Ok(()),
            (Scope::Peer, Permission::Operator) => refuse(
                "a forwarded request (the cluster token) reads and acts on calls only; placing \
                 calls and inbound settings need an operator token"
                    .to_string(),
            ),
            (Scope::Peer, _) => Ok(()),
            (Scope::Read, Permission::ReadAll | Permission::ReadCall) => Ok(()),
            (Scope::Read, _) => refuse(format!(
                "token `{}` has scope `read`: it reads calls but may not act on them or change \
                 the daemon; use an operator token (or, for the brain of a call, that call's \
                 X-Patterd-Call-Token)",
                self.name.escape_default()
            )),
            (
                Scope::Call(own) | Scope::ForeignCall { call: own, .. },
                Permission::ReadCall | Permission::ActOnCall,
            ) if call == Some(own.as_str()) => Ok(()),
            (
                Scope::Call(own) | Scope::ForeignCall { call: own, .. },
                Permission::ReadCall | Permission::ActOnCall,
            ) => refuse(format!(
                "this call token belongs to call `{}` and reaches that call only, not call `{}`",
                own.escape_default(),
                call.unwrap_or("").escape_default()
            )),
            (Scope::Call(own) | Scope::ForeignCall { call: own, .. }, _) => refuse(format!(
                "this call token reaches only its own call `{}`: listing calls, totals, placing \
                 calls and inbound settings need an operator or read token",
                own.escape_default()
            )),
        }
    }
}

/// Maps a presented call token to the live call it was minted for (`None`: not a valid token
/// of this process, or its call has ended).
pub(crate) type CallTokenCheck<'a> = &'a dyn Fn(&str) -> Option<String>;

/// For checks that never accept call tokens.
pub(crate) const NO_CALL_TOKENS: CallTokenCheck<'static> = &|_| None;

/// The call tokens of `tokens` whose call is live in `calls`.
pub(crate) fn live_call_tokens<'a>(
    tokens: &'a CallTokens,
    calls: &'a crate::call::CallRegistry,
) -> impl Fn(&str) -> Option<String> + 'a {
    move |given| tokens.verify(given).filter(|id| calls.get(id).is_some())
}

/// True for `localhost`, `127.0.0.1`, `[::1]` with or without a port.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let h = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Everything the access check looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access<'a> {
    pub peer: SocketAddr,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
}

/// The full check for `/v1` and `/mcp`: origin, content type, then the bearer token (or, in
/// token-less local mode, a loopback peer and `Host` and no proxy headers). The grant says
/// what the request may do ([`Grant::permits`]).
pub(crate) fn authorize(
    server: &ServerConfig,
    req: Access<'_>,
    calls: CallTokenCheck<'_>,
) -> Result<Grant, ApiError> {
    check_origin(server, req.headers)?;
    let grant = check_caller(server, req, calls)?;
    check_content_type(req.method, req.headers)?;
    Ok(grant)
}

/// Who is asking, without the web-page checks (origin, content type): the bearer token, or in
/// token-less local mode a loopback peer and `Host` without proxy headers. The server gives
/// its verdict to carrier routes that open calls without a carrier signature (the browser
/// phone), which check the origin themselves.
pub(crate) fn check_caller(
    server: &ServerConfig,
    req: Access<'_>,
    calls: CallTokenCheck<'_>,
) -> Result<Grant, ApiError> {
    if server.api_token.is_empty() {
        check_local(server, req).map(|()| Grant::operator("local"))
    } else {
        check_bearer(server, req.headers, calls)
    }
}

/// `Authorization: Bearer <token>`: `api_token`, a `[[server.api_tokens]]` entry or (through
/// `calls`) a live call's token; with no `api_token` configured nothing passes.
pub(crate) fn check_bearer(
    server: &ServerConfig,
    headers: &HeaderMap,
    calls: CallTokenCheck<'_>,
) -> Result<Grant, ApiError> {
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    if let Some(g) = given
        && !server.api_token.is_empty()
    {
        if let Some(grant) = configured_grant(server, g) {
            return Ok(grant);
        }
        if CallTokens::looks_like(g) {
            return match calls(g) {
                Some(call) => Ok(Grant {
                    scope: Scope::Call(call),
                    name: "call token".into(),
                }),
                None => Err(ApiError::new(
                    401,
                    ErrorCode::Unauthorized,
                    "this call token is not valid: it was not minted by this daemon, or its \
                     call has ended (a call token works only while its call is live)",
                )),
            };
        }
    }
    Err(ApiError::new(
        401,
        ErrorCode::Unauthorized,
        "missing or wrong bearer token: send `Authorization: Bearer <server.api_token>` (or \
         another token of [[server.api_tokens]])",
    ))
}

/// The grant of a configured token: `api_token` or a `[[server.api_tokens]]` entry. Every
/// candidate is compared (constant time each), so the timing does not say which matched.
fn configured_grant(server: &ServerConfig, given: &str) -> Option<Grant> {
    let mut found = None;
    if crate::security::ct_eq(given.as_bytes(), server.api_token.expose().as_bytes()) {
        found = Some(Grant::operator("api_token"));
    }
    for t in &server.api_tokens {
        if !t.token.is_empty()
            && crate::security::ct_eq(given.as_bytes(), t.token.expose().trim().as_bytes())
            && found.is_none()
        {
            found = Some(Grant {
                scope: match t.scope {
                    TokenScope::Operator => Scope::Operator,
                    TokenScope::Read => Scope::Read,
                },
                name: t.name.clone(),
            });
        }
    }
    found
}

/// True when `given` is a configured token that may read (`api_token`, any
/// `[[server.api_tokens]]` entry; never with no `api_token` configured, never a call token):
/// the tokens a page's `?token=` may be exchanged with.
pub(crate) fn token_ok(server: &ServerConfig, given: &str) -> bool {
    !server.api_token.is_empty()
        && configured_grant(server, given)
            .is_some_and(|g| g.permits(Permission::ReadAll, None).is_ok())
}

/// How long a page cookie is valid (12 h); the expiry is inside its MAC.
pub(crate) const PAGE_COOKIE_TTL_S: u64 = 12 * 3600;

fn page_mac(server: &ServerConfig, expiry: u64) -> String {
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        server.api_token.expose().as_bytes(),
    );
    let msg = format!("patterd page session v2\n{expiry}");
    hex::encode(ring::hmac::sign(&key, msg.as_bytes()).as_ref())
}

/// The web pages' cookie value at unix time `now`: `<expiry>.<HMAC-SHA256 keyed by api_token
/// over a fixed purpose and the expiry, hex>` — derived from the token, so the cookie never
/// carries the token itself, and refused after its expiry whatever the browser keeps.
pub(crate) fn page_cookie(server: &ServerConfig, now: u64) -> String {
    let expiry = now.saturating_add(PAGE_COOKIE_TTL_S);
    format!("{expiry}.{}", page_mac(server, expiry))
}

/// True when `value` is an unexpired page cookie for this token at unix time `now` (never with
/// no token configured).
pub(crate) fn page_cookie_ok(server: &ServerConfig, value: &str, now: u64) -> bool {
    let Some((expiry, mac)) = value.split_once('.') else {
        return false;
    };
    let Ok(expiry) = expiry.parse::<u64>() else {
        return false;
    };
    !server.api_token.is_empty()
        && expiry > now
        && crate::security::ct_eq(mac.as_bytes(), page_mac(server, expiry).as_bytes())
}

/// 429 `too_many_failures` (with `Retry-After`) while the request's peer has used up its
/// failed authentications ([`crate::security::auth_limit::AuthFailures`]).
pub(crate) fn throttled(
    app: &crate::app::App,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let Some(wait) = app
        .auth_failures
        .blocked(peer_key(peer, headers), Instant::now())
    else {
        return Ok(());
    };
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    let mut e = ApiError::new(
        429,
        ErrorCode::TooManyFailures,
        format!(
            "too many failed authentications from this address ({AUTH_FAILURES_PER_WINDOW} a \
             minute); wait {secs} s and send the right bearer token"
        ),
    );
    e.retry_after_s = Some(secs);
    Err(e)
}

/// An API request's access check with the daemon's state: refused while its peer is
/// [`throttled`], else `check` with the configuration in force and the live calls' tokens; a
/// 401 counts against the peer.
pub(crate) fn admit_request(
    app: &crate::app::App,
    peer: SocketAddr,
    headers: &HeaderMap,
    check: impl FnOnce(&ServerConfig, CallTokenCheck<'_>) -> Result<Grant, ApiError>,
) -> Result<Grant, ApiError> {
    throttled(app, peer, headers)?;
    let config = app.config();
    let calls = live_call_tokens(&app.call_tokens, &app.calls);
    // A peer's forwarded request (cluster token + `X-Patterd-Forwarded-By`) is checked apart;
    // a call token it hands on that is refused is the client's failure, counted where the
    // client sent it, not against the peer.
    let (r, counts) = match super::peer::forwarded(app, headers, &calls) {
        Some(checked) => checked,
        None => {
            let r = check(&config.server, &calls);
            // A call token another instance minted: its owner checks it (`api::forward`).
            (super::peer::or_foreign_call_token(app, headers, r), true)
        }
    };
    if counts && matches!(&r, Err(e) if e.status == 401) {
        app.auth_failures
            .failed(peer_key(peer, headers), Instant::now());
    }
    r
}

/// Names of headers a proxy adds.
fn is_proxy_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "forwarded" || n == "via" || n.starts_with("x-forwarded-")
}

fn check_local(server: &ServerConfig, req: Access<'_>) -> Result<(), ApiError> {
    if !server.api_is_local() {
        // The configuration refuses this at load; never fail open if it is built by hand.
        return Err(ApiError::new(
            401,
            ErrorCode::Unauthorized,
            "server.api_token is not set and the API is reachable from elsewhere; set \
             server.api_token and send `Authorization: Bearer <server.api_token>`",
        ));
    }
    if !req.peer.ip().is_loopback() {
        return Err(ApiError::new(
            403,
            ErrorCode::ForbiddenPeer,
            "without server.api_token the API only answers connections from this machine; \
             set server.api_token to use it from elsewhere",
        ));
    }
    if let Some(h) = req
        .headers
        .keys()
        .map(|k| k.as_str())
        .find(|k| is_proxy_header(k))
    {
        return Err(ApiError::new(
            403,
            ErrorCode::ProxiedRequest,
            format!(
                "without server.api_token the API refuses requests that came through a proxy \
                 (this one carries `{h}`); set server.api_token to use it through a proxy"
            ),
        ));
    }
    check_local_host(req.headers)
}

/// Token-less local mode's DNS-rebinding check: the `Host` header must be a loopback name.
pub(crate) fn check_local_host(headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_loopback_host(host) {
        return Err(ApiError::new(
            403,
            ErrorCode::ForbiddenHost,
            "without server.api_token the API only answers requests addressed to a loopback \
             host (localhost, 127.0.0.1); set server.api_token to use it from elsewhere",
        ));
    }
    Ok(())
}

/// The origin (`scheme://host[:port]`) of `public_url`.
fn own_origin(server: &ServerConfig) -> Option<String> {
    url::Url::parse(&server.public_url)
        .ok()
        .map(|u| u.origin().ascii_serialization())
        .filter(|o| o != "null")
}

/// A request with an `Origin` other than `public_url`'s is refused (a browser adds `Origin`
/// to every cross-site request).
fn check_origin(server: &ServerConfig, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(hyper::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let ours = own_origin(server);
    let same = url::Url::parse(origin)
        .ok()
        .map(|u| u.origin().ascii_serialization())
        .is_some_and(|o| Some(&o) == ours.as_ref());
    if same {
        return Ok(());
    }
    Err(ApiError::new(
        403,
        ErrorCode::ForbiddenOrigin,
        format!(
            "requests from web pages of another origin are refused; only {} may send an \
             Origin header (agents and scripts send none)",
            ours.as_deref().unwrap_or("server.public_url")
        ),
    ))
}

/// `POST` and `PUT` must carry `Content-Type: application/json` (parameters allowed).
pub(crate) fn check_content_type(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if method != Method::POST && method != Method::PUT {
        return Ok(());
    }
    let json = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return Ok(());
    }
    Err(ApiError::new(
        415,
        ErrorCode::UnsupportedMediaType,
        "POST and PUT requests need `Content-Type: application/json` (send `{}` when there is \
         nothing to say)",
    ))
}

/// A peer-controlled string for a log line (see [`crate::security::truncate_for_log`]).
pub(crate) fn for_log(s: &str, max: usize) -> String {
    crate::security::truncate_for_log(s, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(token: &str, listen: &str, public_url: &str) -> ServerConfig {
        ServerConfig {
            listen: listen.into(),
            public_url: public_url.into(),
            api_token: crate::util::secret::Secret::new(token.to_string()),
            ..ServerConfig::default()
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        h
    }

    fn check(s: &ServerConfig, peer: &str, method: Method, h: &HeaderMap) -> Result<(), u16> {
        authorize(
            s,
            Access {
                peer: peer.parse().expect("peer"),
                method: &method,
                headers: h,
            },
            NO_CALL_TOKENS,
        )
        .map(|_| ())
        .map_err(|e| e.status)
    }

    fn bearer(token: &str) -> HeaderMap {
        headers(&[("authorization", &format!("Bearer {token}"))])
    }

    const OPERATOR: &str = "0123456789abcdef0123456789abcdef";
    const READER: &str = "read-0123456789abcdef0123456789ab";
    const SECOND_OP: &str = "ops2-0123456789abcdef0123456789ab";

    fn scoped_server() -> ServerConfig {
        let mut s = server(OPERATOR, "127.0.0.1:8080", "https://voice.example.com");
        let entry = |name: &str, token: &str, scope| crate::config::ApiTokenConfig {
            name: name.into(),
            token: crate::util::secret::Secret::new(token.to_string()),
            scope,
        };
        s.api_tokens = vec![
            entry("dashboard", READER, TokenScope::Read),
            entry("ops", SECOND_OP, TokenScope::Operator),
        ];
        s
    }

    /// Each token gets its scope: `api_token` and `operator` entries everything, `read`
    /// entries reads only, a live call's token its own call only.
    #[test]
    fn tokens_get_their_scopes() {
        let s = scoped_server();
        let grant = |token: &str, calls: CallTokenCheck<'_>| {
            check_bearer(&s, &bearer(token), calls).map_err(|e| e.status)
        };
        assert_eq!(
            grant(OPERATOR, NO_CALL_TOKENS),
            Ok(Grant::operator("api_token"))
        );
        assert_eq!(grant(SECOND_OP, NO_CALL_TOKENS), Ok(Grant::operator("ops")));
        let read = grant(READER, NO_CALL_TOKENS).expect("read token");
        assert_eq!(
            (read.scope.clone(), read.name.as_str()),
            (Scope::Read, "dashboard")
        );
        assert_eq!(grant("nope", NO_CALL_TOKENS), Err(401));

        let tokens = CallTokens::new();
        let live = |id: &str| id == "CA-live";
        let calls = |t: &str| tokens.verify(t).filter(|id| live(id));
        let call = grant(&tokens.mint("CA-live"), &calls).expect("call token");
        assert_eq!(call.scope, Scope::Call("CA-live".into()));
        // The call has ended (or never was): its token is refused.
        assert_eq!(grant(&tokens.mint("CA-ended"), &calls), Err(401));
        // Another process's call token is refused.
        assert_eq!(grant(&CallTokens::new().mint("CA-live"), &calls), Err(401));
        // Token-less mode ignores call tokens: nothing to scope.
        let local = server("", "127.0.0.1:8080", "http://127.0.0.1:8080");
        assert_eq!(
            check_bearer(&local, &bearer(&tokens.mint("CA-live")), &calls).map_err(|e| e.status),
            Err(401)
        );
    }

    #[test]
    fn scopes_permit_what_they_say() {
        use Permission::*;
        let status = |g: &Grant, p, call| g.permits(p, call).map_err(|e| (e.status, e.code));
        let op = Grant::operator("api_token");
        for p in [ReadAll, ReadCall, ActOnCall, Operator] {
            assert_eq!(status(&op, p, Some("CA1")), Ok(()));
        }
        let read = Grant {
            scope: Scope::Read,
            name: "dash".into(),
        };
        assert_eq!(status(&read, ReadAll, None), Ok(()));
        assert_eq!(status(&read, ReadCall, Some("CA1")), Ok(()));
        let forbidden = Err((403, ErrorCode::ForbiddenScope));
        assert_eq!(status(&read, ActOnCall, Some("CA1")), forbidden);
        assert_eq!(status(&read, Operator, None), forbidden);
        let call = Grant {
            scope: Scope::Call("CA1".into()),
            name: "call token".into(),
        };
        assert_eq!(status(&call, ReadCall, Some("CA1")), Ok(()));
        assert_eq!(status(&call, ActOnCall, Some("CA1")), Ok(()));
        assert_eq!(status(&call, ActOnCall, Some("CA2")), forbidden);
        assert_eq!(status(&call, ReadCall, Some("CA2")), forbidden);
        assert_eq!(status(&call, ReadAll, None), forbidden);
        assert_eq!(status(&call, Operator, None), forbidden);
        let e = call
            .permits(ActOnCall, Some("CA2"))
            .expect_err("other call");
        assert!(
            e.message.contains("`CA1`") && e.message.contains("`CA2`"),
            "{}",
            e.message
        );
        let e = read.permits(ActOnCall, Some("CA1")).expect_err("read acts");
        assert!(e.message.contains("scope `read`"), "{}", e.message);
    }

    /// A page's `?token=` may be exchanged with a token that reads; never a call token.
    #[test]
    fn page_tokens_are_the_configured_ones() {
        let s = scoped_server();
        assert!(token_ok(&s, OPERATOR) && token_ok(&s, READER) && token_ok(&s, SECOND_OP));
        assert!(!token_ok(&s, &CallTokens::new().mint("CA1")));
        assert!(!token_ok(&s, "nope"));
    }

    /// The page cookie carries its expiry under the MAC: an expired one is refused, and a
    /// changed expiry breaks the MAC.
    #[test]
    fn page_cookies_expire() {
        let s = server(OPERATOR, "127.0.0.1:8080", "https://voice.example.com");
        let now = 1_800_000_000;
        let c = page_cookie(&s, now);
        assert!(page_cookie_ok(&s, &c, now));
        assert!(page_cookie_ok(&s, &c, now + PAGE_COOKIE_TTL_S - 1));
        assert!(!page_cookie_ok(&s, &c, now + PAGE_COOKIE_TTL_S));
        let (_, mac) = c.split_once('.').expect("expiry.mac");
        let extended = format!("{}.{mac}", now + 10 * PAGE_COOKIE_TTL_S);
        assert!(!page_cookie_ok(&s, &extended, now + PAGE_COOKIE_TTL_S));
        // The old cookie (a bare MAC, no expiry) is refused.
        assert!(!page_cookie_ok(&s, mac, now));
        let other = server(
            "another-0123456789abcdef0123456789",
            "127.0.0.1:8080",
            "https://v",
        );
        assert!(!page_cookie_ok(&other, &c, now));
    }

    const LOCAL: &str = "127.0.0.1:5000";
    const REMOTE: &str = "203.0.113.9:5000";

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback_host("localhost"));
        assert!(is_loopback_host("LOCALHOST:8080"));
        assert!(is_loopback_host("127.0.0.1:9"));
        assert!(is_loopback_host("[::1]:80"));
        assert!(!is_loopback_host("evil.example.com"));
        assert!(!is_loopback_host("127.0.0.1.evil.com:80"));
        assert!(!is_loopback_host(""));
    }

    #[test]
    fn tokenless_mode_needs_a_loopback_peer_and_no_proxy_headers() {
        let s = server("", "127.0.0.1:8080", "http://127.0.0.1:8080");
        let host = headers(&[("host", "127.0.0.1:8080")]);
        assert_eq!(check(&s, LOCAL, Method::GET, &host), Ok(()));
        // The reverse-proxy deployment: loopback Host, but the peer is remote...
        assert_eq!(check(&s, REMOTE, Method::GET, &host), Err(403));
        // ...or the proxy is local and says it forwarded the request.
        for h in ["forwarded", "x-forwarded-for", "x-forwarded-proto", "via"] {
            let hs = headers(&[("host", "127.0.0.1:8080"), (h, "1.2.3.4")]);
            assert_eq!(check(&s, LOCAL, Method::GET, &hs), Err(403), "{h}");
        }
        assert_eq!(
            check(
                &s,
                LOCAL,
                Method::GET,
                &headers(&[("host", "evil.example")])
            ),
            Err(403)
        );
    }

    #[test]
    fn tokenless_mode_never_opens_an_exposed_api() {
        // A configuration built by hand (not through the loader) fails closed.
        let s = server("", "127.0.0.1:8080", "https://voice.example.com");
        let host = headers(&[("host", "127.0.0.1:8080")]);
        assert_eq!(check(&s, LOCAL, Method::GET, &host), Err(401));
    }

    #[test]
    fn token_mode_needs_the_bearer_token() {
        let s = server("sekret", "127.0.0.1:8080", "https://voice.example.com");
        assert_eq!(check(&s, REMOTE, Method::GET, &HeaderMap::new()), Err(401));
        let wrong = headers(&[("authorization", "Bearer nope")]);
        assert_eq!(check(&s, LOCAL, Method::GET, &wrong), Err(401));
        let right = headers(&[
            ("authorization", "Bearer sekret"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(check(&s, REMOTE, Method::GET, &right), Ok(()));
    }

    #[test]
    fn cross_site_requests_are_refused() {
        let s = server("", "127.0.0.1:8080", "http://127.0.0.1:8080");
        let base = [("host", "127.0.0.1:8080")];
        // A no-cors fetch posts JSON as text/plain.
        let plain = headers(&[base[0], ("content-type", "text/plain")]);
        assert_eq!(check(&s, LOCAL, Method::POST, &plain), Err(415));
        let none = headers(&base);
        assert_eq!(check(&s, LOCAL, Method::POST, &none), Err(415));
        assert_eq!(check(&s, LOCAL, Method::PUT, &none), Err(415));
        let json = headers(&[base[0], ("content-type", "Application/JSON; charset=utf-8")]);
        assert_eq!(check(&s, LOCAL, Method::POST, &json), Ok(()));
        let evil = headers(&[
            base[0],
            ("content-type", "application/json"),
            ("origin", "https://evil.example"),
        ]);
        assert_eq!(check(&s, LOCAL, Method::POST, &evil), Err(403));
        assert_eq!(
            check(
                &s,
                LOCAL,
                Method::GET,
                &headers(&[base[0], ("origin", "null")])
            ),
            Err(403)
        );
        let ours = headers(&[base[0], ("origin", "http://127.0.0.1:8080")]);
        assert_eq!(check(&s, LOCAL, Method::GET, &ours), Ok(()));
        // With a token, a foreign origin is refused too.
        let t = server("sekret", "127.0.0.1:8080", "https://voice.example.com");
        let evil = headers(&[
            ("authorization", "Bearer sekret"),
            ("origin", "https://evil.example"),
        ]);
        assert_eq!(check(&t, REMOTE, Method::GET, &evil), Err(403));
        let ours = headers(&[
            ("authorization", "Bearer sekret"),
            ("origin", "https://voice.example.com"),
        ]);
        assert_eq!(check(&t, REMOTE, Method::GET, &ours), Ok(()));
    }
}
