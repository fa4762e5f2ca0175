//! `/mcp`: rmcp's Streamable HTTP service, mounted on the daemon's listener by the server. In
//! front of it: the same access check as `/v1` ([`crate::api::auth`]: 429 past a peer's
//! failed authentications; a bearer token — `server.api_token`, a `[[server.api_tokens]]`
//! entry, a live call's token — or in token-less local mode a loopback peer and `Host`
//! without proxy headers; our own `Origin` only; `POST` with `Content-Type:
//! application/json`). Each request's [`crate::api::Grant`] rides in its extensions to the
//! tools, which run with that scope. rmcp itself checks `Host` against loopback names plus the host of
//! `server.public_url` (DNS-rebinding protection). Session `DELETE` answers 204 (rmcp says 202,
//! which the Python client logs as a failed termination). In a cluster, sessions are kept in
//! the shared database too ([`super::session_store`]), so a session continues on any instance.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::{Local, PatterMcp};
use crate::api::auth::{Access, admit_request, authorize, check_content_type};
use crate::app::App;
use crate::config::Config;
use crate::net::http::{AnyBody, json};

/// The `/mcp` endpoint.
pub(crate) struct McpHttp {
    service: StreamableHttpService<PatterMcp, LocalSessionManager>,
}

impl McpHttp {
    pub(crate) fn new(config: &Config, app: Weak<App>) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        if let Ok(u) = url::Url::parse(&config.server.public_url)
            && let Some(h) = u.host_str()
        {
            hosts.push(h.trim_matches(['[', ']']).to_string());
        }
        let mut cfg = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_max_request_body_bytes(config.server.max_body_bytes.max(64 * 1024));
        // In a cluster a session continues on any instance (`super::session_store`).
        #[cfg(feature = "postgres")]
        if let Some(cluster) = app.upgrade().and_then(|a| a.cluster.clone()) {
            cfg.session_store = Some(Arc::new(super::session_store::PgSessionStore::new(
                cluster.pool.clone(),
            )));
        }
        let backend: Arc<dyn super::Backend> = Arc::new(Local(app));
        let service = StreamableHttpService::new(
            move || Ok(PatterMcp::per_request(backend.clone())),
            Arc::new(LocalSessionManager::default()),
            cfg,
        );
        Self { service }
    }

    pub(crate) async fn handle(
        &self,
        app: &App,
        peer: std::net::SocketAddr,
        req: Request<Incoming>,
    ) -> Response<AnyBody> {
        let access = Access {
            peer,
            method: req.method(),
            headers: req.headers(),
        };
        let grant = match admit_request(app, peer, req.headers(), |server, calls| {
            authorize(server, access, calls)
        })
        // Again for grants made past `authorize` (a peer's, another instance's call token).
        .and_then(|g| check_content_type(req.method(), req.headers()).map(|()| g))
        {
            Ok(g) => g,
            Err(e) => {
                let r = json(e.status, &e.body());
                let mut r = r.map(|b: Full<Bytes>| b.boxed());
                e.add_headers(r.headers_mut());
                return r;
            }
        };
        // The tools run with this request's grant (rmcp hands the request's parts, extensions
        // included, to the handler).
        let mut req = req;
        req.extensions_mut().insert(grant);
        let delete = req.method() == Method::DELETE;
        let mut resp = self.service.handle(req).await;
        if delete && resp.status() == hyper::StatusCode::ACCEPTED {
            *resp.status_mut() = hyper::StatusCode::NO_CONTENT;
            *resp.body_mut() = Full::new(Bytes::new()).boxed();
        }
        resp
    }
}
