//! The agent's tool keys (docs/agents.md): `tools` (the built-ins it may use), `max_tool_rounds`,
//! `[agents.X.consult]` (ask a back-office agent, by URL or an `[llm.*]` entry) and
//! `[[agents.X.webhook_tools]]` (tools declared in TOML, served over HTTP). What the tools do
//! lives in `crate::tools`; this is only their configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::util::secret::Secret;

/// A built-in tool an agent can be given (`[agents.X] tools = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinTool {
    /// `end_call(reason)`: finish the sentence, then hang up.
    EndCall,
    /// `transfer_call(to)`: cold transfer to an allowed number (`transfer_allowed`).
    TransferCall,
    /// `send_dtmf(digits)`: press keys (`0-9*#A-D`).
    SendDtmf,
    /// `send_sms(body, to?)`: text the caller (or a number `allowed_destinations` admits)
    /// from this call's number.
    SendSms,
}

impl BuiltinTool {
    pub const ALL: [BuiltinTool; 4] = [
        Self::EndCall,
        Self::TransferCall,
        Self::SendDtmf,
        Self::SendSms,
    ];

    /// The tool's name as the model sees it.
    pub fn name(self) -> &'static str {
        match self {
            Self::EndCall => "end_call",
            Self::TransferCall => "transfer_call",
            Self::SendDtmf => "send_dtmf",
            Self::SendSms => "send_sms",
        }
    }

    /// True for the built-ins that are actions on the call (`call::action`); the others are
    /// tools of their own (`crate::tools::send_sms`).
    pub fn is_call_action(self) -> bool {
        !matches!(self, Self::SendSms)
    }
}

pub(crate) fn default_max_tool_rounds() -> u32 {
    4
}

/// `[agents.X.consult]`: the in-call model may hand a hard request to a back-office agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsultConfig {
    /// An HTTP endpoint answering `POST {request, call_id, caller, callee}` with JSON
    /// (exactly one of `url` and `llm`).
    #[serde(default)]
    pub url: Option<String>,
    /// Instead of `url`: the name of an `[llm.*]` entry consulted directly (a Hermes entry keeps
    /// one consult session per call).
    #[serde(default)]
    pub llm: Option<String>,
    /// Extra request headers (for `url`), e.g. `Authorization`; never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    #[serde(default = "default_consult_timeout")]
    pub timeout_s: u64,
    /// Allow a `url` on loopback or a private network (the SSRF guard refuses them otherwise).
    #[serde(default)]
    pub allow_loopback: bool,
    /// The tool's name as the model sees it.
    #[serde(default = "default_consult_tool_name")]
    pub(crate) tool_name: String,
    /// Spoken as soon as the consult starts; empty: nothing.
    #[serde(default = "default_reassurance")]
    pub reassurance: String,
}

fn default_consult_timeout() -> u64 {
    30
}
fn default_consult_tool_name() -> String {
    "consult_agent".into()
}
fn default_reassurance() -> String {
    "Let me check with a colleague, one moment.".into()
}

/// `[[agents.X.webhook_tools]]`: a tool the model may call, served by an HTTP endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookToolConfig {
    /// The tool's name as the model sees it (`[A-Za-z0-9_-]`, 1–64 characters).
    pub name: String,
    pub description: String,
    /// A JSON Schema (an object schema) for the arguments; the model's arguments are validated
    /// against it before any request.
    #[serde(default = "default_parameters")]
    pub parameters: Value,
    /// Receives `POST {tool, arguments, call_id, caller, callee, attempt}`; its JSON reply goes
    /// back to the model.
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    #[serde(default = "default_webhook_timeout")]
    pub timeout_s: u64,
    /// Further attempts after a failed one (connection error, timeout, 5xx or 429).
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default)]
    pub allow_loopback: bool,
    /// Consecutive failed calls that open the circuit breaker (0: never).
    #[serde(default = "default_breaker_failures")]
    pub(crate) breaker_failures: u32,
    /// Seconds the open breaker refuses calls before trying again.
    #[serde(default = "default_breaker_reset")]
    pub(crate) breaker_reset_s: u64,
}

