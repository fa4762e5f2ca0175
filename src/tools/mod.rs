//! The tools an agent's in-call model may call (docs/agents.md): built-ins that act on the call
//! (`builtin.rs`: `end_call`, `transfer_call`, `send_dtmf` through `CallHandle::act`), the
//! built-in `send_sms` (`send_sms.rs`: a text message through the daemon's [`Texter`]), the
//! consult of a back-office agent (`consult.rs`) and webhook tools declared in TOML
//! (`webhook.rs`). [`AgentTools`] is built once per agent from its configuration (HTTP clients,
//! compiled argument schemas, circuit breakers shared by its calls); [`AgentTools::for_call`]
//! gives one call's brain a [`ToolRunner`] that validates the model's arguments against the
//! tool's schema before anything runs. Adding a kind of tool is one file here plus one line in
//! [`KINDS`].

pub(crate) mod builtin;
pub mod consult;
pub(crate) mod send_sms;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::call::CallRegistry;
use crate::config::AgentConfig;
use crate::provider::{LlmProvider, ToolCall, ToolFuture, ToolOutput, ToolRunner, ToolSpec, Tools};
use crate::util::traceparent::TraceParent;

/// Longest reply body read from a consult or webhook endpoint.
pub(crate) const MAX_REPLY_BYTES: usize = 1 << 20;

/// The call a tool runs for.
#[derive(Clone)]
pub struct CallCtx {
    pub call_id: String,
    /// The calling number (ours for an outbound call).
    pub caller: String,
    /// The called number.
    pub callee: String,
    pub agent: String,
    /// Live calls, to reach this call's actor.
    pub calls: Arc<CallRegistry>,
    /// True for a call we placed (ours is then `caller`, the other party `callee`).
    pub outbound: bool,
    /// The `[carriers.NAME]` account of the call.
    pub carrier_account: String,
    /// Where the built-in `send_sms` sends its message (the daemon); `None`: it cannot.
    pub texter: Option<Arc<dyn Texter>>,
}

impl CallCtx {
    /// The other party of the call: the caller of an inbound call, the callee of one we
    /// placed.
    pub fn other_party(&self) -> &str {
        if self.outbound {
            &self.callee
        } else {
            &self.caller
        }
    }

    /// Our number on the call.
    pub fn our_number(&self) -> &str {
        if self.outbound {
            &self.caller
        } else {
            &self.callee
        }
    }
}

/// What the in-call `send_sms` asks of the daemon (implemented by the composition root):
/// text `to` — the call's other party when `None` — from the call's own number, refused unless
/// `to` is that party or the number's `allowed_destinations` admit it, under the daemon's
/// caps. The output is what the model is told.
pub trait Texter: Send + Sync {
    fn text_from_call(&self, call: &CallCtx, to: Option<String>, body: String) -> ToolFuture;
}

/// One tool.
pub trait Tool: Send + Sync {
    /// What the model is offered.
    fn spec(&self) -> ToolSpec;
    /// Spoken as soon as the model calls it.
    fn announce(&self) -> Option<String> {
        None
    }
    /// What kind of tool it is, for the call's trace (`builtin`, `consult`, `webhook`).
    fn kind(&self) -> &'static str;
    /// Runs the tool on arguments already validated against `spec().parameters`; `trace` is
    /// the tool call's span, sent on by a tool that makes a request (`traceparent`).
    fn run(&self, ctx: Arc<CallCtx>, args: Value, trace: Option<TraceParent>) -> ToolFuture;
}

/// What a tool kind may use to build its tools.
pub struct ToolEnv<'a> {
    pub(crate) agent_name: &'a str,
    pub agent: &'a AgentConfig,
    /// Every `[llm.*]` entry (for `consult.llm`).
    pub(crate) llms: &'a BTreeMap<String, Arc<dyn LlmProvider>>,
}

/// Why an agent's tools could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ToolSetupError {
    #[error("[agents.{agent}] tool `{tool}`: {message}")]
    Invalid {
        agent: String,
        tool: String,
        message: String,
    },
}

