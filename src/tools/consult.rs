//! Consult (`[agents.X.consult]`): the in-call model hands a request it cannot answer to a
//! back-office agent — an HTTP endpoint (`url`: `POST {request, call_id, caller, callee}`, the
//! reply is the first string among `reply, response, text, result, answer, message`, read up to
//! 1 MiB) or an `[llm.*]` entry consulted directly (`llm`: a Hermes entry gets the Hermes
//! session headers with the per-call consult session `patter-call-consult-<call id>`, so it
//! keeps the context of earlier consults in the same call). The `reassurance` line is spoken
//! when the consult starts; on failure or after `timeout_s` the caller hears [`FALLBACK_LINE`]
//! and the model is told the consult failed. A traced call's consult carries the tool call's
//! `traceparent` (to the endpoint, or to the consulted brain). Caller and callee go out as a
//! normalised E.164 number or `unknown` ([`crate::util::phone::for_prompt`]): caller ids are
//! unauthenticated carrier text and the consulted agent reads them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{CallCtx, Tool, ToolEnv, ToolSetupError, read_capped, with_headers};
use crate::config::ConsultConfig;
use crate::net::http::with_traceparent;
use crate::net::ssrf;
use crate::provider::{
    ChatMessage, ChatTurn, LlmEvent, LlmProvider, Role, ToolFuture, ToolOutput, ToolSpec,
};
use crate::util::secret::Secret;
use crate::util::traceparent::TraceParent;

/// Spoken when a consult fails or times out.
pub const FALLBACK_LINE: &str = "I'm sorry, I couldn't get an answer on that right now.";

/// The reply fields tried, in order.
pub(crate) const REPLY_FIELDS: [&str; 6] =
    ["reply", "response", "text", "result", "answer", "message"];

pub fn build(env: &ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError> {
    let Some(cfg) = &env.agent.consult else {
        return Ok(Vec::new());
    };
    let invalid = |message: String| ToolSetupError::Invalid {
        agent: env.agent_name.to_string(),
        tool: cfg.tool_name.clone(),
        message,
    };
    let timeout = Duration::from_secs(cfg.timeout_s.max(1));
    let target = match (&cfg.url, &cfg.llm) {
        (Some(url), None) => {
            ssrf::check_url(url, cfg.allow_loopback).map_err(|e| invalid(e.to_string()))?;
            let client = ssrf::client(cfg.allow_loopback, timeout)
                .map_err(|e| invalid(format!("cannot build its HTTP client: {e}")))?;
            Target::Http {
                url: url.clone(),
                allow_loopback: cfg.allow_loopback,
                headers: cfg.headers.clone(),
                client,
            }
        }
        (None, Some(name)) => Target::Llm(
            env.llms
                .get(name)
                .cloned()
                .ok_or_else(|| invalid(format!("llm = {name:?} names no [llm.{name}] entry")))?,
        ),
        _ => return Err(invalid("needs exactly one of `url` and `llm`".into())),
    };
    Ok(vec![Arc::new(Consult {
        cfg: cfg.clone(),
        target: Arc::new(target),
        timeout,
    })])
}

enum Target {
    Http {
        url: String,
        allow_loopback: bool,
        headers: BTreeMap<String, Secret>,
        client: reqwest::Client,
    },
    Llm(Arc<dyn LlmProvider>),
}

struct Consult {
    cfg: ConsultConfig,
    target: Arc<Target>,
    timeout: Duration,
}

impl Tool for Consult {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.cfg.tool_name.clone(),
            description: "Ask a back-office colleague who can look things up and act on them. \
                          Use it for requests you cannot answer yourself; it may take up to a \
                          minute. Pass the caller's request in full, with the details you know."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {"request": {"type": "string", "description": "What to ask, in full."}},
                "required": ["request"],
            }),
        }
    }

    fn announce(&self) -> Option<String> {
        Some(self.cfg.reassurance.clone())
    }

    fn kind(&self) -> &'static str {
        "consult"
    }

    fn run(&self, ctx: Arc<CallCtx>, args: Value, trace: Option<TraceParent>) -> ToolFuture {
        let request = args
            .get("request")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let target = self.target.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let asked = ask(&target, &ctx, &request, trace);
            let result = match tokio::time::timeout(timeout, asked).await {
                Ok(r) => r,
                Err(_) => Err(format!("it timed out after {} s", timeout.as_secs())),
            };
            let ms = started.elapsed().as_millis() as u64;
            match result {
                Ok(reply) => {
                    tracing::info!(ms, "consult answered");
                    ToolOutput::ok(reply)
                }
                Err(why) => {
                    tracing::warn!(ms, %why, "consult failed");
                    ToolOutput {
                        ok: false,
                        content: format!(
                            "The consult failed ({why}). The caller has been told you could not \
                             get an answer right now; offer another way to help."
                        ),
                        say: Some(FALLBACK_LINE.into()),
                    }
                }
            }
        })
    }
}

