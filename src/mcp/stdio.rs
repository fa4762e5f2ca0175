//! `patterd mcp --stdio`: the same MCP server on stdin/stdout, for agents that spawn their
//! tools. It holds no call state of its own: every tool is a request to the running daemon's
//! REST API (`--url`, default from the configuration's `server.listen`; bearer `--token`,
//! default `server.api_token`). Logs go to stderr; stdout carries only MCP messages.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use rmcp::ServiceExt;
use serde_json::Value;

use super::{Backend, BoxFut, PatterMcp};
use crate::api::{ApiError, ErrorCode};

/// The daemon's REST API over HTTP.
pub(crate) struct Remote {
    client: reqwest::Client,
    /// e.g. `http://127.0.0.1:8080` (no trailing slash, no `/v1`).
    base: String,
    token: String,
}

impl Remote {
    pub(crate) fn new(base: &str, token: &str) -> Result<Self, String> {
        crate::util::init_tls();
        let client = reqwest::Client::builder()
            // The bearer token must never follow a redirect elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        })
    }
}

impl Backend for Remote {
    fn request(
        &self,
        _grant: &super::Grant,
        method: Method,
        path: String,
        body: Option<Value>,
    ) -> BoxFut<Result<Value, ApiError>> {
        let url = format!("{}/v1{path}", self.base);
        let method =
            reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut req = self.client.request(method, &url);
        if !self.token.is_empty() {
            req = req.bearer_auth(&self.token);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let base = self.base.clone();
        Box::pin(async move {
            let resp = req.send().await.map_err(|e| {
                ApiError::new(
                    502,
                    ErrorCode::DaemonUnreachable,
                    format!("cannot reach patterd at {base}: {e}; is the daemon running (and --url right)?"),
                )
            })?;
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            if (200..300).contains(&status) {
                return Ok(v);
            }
            let msg = v["error"]["message"]
                .as_str()
                .unwrap_or("the daemon answered without an error message")
                .to_string();
            let code = match v["error"]["code"].as_str() {
                Some("not_found") => ErrorCode::NotFound,
                _ => ErrorCode::RemoteError,
            };
            Err(ApiError::new(status, code, msg))
        })
    }
}

/// Serves MCP on stdin/stdout until the client goes away.
pub async fn run(base: &str, token: &str) -> Result<(), String> {
    let backend: Arc<dyn Backend> = Arc::new(Remote::new(base, token)?);
    let server = PatterMcp::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP initialisation failed: {e}"))?;
    server
        .waiting()
        .await
        .map_err(|e| format!("MCP session ended with an error: {e}"))?;
    Ok(())
}