fn default_parameters() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}
fn default_webhook_timeout() -> u64 {
    10
}
fn default_retries() -> u32 {
    1
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_breaker_reset() -> u64 {
    30
}

/// Whether `name` is a valid tool name for the model (`^[A-Za-z0-9_-]{1,64}$`).
pub(crate) fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The problems of one agent's tool keys: `(key path, message)`.
pub(crate) fn problems(
    name: &str,
    agent: &super::schema::AgentConfig,
    llms: &BTreeMap<String, super::schema::LlmConfig>,
) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let at = |keys: &[&str]| -> Vec<String> {
        ["agents", name]
            .iter()
            .chain(keys)
            .map(|s| s.to_string())
            .collect()
    };
    let mut names: Vec<&str> = agent.tools.iter().map(|t| t.name()).collect();
    if let Some(c) = &agent.consult {
        let sect = format!("[agents.{name}.consult]");
        match (&c.url, &c.llm) {
            (Some(_), Some(_)) | (None, None) => out.push((
                at(&["consult"]),
                format!("{sect} needs exactly one of `url` (an HTTP endpoint) and `llm` (the name of an [llm.*] entry)"),
            )),
            (Some(url), None) => {
                if let Err(e) = crate::net::ssrf::check_url(url, c.allow_loopback) {
                    out.push((at(&["consult", "url"]), format!("{sect} url = {url:?}: {e}")));
                }
            }
            (None, Some(llm)) => {
                if !llms.contains_key(llm) {
                    let defined: Vec<&str> = llms.keys().map(String::as_str).collect();
                    out.push((
                        at(&["consult", "llm"]),
                        format!(
                            "{sect} llm = {llm:?} names no [llm.{llm}] section; defined llm: {}",
                            defined.join(", ")
                        ),
                    ));
                }
            }
        }
        if c.timeout_s == 0 {
            out.push((
                at(&["consult", "timeout_s"]),
                format!("{sect} timeout_s must be at least 1"),
            ));
        }
        if !valid_tool_name(&c.tool_name) {
            out.push((
                at(&["consult", "tool_name"]),
                format!(
                    "{sect} tool_name = {:?} must be 1-64 letters, digits, `_` or `-`",
                    c.tool_name
                ),
            ));
        }
        names.push(&c.tool_name);
    }
    for (i, w) in agent.webhook_tools.iter().enumerate() {
        let idx = i.to_string();
        let sect = format!("[[agents.{name}.webhook_tools]] `{}`", w.name);
        if !valid_tool_name(&w.name) {
            out.push((
                at(&["webhook_tools", &idx, "name"]),
                format!("{sect}: name must be 1-64 letters, digits, `_` or `-`"),
            ));
        }
        if let Err(e) = crate::net::ssrf::check_url(&w.url, w.allow_loopback) {
            out.push((
                at(&["webhook_tools", &idx, "url"]),
                format!("{sect} url = {:?}: {e}", w.url),
            ));
        }
        if let Err(e) = compile_schema(&w.parameters) {
            out.push((
                at(&["webhook_tools", &idx, "parameters"]),
                format!("{sect} parameters: {e}"),
            ));
        }
        if w.timeout_s == 0 {
            out.push((
                at(&["webhook_tools", &idx, "timeout_s"]),
                format!("{sect} timeout_s must be at least 1"),
            ));
        }
        names.push(&w.name);
    }
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(n) {
            out.push((
                at(&[]),
                format!("[agents.{name}] has two tools named `{n}`; tool names must be unique (built-ins, consult tool_name, webhook_tools)"),
            ));
        }
    }
    out
}

/// Compiles a tool's `parameters` schema; the error says what is wrong with it.
pub(crate) fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(
            "must be a JSON Schema with type = \"object\" (the arguments are an object)".into(),
        );
    }
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}
