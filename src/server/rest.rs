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

use crate::api::auth::{Access, CallTokenCheck, admit_request, authorize, for_log, throttled};
use crate::api::{self, ApiError, ErrorCode, Permission};
use crate::app::App;
use crate::net::http::{Body, BodyError, json as json_response, read_body, respond};
use crate::server::pages;

/// The JSON error response (with `WWW-Authenticate` on 401, `Retry-After` on 429).
pub fn error(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.status, &e.body());
    e.add_headers(r.headers_mut());
    r
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
            .and_then(|g| g.permits(permission, call))
        {
            Ok(()) => pages::render(&app, page).await,
            Err(e) => {
                info!(%peer, path = %for_log(req.uri().path(), 64), code = e.code.as_str(), "page request refused");
                error(&e)
            }
        };
    }
    let grant = match admit_request(&app, peer, req.headers(), check) {
        Ok(g) => g,
        Err(e) => {
            info!(%peer, path = %for_log(req.uri().path(), 64), code = e.code.as_str(), "API request refused");
            return error(&e);
        }
    };
    if req.method() == hyper::Method::GET
        && let Some(id) = v1_path
            .strip_prefix("/calls/")
            .and_then(|p| p.strip_suffix("/recording"))
            .filter(|id| !id.contains('/'))
    {
        let id = match api::decode_segment(id) {
            Ok(id) => id,
            Err(e) => return error(&e),
        };
        if let Err(e) = grant.permits(Permission::ReadCall, Some(&id)) {
            return error(&e);
        }
        return match api::recording(&app, &id).await {
            Ok(wav) => respond(200, "audio/wav", wav.into()),
            Err(e) => error(&e),
        };
    }
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
        Err(e) => error(&e),
    }
}
