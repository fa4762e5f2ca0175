//! The HTTP side of the operator's pages under `/v1` (rendered by `api::pages`): which
//! request asks for a page — `GET /v1/calls/{id}/timeline` always, `GET /v1/calls` when the
//! client prefers `text/html` (JSON clients keep the API) — and how a browser gets in. A
//! browser cannot send the bearer header, so a page may be opened once with
//! `?token=<api_token>`: the token is checked, exchanged for an `HttpOnly; SameSite=Strict`
//! cookie holding its expiry and an HMAC over it derived from the token (never the token
//! itself; refused once expired, whatever the browser keeps), and the browser is redirected (303) to the same page without the token. That cookie opens pages only, never
//! the JSON API.

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Response};

use crate::api::auth::unix_now;
use crate::api::auth::{PAGE_COOKIE_TTL_S, page_cookie, page_cookie_ok, token_ok};
use crate::api::{Permission, pages};
use crate::app::App;
use crate::config::ServerConfig;
use crate::net::http::{Body, respond};

/// The page cookie's name.
pub(crate) const COOKIE: &str = "patterd_page";

/// Which page a request is for, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    Calls,
    Timeline(String),
}

impl Page {
    /// What the page reads, for the scope check: the call list every call, a timeline its
    /// call.
    pub(crate) fn permission(&self) -> (Permission, Option<&str>) {
        match self {
            Page::Calls => (Permission::ReadAll, None),
            Page::Timeline(id) => (Permission::ReadCall, Some(id)),
        }
    }
}

/// The page a `/v1` request asks for: the timeline always; the call list when HTML is
/// preferred over JSON (a browser), so JSON clients keep the API unchanged.
pub(crate) fn page_for(method: &Method, path: &str, headers: &HeaderMap) -> Option<Page> {
    if method != Method::GET {
        return None;
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        // The segment as the client escaped it, decoded (a segment that does not decode is
        // left to the API, which refuses it with 400).
        ["calls", id, "timeline"] if !id.is_empty() => {
            crate::api::decode_segment(id).ok().map(Page::Timeline)
        }
        ["calls"] if wants_html(headers) => Some(Page::Calls),
        _ => None,
    }
}

fn wants_html(headers: &HeaderMap) -> bool {
    let accept = headers
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let html = accept.find("text/html");
    let json = accept.find("application/json");
    match (html, json) {
        (Some(h), Some(j)) => h < j,
        (Some(_), None) => true,
        _ => false,
    }
}

/// True when the request carries a valid page cookie.
pub(crate) fn has_cookie(server: &ServerConfig, headers: &HeaderMap) -> bool {
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && page_cookie_ok(server, v, unix_now()))
}

/// `?token=` on a page: with the right token, a 303 to the same page without it that sets the
/// page cookie; `None` when the query has no token (or the wrong one: the caller then refuses
/// as for any unauthenticated request).
pub(crate) fn exchange_token(
    server: &ServerConfig,
    path: &str,
    query: &str,
) -> Option<Response<Body>> {
    let token = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())?;
    if !token_ok(server, &token) {
        return None;
    }
    let rest: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k != "token")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut location = path.to_string();
    if !rest.is_empty() {
        location.push('?');
        location.push_str(
            &form_urlencoded::Serializer::new(String::new())
                .extend_pairs(rest)
                .finish(),
        );
    }
    let secure = if server.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; Path=/v1; HttpOnly; SameSite=Strict; Max-Age={PAGE_COOKIE_TTL_S}{secure}",
        page_cookie(server, unix_now())
    );
    let mut r = respond(303, "text/plain; charset=utf-8", "see the page\n".into());
    let h = r.headers_mut();
    h.insert(
        hyper::header::LOCATION,
        HeaderValue::from_str(&location).ok()?,
    );
    h.insert(
        hyper::header::SET_COOKIE,
        HeaderValue::from_str(&cookie).ok()?,
    );
    h.insert(
        hyper::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Some(r)
}

/// Renders `page`.
pub async fn render(app: &Arc<App>, page: Page) -> Response<Body> {
    let r = match page {
        Page::Calls => pages::calls_html(app).await,
        Page::Timeline(id) => pages::timeline_html(app, &id).await,
    };
    match r {
        Ok(body) => html(200, &body),
        Err(e) => html(e.status, &pages::error_html(&e)),
    }
}

fn html(status: u16, body: &str) -> Response<Body> {
    let mut r = respond(status, "text/html; charset=utf-8", body.to_string().into());
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
        ),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    h.insert(
        hyper::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list page's links name the call the timeline route finds: web (`web-…`) and Telnyx
    /// (`v3:…`) ids, as linked and as any client may escape them.
    #[test]
    fn a_timeline_link_from_the_list_names_its_call() {
        let none = HeaderMap::new();
        for id in ["web-0123abcd", "v3:Ab-12_cD.x~y", "CA123", "a b/c%d"] {
            let href = format!("/v1/calls/{}/timeline", pages::encode_segment(id));
            let path = href.strip_prefix("/v1").expect("under /v1");
            assert_eq!(
                page_for(&Method::GET, path, &none),
                Some(Page::Timeline(id.to_string())),
                "{href}"
            );
        }
        assert_eq!(pages::encode_segment("web-1"), "web-1");
        assert_eq!(pages::encode_segment("v3:x-y"), "v3:x-y");
        assert_eq!(pages::encode_segment("a b/c"), "a%20b%2Fc");
        let escaped = "/calls/web%2D1%3Ax/timeline";
        assert_eq!(
            page_for(&Method::GET, escaped, &none),
            Some(Page::Timeline("web-1:x".into()))
        );
        // Not UTF-8 once decoded: not a page (the API answers 400).
        assert_eq!(page_for(&Method::GET, "/calls/%FF/timeline", &none), None);
    }
}
