//! The REST API's HTTP edge (`/v1/*`): bearer authentication against `server.api_token`
//! (constant-time), JSON bodies in and out, and JSON errors `{"error": {"code", "message"}}`.
//! The operations themselves are in [`crate::api`].
//!
//! When `api_token` is empty the configuration only allows a loopback `listen`, and requests are
//! accepted without a token — but only with a loopback `Host` header, so a web page cannot
//! reach the API through DNS rebinding.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tracing::info;

use super::App;
use super::http::{Body, read_body, respond};
use crate::api::{self, ApiError};

/// A JSON response.
pub fn json_response(status: u16, v: &Value) -> Response<Body> {
    respond(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

fn error(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.status, &e.body());
    if e.status == 401 {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer realm=\"patterd\""),
        );
    }
    r
}

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

/// `/v1/*`.
pub async fn handle(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    if let Err(e) = authorize(&app, req.headers()) {
        info!(%peer, path = req.uri().path(), code = e.code, "API request refused");
        return error(&e);
    }
    let method = req.method().clone();
    let path = req
        .uri()
        .path()
        .strip_prefix("/v1")
        .unwrap_or("")
        .to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = match read_body(req.into_body(), app.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            return error(&ApiError::new(
                if matches!(e, super::http::BodyError::TooLarge(_)) {
                    413
                } else {
                    400
                },
                "bad_body",
                e.to_string(),
            ));
        }
    };
    let json = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return error(&ApiError::bad_request(format!(
                    "the body is not valid JSON: {e}"
                )));
            }
        }
    };
    match api::dispatch(&app, &method, &path, &query, json).await {
        Ok((status, v)) => json_response(status, &v),
        Err(e) => error(&e),
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
