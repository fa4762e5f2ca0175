//! Webhook tools (`[[agents.X.webhook_tools]]`): a tool declared in TOML — name, description,
//! a JSON-schema `parameters` — served by an HTTP endpoint. Each call is
//! `POST {tool, arguments, call_id, caller, callee, attempt}` (with the tool call's
//! `traceparent` when the call is traced); a 2xx JSON reply goes back to the model as is. A
//! connection error, timeout, 429 or 5xx is retried up to `retries` times (other 4xx are not);
//! `breaker_failures` failed calls in a row open a circuit breaker that refuses calls without a
//! request for `breaker_reset_s`, then lets one call through to try again.
//! URLs go through the SSRF guard.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{CallCtx, Tool, ToolEnv, ToolSetupError, read_capped, with_headers};
use crate::config::WebhookToolConfig;
use crate::net::http::with_traceparent;
use crate::net::ssrf;
use crate::provider::{ToolFuture, ToolOutput, ToolSpec};
use crate::util::traceparent::TraceParent;

pub fn build(env: &ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError> {
    env.agent
        .webhook_tools
        .iter()
        .map(|cfg| {
            let invalid = |message: String| ToolSetupError::Invalid {
                agent: env.agent_name.to_string(),
                tool: cfg.name.clone(),
                message,
            };
            ssrf::check_url(&cfg.url, cfg.allow_loopback).map_err(|e| invalid(e.to_string()))?;
            let client = ssrf::client(
                cfg.allow_loopback,
                Duration::from_secs(cfg.timeout_s.max(1)),
            )
            .map_err(|e| invalid(format!("cannot build its HTTP client: {e}")))?;
            Ok(Arc::new(Webhook {
                inner: Arc::new(Inner {
                    cfg: cfg.clone(),
                    client,
                    breaker: Mutex::new(Breaker::default()),
                }),
            }) as Arc<dyn Tool>)
        })
        .collect()
}

struct Webhook {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: WebhookToolConfig,
    client: reqwest::Client,
    breaker: Mutex<Breaker>,
}

/// Consecutive failures and, once they reach the threshold, when calls may be tried again.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    /// Whether a call may go out now.
    fn allows(&mut self, now: Instant) -> bool {
        match self.open_until {
            Some(t) if now < t => false,
            Some(_) => {
                // Half-open: this call is the trial; another failure re-opens at once.
                self.open_until = None;
                true
            }
            None => true,
        }
    }

    fn record(&mut self, ok: bool, threshold: u32, reset: Duration, now: Instant) {
        if ok {
            self.failures = 0;
            return;
        }
        self.failures = self.failures.saturating_add(1);
        if threshold > 0 && self.failures >= threshold {
            self.open_until = Some(now + reset);
            tracing::warn!(
                failures = self.failures,
                "webhook tool circuit breaker opened"
            );
        }
    }
}

/// How one attempt ended.
enum Attempt {
    Reply(Value),
    /// Worth another attempt.
    Retry(String),
    /// Not worth another attempt.
    Fail(String),
}

impl Inner {
    async fn attempt(
        &self,
        ctx: &CallCtx,
        args: &Value,
        attempt: u32,
        trace: Option<&TraceParent>,
    ) -> Attempt {
        let body = json!({
            "tool": self.cfg.name,
            "arguments": args,
            "call_id": ctx.call_id,
            "caller": ctx.caller,
            "callee": ctx.callee,
            "attempt": attempt,
        });
        let req = with_traceparent(
            with_headers(
                self.client.post(&self.cfg.url).json(&body),
                &self.cfg.headers,
            ),
            trace,
        );
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Attempt::Retry("it timed out".into()),
            Err(e) if e.is_connect() => {
                return Attempt::Retry(format!("it could not be reached ({e})"));
            }
            Err(e) => return Attempt::Retry(format!("the request failed ({e})")),
        };
        let status = resp.status().as_u16();
        if status == 429 || status >= 500 {
            return Attempt::Retry(format!("it answered HTTP {status}"));
        }
        if !(200..300).contains(&status) {
            return Attempt::Fail(format!("it answered HTTP {status}"));
        }
        match read_capped(resp).await {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(v) => Attempt::Reply(v),
                Err(_) => Attempt::Fail("its reply is not JSON".into()),
            },
            Err(e) => Attempt::Retry(e),
        }
    }

    async fn call(&self, ctx: &CallCtx, args: Value, trace: Option<TraceParent>) -> ToolOutput {
        let name = &self.cfg.name;
        let now = Instant::now();
        let allowed = self
            .breaker
            .lock()
            .map(|mut b| b.allows(now))
            .unwrap_or(true);
        if !allowed {
            return ToolOutput::failed(format!(
                "The tool `{name}` is unavailable right now after repeated failures; do not \
                 retry it during this call for a while, and tell the caller."
            ));
        }
        let mut why = String::new();
        let mut ok = None;
        for attempt in 1..=self.cfg.retries.saturating_add(1) {
            match self.attempt(ctx, &args, attempt, trace.as_ref()).await {
                Attempt::Reply(v) => {
                    ok = Some(v);
                    break;
                }
                Attempt::Retry(w) => {
                    tracing::info!(tool = %name, attempt, why = %w, "webhook tool attempt failed");
                    why = w;
                    if attempt <= self.cfg.retries {
                        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    }
                }
                Attempt::Fail(w) => {
                    why = w;
                    break;
                }
            }
        }
        let reset = Duration::from_secs(self.cfg.breaker_reset_s);
        if let Ok(mut b) = self.breaker.lock() {
            b.record(
                ok.is_some(),
                self.cfg.breaker_failures,
                reset,
                Instant::now(),
            );
        }
        match ok {
            Some(v) => ToolOutput::ok(v.to_string()),
            None => ToolOutput::failed(format!("The tool `{name}` failed: {why}.")),
        }
    }
}

impl Tool for Webhook {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.inner.cfg.name.clone(),
            description: self.inner.cfg.description.clone(),
            parameters: self.inner.cfg.parameters.clone(),
        }
    }

    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn run(&self, ctx: Arc<CallCtx>, args: Value, trace: Option<TraceParent>) -> ToolFuture {
        let inner = self.inner.clone();
        Box::pin(async move { inner.call(&ctx, args, trace).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_after_threshold_and_half_opens_after_reset() {
        let mut b = Breaker::default();
        let t0 = Instant::now();
        let reset = Duration::from_secs(30);
        assert!(b.allows(t0));
        b.record(false, 2, reset, t0);
        assert!(b.allows(t0));
        b.record(false, 2, reset, t0);
        assert!(!b.allows(t0 + Duration::from_secs(29)));
        assert!(b.allows(t0 + Duration::from_secs(31)));
        b.record(false, 2, reset, t0 + Duration::from_secs(31));
        assert!(!b.allows(t0 + Duration::from_secs(32)));
        b.record(true, 2, reset, t0 + Duration::from_secs(70));
        assert!(b.allows(t0 + Duration::from_secs(70)));
    }
}