async fn ask(
    target: &Target,
    ctx: &CallCtx,
    request: &str,
    trace: Option<TraceParent>,
) -> Result<String, String> {
    let caller = crate::util::phone::for_prompt(&ctx.caller);
    let callee = crate::util::phone::for_prompt(&ctx.callee);
    match target {
        Target::Http {
            url,
            allow_loopback,
            headers,
            client,
        } => {
            ssrf::check_url(url, *allow_loopback).map_err(|e| e.to_string())?;
            let body = json!({
                "request": request,
                "call_id": ctx.call_id,
                "caller": caller,
                "callee": callee,
            });
            let req = with_headers(client.post(url).json(&body), headers);
            let resp = with_traceparent(req, trace.as_ref())
                .send()
                .await
                .map_err(|e| describe(&e))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!(
                    "the consult endpoint answered HTTP {}",
                    status.as_u16()
                ));
            }
            let bytes = read_capped(resp).await?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|_| "the consult endpoint's reply is not JSON".to_string())?;
            reply_text(&v).ok_or_else(|| {
                format!(
                    "the reply has none of the fields {}",
                    REPLY_FIELDS.join(", ")
                )
            })
        }
        Target::Llm(llm) => {
            let turn = ChatTurn {
                call_id: format!("consult-{}", ctx.call_id),
                caller: crate::util::phone::known_number(&ctx.caller),
                system_prompt: String::new(),
                history: vec![ChatMessage {
                    role: Role::User,
                    content: format!(
                        "[Consult from the voice agent `{}` on phone call {} (caller {}, callee {}). \
                         Answer in a few plain sentences it can read out.]\n{request}",
                        ctx.agent, ctx.call_id, caller, callee
                    ),
                }],
                history_limits: Default::default(),
                tools: None,
                call_token: None,
                trace,
            };
            let mut stream = llm.stream(turn);
            let mut text = String::new();
            while let Some(ev) = stream.events.recv().await {
                match ev {
                    LlmEvent::Delta(d) => {
                        if text.len() + d.len() > super::MAX_REPLY_BYTES {
                            return Err("the reply is larger than 1 MiB".into());
                        }
                        text.push_str(&d);
                    }
                    LlmEvent::Done => break,
                    LlmEvent::Error(e) | LlmEvent::Unavailable { message: e, .. } => {
                        return Err(e);
                    }
                    _ => {}
                }
            }
            let text = text.trim().to_string();
            if text.is_empty() {
                Err("the consulted brain gave an empty answer".into())
            } else {
                Ok(text)
            }
        }
    }
}

/// The first string among [`REPLY_FIELDS`] (or the body itself when it is a string).
pub(crate) fn reply_text(v: &Value) -> Option<String> {
    if let Value::String(s) = v {
        return Some(s.clone());
    }
    REPLY_FIELDS
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "the consult endpoint timed out".into();
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_field_order() {
        assert_eq!(
            reply_text(&json!({"message": "m", "answer": "a"})).as_deref(),
            Some("a")
        );
        assert_eq!(
            reply_text(&json!({"text": 3, "result": "r"})).as_deref(),
            Some("r")
        );
        assert_eq!(
            reply_text(&json!({"reply": "x", "response": "y"})).as_deref(),
            Some("x")
        );
        assert_eq!(reply_text(&json!("plain")).as_deref(), Some("plain"));
        assert_eq!(reply_text(&json!({"other": "z"})), None);
    }
}
