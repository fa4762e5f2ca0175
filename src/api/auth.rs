//! Who may use the API (`/v1/*` and `/mcp` alike) and how requests must look.
//!
//! - **Bearer token.** With `server.api_token` set, every request needs
//!   `Authorization: Bearer <api_token>` (compared in constant time). The configuration refuses
//!   an empty token unless both `listen` and `public_url` are loopback
//!   ([`ServerConfig::api_is_local`]), so a daemon behind a reverse proxy always has one.
//! - **Token-less local mode** (both loopback, no token): the peer must be a loopback address,
//!   the `Host` header a loopback name (DNS rebinding), and a request that carries `Forwarded`,
//!   `X-Forwarded-*` or `Via` — i.e. came through a proxy — is refused.
//! - **Cross-site requests.** A request whose `Origin` is not `public_url`'s origin is refused,
//!   and a `POST`/`PUT` must say `Content-Type: application/json` (a web page cannot send that
//!   without a CORS preflight, which we never answer).

use std::net::SocketAddr;

use hyper::{HeaderMap, Method};

use super::{ApiError, ErrorCode};
use crate::config::ServerConfig;

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
/// token-less local mode, a loopback peer and `Host` and no proxy headers).
pub(crate) fn authorize(server: &ServerConfig, req: Access<'_>) -> Result<(), ApiError> {
    check_origin(server, req.headers)?;
    if server.api_token.is_empty() {
        check_local(server, req)?;
    } else {
        check_bearer(server, req.headers)?;
    }
    check_content_type(req.method, req.headers)
}

/// Who is asking, without the web-page checks (origin, content type): the bearer token, or in
/// token-less local mode a loopback peer and `Host` without proxy headers. The server gives
/// its verdict to carrier routes that open calls without a carrier signature (the browser
/// phone), which check the origin themselves.
pub(crate) fn check_caller(server: &ServerConfig, req: Access<'_>) -> Result<(), ApiError> {
    if server.api_token.is_empty() {
        check_local(server, req)
    } else {
        check_bearer(server, req.headers)
    }
}

/// `Authorization: Bearer <api_token>`; with no token configured nothing passes.
pub(crate) fn check_bearer(server: &ServerConfig, headers: &HeaderMap) -> Result<(), ApiError> {
    let token = &server.api_token;
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(g)
            if !token.is_empty()
                && crate::security::ct_eq(g.as_bytes(), token.expose().as_bytes()) =>
        {
            Ok(())
        }
        _ => Err(ApiError::new(
            401,
            ErrorCode::Unauthorized,
            "missing or wrong bearer token: send `Authorization: Bearer <server.api_token>`",
        )),
    }
}

/// True when `given` is `server.api_token` (never with no token configured).
pub(crate) fn token_ok(server: &ServerConfig, given: &str) -> bool {
    let token = &server.api_token;
    !token.is_empty() && crate::security::ct_eq(given.as_bytes(), token.expose().as_bytes())
}

/// The web pages' cookie value: HMAC-SHA256 keyed by `api_token` over a fixed purpose, hex —
/// derived from the token, so the cookie never carries the token itself.
pub(crate) fn page_cookie(server: &ServerConfig) -> String {
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        server.api_token.expose().as_bytes(),
    );
    hex::encode(ring::hmac::sign(&key, b"patterd page session v1").as_ref())
}

/// True when `value` is the pages' cookie for this token (never with no token configured).
pub(crate) fn page_cookie_ok(server: &ServerConfig, value: &str) -> bool {
    !server.api_token.is_empty()
        && crate::security::ct_eq(value.as_bytes(), page_cookie(server).as_bytes())
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
    let host = req
        .headers
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
        )
        .map_err(|e| e.status)
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