type Builder = fn(&ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError>;

/// The registration list: every kind of tool, one line each.
const KINDS: &[Builder] = &[
    builtin::build,
    send_sms::build,
    consult::build,
    webhook::build,
];

struct Entry {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    validator: jsonschema::Validator,
}

/// One agent's tools.
pub struct AgentTools {
    entries: Vec<Entry>,
    max_rounds: u32,
}

impl AgentTools {
    pub(crate) fn build(env: &ToolEnv) -> Result<Arc<Self>, ToolSetupError> {
        let mut entries = Vec::new();
        for kind in KINDS {
            for tool in kind(env)? {
                let spec = tool.spec();
                let validator =
                    crate::config::tools::compile_schema(&spec.parameters).map_err(|message| {
                        ToolSetupError::Invalid {
                            agent: env.agent_name.to_string(),
                            tool: spec.name.clone(),
                            message,
                        }
                    })?;
                entries.push(Entry {
                    tool,
                    spec,
                    validator,
                });
            }
        }
        Ok(Arc::new(Self {
            entries,
            max_rounds: env.agent.max_tool_rounds,
        }))
    }

    pub(crate) fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.spec.name.as_str()).collect()
    }

    /// One call's tools; `None` when the agent has none.
    pub(crate) fn for_call(self: &Arc<Self>, ctx: CallCtx) -> Option<Tools> {
        if self.entries.is_empty() || self.max_rounds == 0 {
            return None;
        }
        Some(Tools(Arc::new(CallTools {
            agent: self.clone(),
            ctx: Arc::new(ctx),
        })))
    }

    fn find(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.spec.name == name)
    }
}

/// Builds every agent's tools.
pub(crate) fn build_all(
    agents: &BTreeMap<String, AgentConfig>,
    llms: &BTreeMap<String, Arc<dyn LlmProvider>>,
) -> Result<BTreeMap<String, Arc<AgentTools>>, ToolSetupError> {
    agents
        .iter()
        .map(|(name, agent)| {
            let env = ToolEnv {
                agent_name: name,
                agent,
                llms,
            };
            Ok((name.clone(), AgentTools::build(&env)?))
        })
        .collect()
}

struct CallTools {
    agent: Arc<AgentTools>,
    ctx: Arc<CallCtx>,
}

/// Checks the model's arguments: JSON, an object, valid against the tool's schema.
fn check_arguments(entry: &Entry, raw: &str) -> Result<Value, String> {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let args: Value = serde_json::from_str(raw).map_err(|e| {
        format!("the arguments are not valid JSON ({e}); call the tool again with a JSON object")
    })?;
    if !args.is_object() {
        return Err("the arguments must be a JSON object".into());
    }
    let errors: Vec<String> = entry
        .validator
        .iter_errors(&args)
        .take(3)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(args)
    } else {
        Err(format!(
            "the arguments do not match the tool's parameters: {}",
            errors.join("; ")
        ))
    }
}

impl ToolRunner for CallTools {
    fn specs(&self) -> Vec<ToolSpec> {
        self.agent.entries.iter().map(|e| e.spec.clone()).collect()
    }

    fn max_rounds(&self) -> u32 {
        self.agent.max_rounds
    }

    fn announce(&self, name: &str) -> Option<String> {
        self.agent
            .find(name)
            .and_then(|e| e.tool.announce())
            .filter(|s| !s.trim().is_empty())
    }

    fn kind(&self, name: &str) -> &'static str {
        self.agent.find(name).map_or("unknown", |e| e.tool.kind())
    }

    fn run(&self, call: ToolCall) -> ToolFuture {
        let Some(entry) = self.agent.find(&call.name) else {
            let names = self.agent.names().join(", ");
            let msg = format!(
                "There is no tool named `{}`; the tools are: {names}.",
                call.name
            );
            return Box::pin(async move { ToolOutput::failed(msg) });
        };
        match check_arguments(entry, &call.arguments) {
            Ok(args) => {
                tracing::info!(tool = %call.name, "running a tool for the model");
                entry.tool.run(self.ctx.clone(), args, call.trace)
            }
            Err(msg) => {
                tracing::info!(tool = %call.name, %msg, "refused a tool call with bad arguments");
                Box::pin(async move { ToolOutput::failed(msg) })
            }
        }
    }
}

/// Reads a response body up to [`MAX_REPLY_BYTES`]; longer is an error.
pub(crate) async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("the reply broke off ({e})"))?
    {
        if body.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err("the reply is larger than 1 MiB".into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Adds configured headers to a request (values are secrets: never logged).
pub(crate) fn with_headers(
    mut req: reqwest::RequestBuilder,
    headers: &BTreeMap<String, crate::util::secret::Secret>,
) -> reqwest::RequestBuilder {
    for (k, v) in headers {
        req = req.header(k.as_str(), v.expose());
    }
    req
}
