//! Who may use the API (`/v1/*` and `/mcp` alike): bearer authentication against
//! `server.api_token`, compared in constant time. When `api_token` is empty the configuration
//! only allows a loopback `listen`, and requests are accepted without a token — but only with a
//! loopback `Host` header, so a web page cannot reach the API through DNS rebinding.

use super::ApiError;
use crate::app::App;

/// True for `localhost`, `127.0.0.1`, `[::1]` with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
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

/// Checks the bearer token (or, without one configured, a loopback `Host`).
pub fn authorize(app: &App, headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let token = &app.config.server.api_token;
    if token.is_empty() {
        let host = headers
            .get(hyper::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if is_loopback_host(host) {
            return Ok(());
        }
        return Err(ApiError::new(
            403,
            "forbidden_host",
            "without server.api_token the API only answers requests addressed to a loopback \
             host (localhost, 127.0.0.1); set api_token to use it from elsewhere",
        ));
    }
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(g) if crate::security::ct_eq(g.as_bytes(), token.expose().as_bytes()) => Ok(()),
        _ => Err(ApiError::new(
            401,
            "unauthorized",
            "missing or wrong bearer token: send `Authorization: Bearer <server.api_token>`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
