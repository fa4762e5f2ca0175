//! The REST API's HTTP edge (`/v1/*`): the access check ([`crate::api::auth`]: 429 for a
//! peer past its failed authentications, then the token and its scope), JSON bodies in and
//! out, and JSON errors `{"error": {"code", "message"}}`. The operations themselves are
//! in [`crate::api`].

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tracing::info;

use crate::api::auth::{
    Access, CallTokenCheck, admit_request, authorize, check_content_type, for_log, peer_key,
    throttled,
};
use crate::api::{self, ApiError, ErrorCode, Permission};
use crate::app::App;
use crate::net::http::{AnyBody, Body, BodyError, FileBody, json as json_response, read_body};
use crate::server::pages;

/// The JSON error response (with `WWW-Authenticate` on 401, `Retry-After` on 429).
pub fn error(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.status, &e.body());
    e.add_headers(r.headers_mut());
    r
}

/// `GET /v1/calls/{id}/recording`, streamed from the file as it is read (a recording is
/// minutes of audio: never read whole into memory); `None` for any other request.
pub(crate) async fn recording(
    app: &Arc<App>,
    peer: SocketAddr,
    req: &Request<Incoming>,
) -> Option<Response<AnyBody>> {
    use http_body_util::BodyExt;
    let id = req
        .uri()
        .path()
        .strip_prefix("/v1/calls/")
        .and_then(|p| p.strip_suffix("/recording"))
        .filter(|id| !id.contains('/') && req.method() == hyper::Method::GET)?;
    let access = Access {
        peer,
        method: req.method(),
        headers: req.headers(),
    };
    let refused = |e: &ApiError| Some(error(e).map(|b| b.boxed()));
    let check = |server: &_, calls: CallTokenCheck<'_>| authorize(server, access, calls);
    let grant = match admit_request(app, peer, req.headers(), check) {
        Ok(g) => g,
        Err(e) => {
            info!(%peer, path = %for_log(req.uri().path(), 64), code = e.code.as_str(), "API request refused");
            return refused(&e);
        }
    };
    let id = match api::decode_segment(id) {
        Ok(id) => id,
        Err(e) => return refused(&e),
    };
    // A recording is one call's: a call token reads its own only.
    if let Err(e) = grant.permits(Permission::ReadCall, Some(&id)) {
        return refused(&e);
    }
    // Not here: the instance that recorded it may serve it (a cluster; `api::forward`).
    let local = match grant.scope {
        api::Scope::ForeignCall { .. } => None,
        _ => Some(api::recording(app, &id).await),
    };
    let (file, len) = match local {
        Some(Ok(opened)) => opened,
        Some(Err(e)) if e.code != ErrorCode::NoRecording => return refused(&e),
        missing => {
            #[cfg(feature = "postgres")]
            {
                let pq = req.uri().path_and_query().map_or("", |p| p.as_str());
                match api::forward::recording(app, &grant, &id, pq).await {
                    Some(Ok(d)) => return Some(relayed(d)),
                    Some(Err(e)) => return refused(&e),
                    None => {}
                }
            }
            return refused(&match missing {
                Some(Err(e)) => e,
                _ => api::forward::call_token_refused(),
            });
        }
    };
    let mut resp = Response::new(FileBody::new(file, len).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("audio/wav"),
    );
    resp.headers_mut().insert(
        hyper::header::CONTENT_LENGTH,
        hyper::header::HeaderValue::from(len),
    );
    Some(resp)
}

/// A recording relayed from the instance that holds it, status and body as it sent them.
#[cfg(feature = "postgres")]
fn relayed(d: api::forward::Download) -> Response<AnyBody> {
    use http_body_util::BodyExt;
    let mut resp = Response::new(d.body.boxed());
    *resp.status_mut() =
        hyper::StatusCode::from_u16(d.status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    if let Some(t) = d.content_type {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, t);
    }
    if let Some(len) = d.content_length {
        resp.headers_mut().insert(
            hyper::header::CONTENT_LENGTH,
            hyper::header::HeaderValue::from(len),
        );
    }
    resp
}

/// `/v1/*`.
pub async fn handle(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let access = Access {
        peer,
        method: req.method(),
        headers: req.headers(),
    };
    let check = |server: &_, calls: CallTokenCheck<'_>| authorize(server, access, calls);
    let v1_path = req.uri().path().strip_prefix("/v1").unwrap_or("");
    if let Some(page) = pages::page_for(req.method(), v1_path, req.headers()) {
        // A blocked peer gets no `?token=` exchange either (no guessing through it).
        if let Err(e) = throttled(&app, peer, req.headers()) {
            return error(&e);
        }
        let config = app.config();
        let server = &config.server;
        let query = req.uri().query().unwrap_or("");
        if let Some(redirect) = pages::exchange_token(server, req.uri().path(), query) {
            info!(%peer, "page token exchanged for a page cookie");
            return redirect;
        }
        if pages::has_cookie(server, req.headers()) {
            return pages::render(&app, page).await;
        }
        let (permission, call) = page.permission();
        return match admit_request(&app, peer, req.headers(), check)
            // Pages render here: never on a call token nobody here could check.
            .and_then(|g| match g.scope {
                api::Scope::ForeignCall { .. } => Err(api::forward::call_token_refused()),
                _ => Ok(g),
            })
            .and_then(|g| g.permits(permission, call))
        {
            Ok(()) => pages::render(&app, page).await,
            Err(e) => {
                info!(%peer, path = %for_log(req.uri().path(), 64), code = e.code.as_str(), "page request refused");
                error(&e)
            }
        };
    }
    let grant = match admit_request(&app, peer, req.headers(), check)
        // Again for grants made past `authorize` (a peer's, another instance's call token).
        .and_then(|g| check_content_type(req.method(), req.headers()).map(|()| g))
    {
        Ok(g) => g,
        Err(e) => {
            info!(%peer, path = %for_log(req.uri().path(), 64), code = e.code.as_str(), "API request refused");
            return error(&e);
        }
    };
    let client = peer_key(peer, req.headers());
    let method = req.method().clone();
    let path = req
        .uri()
        .path()
        .strip_prefix("/v1")
        .unwrap_or("")
        .to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = match read_body(req.into_body(), app.config().server.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            return error(&ApiError::new(
                if matches!(e, BodyError::TooLarge(_)) {
                    413
                } else {
                    400
                },
                ErrorCode::BadBody,
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
    match api::dispatch(&app, &grant, &method, &path, &query, json).await {
        Ok((status, v)) => json_response(status, &v),
        Err(e) => {
            if e.status == 401 {
                // A call token the call's owner refused (forwarded): the client's failure.
                app.auth_failures.failed(client, std::time::Instant::now());
            }
            error(&e)
        }
    }
}
