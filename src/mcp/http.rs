//! `/mcp`: rmcp's Streamable HTTP service, mounted on the daemon's listener by the server. In front of it: the
//! same access check as `/v1` ([`crate::api::auth`]: bearer `server.api_token`, or in
//! token-less local mode a loopback peer and `Host` without proxy headers; our own `Origin`
//! only; `POST` with `Content-Type: application/json`). rmcp itself checks `Host` against loopback names plus the host of
//! `server.public_url` (DNS-rebinding protection). Session `DELETE` answers 204 (rmcp says 202,
//! which the Python client logs as a failed termination).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::{Local, PatterMcp};
use crate::api::auth::{Access, authorize};
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
        let cfg = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_max_request_body_bytes(config.server.max_body_bytes.max(64 * 1024));
        let backend: Arc<dyn super::Backend> = Arc::new(Local(app));
        let service = StreamableHttpService::new(
            move || Ok(PatterMcp::new(backend.clone())),
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
        if let Err(e) = authorize(&app.config().server, access) {
            let r = json(e.status, &e.body());
            let mut r = r.map(|b: Full<Bytes>| b.boxed());
            if e.status == 401 {
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Bearer realm=\"patterd\""),
                );
            }
            return r;
        }
        let delete = req.method() == Method::DELETE;
        let mut resp = self.service.handle(req).await;
        if delete && resp.status() == hyper::StatusCode::ACCEPTED {
            *resp.status_mut() = hyper::StatusCode::NO_CONTENT;
            *resp.body_mut() = Full::new(Bytes::new()).boxed();
        }
        resp
    }
}
