//! The browser phone's page: one self-contained HTML document (`page.html`: inline CSS and
//! JS, the capture and playback AudioWorklets as an inline module, no external assets, no
//! build step) with the agents it may call written in. Served with a strict
//! `Content-Security-Policy`, no caching and no referrer (a phone link is in its URL).

use crate::net::http::Body;
use hyper::Response;

const PAGE: &str = include_str!("page.html");

/// The page listing `agents` (the first is preselected).
pub fn html(agents: &[String]) -> String {
    // JSON inside a <script>: `<` escaped so no agent name can close the element.
    let list = serde_json::to_string(agents)
        .unwrap_or_else(|_| "[]".into())
        .replace('<', "\\u003c");
    PAGE.replace("__AGENTS__", &list)
}

/// The page as a response.
pub fn response(agents: &[String]) -> Response<Body> {
    let mut resp = Response::new(Body::from(html(agents)));
    let h = resp.headers_mut();
    let pairs = [
        ("content-type", "text/html; charset=utf-8"),
        (
            "content-security-policy",
            "default-src 'none'; script-src 'unsafe-inline' blob:; style-src 'unsafe-inline'; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
        ("cache-control", "no-store"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ];
    for (k, v) in pairs {
        h.insert(k, hyper::header::HeaderValue::from_static(v));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_cannot_break_out_of_the_script() {
        let page = html(&["front-desk".into(), "</script><b>".into()]);
        assert!(page.contains(r#"const AGENTS = ["front-desk","\u003c/script>\u003cb>"];"#));
        assert!(!page.contains("__AGENTS__"));
        assert!(!page.contains("http://") && !page.contains("https://"));
    }
}
