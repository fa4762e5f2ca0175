//! The MCP server (official Rust SDK, `rmcp`): the tools agents use to place and inspect calls,
//! with patter-mcp's names, camelCase arguments and text layouts so existing prompts keep
//! working — `make_call`, `call_third_party`, `get_calls`, `get_transcript` — plus our
//! `end_call`, the actions on a live call `transfer_call`, `send_dtmf` and `say` (through the
//! call's actor, so the agent's policies apply), `get_metrics`, `configure_inbound`,
//! `send_sms` and `lookup_number` (`POST /v1/messages`, `GET /v1/numbers/{n}/lookup`), and the resources `patter://dashboard` and
//! `patter://call/{callId}`. Tools speak to a [`Backend`]: the daemon itself for Streamable HTTP
//! at `/mcp` ([`http`]), or the running daemon's REST API for `patterd mcp --stdio`
//! ([`stdio`]); either way the same `/v1` routes run. Each tool declares its
//! [`Permission`]; a request runs with its token's [`Grant`] (over `/mcp`, the one its access
//! check put in the request's extensions): `tools/list` shows what the grant can use, and a
//! call token's tools default `callId` to its call. Validation, policy, scope and carrier
//! failures come back as `isError` results whose text says what to do.

pub mod format;
pub mod http;
#[cfg(feature = "postgres")]
mod session_store;
pub mod stdio;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use hyper::Method;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

use crate::api::{ApiError, ErrorCode, Grant, Permission};
use crate::app::App;
use crate::call::action::{ActionSpec, Control};

/// A boxed, sendable future.
pub(crate) type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where the tools' requests go: one `/v1` route (path without `/v1`, with query), for a
/// caller holding `grant` (the daemon itself checks it; the REST API checks its own token).
pub trait Backend: Send + Sync + 'static {
    fn request(
        &self,
        grant: &Grant,
        method: Method,
        path: String,
        body: Option<Value>,
    ) -> BoxFut<Result<Value, ApiError>>;
}

/// The daemon itself (the `/mcp` endpoint).
pub struct Local(pub Weak<App>);

impl Backend for Local {
    fn request(
        &self,
        grant: &Grant,
        method: Method,
        path: String,
        body: Option<Value>,
    ) -> BoxFut<Result<Value, ApiError>> {
        let app = self.0.upgrade();
        let grant = grant.clone();
        Box::pin(async move {
            let app = app
                .ok_or_else(|| ApiError::new(503, ErrorCode::Stopping, "the daemon is stopping"))?;
            let (path, query) = path.split_once('?').unwrap_or((&path, ""));
            crate::api::dispatch(&app, &grant, &method, path, query, body)
                .await
                .map(|(_, v)| v)
        })
    }
}

/// The MCP handler.
#[derive(Clone)]
pub struct PatterMcp {
    backend: Arc<dyn Backend>,
    /// The grant tools run with.
    grant: Grant,
    /// Over HTTP (`/mcp`) each request brings its own grant (in its extensions); a request
    /// without one is refused.
    per_request: bool,
}

const THIRD_PARTY_PROMPT: &str = "You are calling on behalf of your user to get a task done. \
Introduce yourself briefly as an assistant calling for them, do the task politely and concisely, \
answer questions about it as best you can, and do not make commitments beyond it. When the task \
is done, or cannot be done, thank the person and say goodbye.\n\nTask: ";

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

/// A tool and what it does.
fn tool(
    name: &'static str,
    permission: Permission,
    description: &'static str,
    input: Value,
) -> (Tool, Permission) {
    (Tool::new(name, description, schema(input)), permission)
}

/// The description of the call id the live-call actions take first.
const LIVE_CALL_ID: &str = "The live call (from make_call or get_calls)";

/// The MCP tool of an action on a live call, from its descriptor.
fn action_tool(spec: &ActionSpec, control: &Control) -> Tool {
    Tool::new(
        spec.name,
        control.description,
        schema(spec.control_schema(&[("callId", LIVE_CALL_ID)])),
    )
}

/// The twelve tools with their input schemas: the live-call actions (`call::action`) after
/// `end_call`.
pub fn tools() -> Vec<Tool> {
    scoped_tools().into_iter().map(|(t, _)| t).collect()
}

/// Every tool with what it does ([`Permission`]: reads, acts on a call, operator-only), in
/// the order of [`tools`]. The live-call actions act on their call.
pub(crate) fn scoped_tools() -> Vec<(Tool, Permission)> {
    let mut tools = own_tools();
    let at = tools
        .iter()
        .position(|(t, _)| t.name == "end_call")
        .map_or(0, |i| i + 1);
    let actions = ActionSpec::controls()
        .map(|(spec, control)| (action_tool(spec, control), Permission::ActOnCall));
    tools.splice(at..at, actions);
    tools
}

/// The permission of the tool `name`; `None` for no such tool.
fn tool_permission(name: &str) -> Option<Permission> {
    scoped_tools()
        .into_iter()
        .find(|(t, _)| t.name == name)
        .map(|(_, p)| p)
}

/// The tools that are not live-call actions, with their permissions.
fn own_tools() -> Vec<(Tool, Permission)> {
    let s = |d: &str| json!({"type": "string", "description": d});
    let b = |d: &str| json!({"type": "boolean", "description": d});
    vec![
        tool(
            "make_call",
            Permission::Operator,
            "Place an outbound phone call with an AI voice agent. With wait (the default) it \
             blocks until the call ends and returns the outcome, duration and transcript; with \
             wait:false it returns the call id at once (poll get_calls / get_transcript).",
            json!({
                "type": "object",
                "properties": {
                    "to": s("Number to call, E.164 with country code, e.g. +15551234567"),
                    "systemPrompt": s("Instructions for the voice agent on this call"),
                    "firstMessage": s("What the agent says when the call is answered"),
                    "voice": s("Voice: the name of a [tts.NAME] section of patterd's configuration"),
                    "machineDetection": b("Detect answering machines; with voicemailMessage, leave it as a message"),
                    "voicemailMessage": s("Message to leave when a machine answers (needs machineDetection)"),
                    "wait": b("Wait for the call to end (default true)")
                },
                "required": ["to", "systemPrompt"]
            }),
        ),
        tool(
            "call_third_party",
            Permission::Operator,
            "Call a business or person to get a task done; an autonomous voice agent handles \
             the conversation. Waits for the call to end and returns the transcript.",
            json!({
                "type": "object",
                "properties": {
                    "to": s("Number to call, E.164 with country code, e.g. +15551234567"),
                    "task": s("What the call should achieve, with every detail the agent needs"),
                    "voice": s("Voice: the name of a [tts.NAME] section of patterd's configuration")
                },
                "required": ["to", "task"]
            }),
        ),
        tool(
            "get_calls",
            Permission::ReadAll,
            "List recent calls (newest first) with direction, status, duration, cost and turn count.",
            json!({"type": "object", "properties": {}}),
        ),
        tool(
            "get_transcript",
            Permission::ReadCall,
            "Get the full transcript of a call.",
            json!({
                "type": "object",
                "properties": {"callId": s("The call id (from make_call or get_calls)")},
                "required": ["callId"]
            }),
        ),
        tool(
            "end_call",
            Permission::ActOnCall,
            "Hang up a live call.",
            json!({
                "type": "object",
                "properties": {"callId": s("The call id (from make_call or get_calls)")},
                "required": ["callId"]
            }),
        ),
        // Without a call id it reads the totals (`ReadAll`): the route checks that.
        tool(
            "get_metrics",
            Permission::ReadCall,
            "Latency breakdown and counts for one call, or totals over all stored calls when \
             callId is omitted.",
            json!({
                "type": "object",
                "properties": {"callId": s("A call id; omit for totals")}
            }),
        ),
        tool(
            "configure_inbound",
            Permission::Operator,
            "Change how inbound calls are answered, at runtime and persisted: the system prompt, \
             first message and voice, or switch inbound calls off. Applies to one number, or to \
             all numbers when number is omitted.",
            json!({
                "type": "object",
                "properties": {
                    "number": s("One of patterd's numbers (E.164); omit for all numbers"),
                    "systemPrompt": s("Instructions for the inbound agent"),
                    "firstMessage": s("Greeting spoken when a call is answered"),
                    "voice": s("The name of a [tts.NAME] section"),
                    "enabled": b("false refuses inbound calls, true accepts them again")
                }
            }),
        ),
        tool(
            "send_sms",
            Permission::Operator,
            "Send a text message (SMS) from one of patterd's numbers. The destination must be \
             allowed by that number's allowed_destinations; [outbound] max_sms_per_day and \
             max_sms_chars apply.",
            json!({
                "type": "object",
                "properties": {
                    "to": s("Number to text, E.164 with country code, e.g. +15551234567"),
                    "body": s("The message text"),
                    "from": s("One of patterd's numbers (E.164); default: the first that may text `to`")
                },
                "required": ["to", "body"]
            }),
        ),
        tool(
            "lookup_number",
            Permission::Operator,
            "Look a phone number up with the carrier: whether it is valid, its country, its \
             network operator and line type (mobile, landline, voip, toll_free).",
            json!({
                "type": "object",
                "properties": {
                    "number": s("The number, E.164 with country code, e.g. +15551234567")
                },
                "required": ["number"]
            }),
        ),
    ]
}

fn text_result(text: String, is_error: bool) -> CallToolResult {
    let v = json!({"content": [{"type": "text", "text": text}], "isError": is_error});
    serde_json::from_value(v).unwrap_or_default()
}

/// Arguments as a JSON object.
struct Args(Map<String, Value>);

impl Args {
    fn str(&self, k: &str) -> Result<Option<String>, String> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{k}` must be a string")),
        }
    }
    fn req(&self, k: &str) -> Result<String, String> {
        self.str(k)?
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| format!("`{k}` is required"))
    }
    fn bool(&self, k: &str) -> Result<Option<bool>, String> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(format!("`{k}` must be true or false")),
        }
    }
}

/// Path segment escaping for a call id (RFC 3986 unreserved characters stay; `api::dispatch`
/// decodes every segment).
fn seg(id: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(id, SEGMENT).to_string()
}

impl PatterMcp {
    /// The handler of `patterd mcp --stdio`: its requests carry its own token to the REST
    /// API, which decides what they may do.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            grant: Grant::operator("mcp --stdio"),
            per_request: false,
        }
    }

    /// The handler of `/mcp`: each request runs with the grant its access check gave it.
    pub(crate) fn per_request(backend: Arc<dyn Backend>) -> Self {
        Self {
            per_request: true,
            ..Self::new(backend)
        }
    }

    /// This handler with `grant` (what one request may do).
    pub(crate) fn with_grant(&self, grant: Grant) -> Self {
        Self {
            grant,
            ..self.clone()
        }
    }

    /// The handler for one request: with the grant the access check put in its extensions,
    /// for `/mcp`; an error when a `/mcp` request has none (never run unchecked).
    fn for_request(&self, context: &RequestContext<RoleServer>) -> Result<Self, ErrorData> {
        if !self.per_request {
            return Ok(self.clone());
        }
        context
            .extensions
            .get::<hyper::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Grant>())
            .map(|g| self.with_grant(g.clone()))
            .ok_or_else(|| {
                ErrorData::internal_error("the request carries no access grant; refused", None)
            })
    }

    async fn get(&self, path: String) -> Result<Value, ApiError> {
        self.backend
            .request(&self.grant, Method::GET, path, None)
            .await
    }

    async fn post(&self, path: String, body: Value) -> Result<Value, ApiError> {
        self.backend
            .request(&self.grant, Method::POST, path, Some(body))
            .await
    }

    /// The tools this handler's grant can use (all of them for an operator).
    pub(crate) fn visible_tools(&self) -> Vec<Tool> {
        scoped_tools()
            .into_iter()
            .filter(|(_, p)| self.grant.may_use(*p))
            .map(|(t, _)| t)
            .collect()
    }

    /// Runs a tool; `Err` is the text of an `isError` result. A tool beyond the grant is
    /// refused before it runs; with a call token, `callId` defaults to the token's call.
    pub async fn run_tool(
        &self,
        name: &str,
        mut args: Map<String, Value>,
    ) -> Result<String, String> {
        if let Some(permission) = tool_permission(name) {
            if let (Some(own), Permission::ReadCall | Permission::ActOnCall) =
                (self.grant.own_call(), permission)
            {
                args.entry("callId")
                    .or_insert_with(|| Value::String(own.to_string()));
            }
            if !self.grant.may_use(permission) {
                let call = args.get("callId").and_then(Value::as_str);
                if let Err(e) = self.grant.permits(permission, call) {
                    return Err(format!("{name} refused: {}", e.message));
                }
            }
        }
        let a = Args(args);
        if let Some((spec, control)) = ActionSpec::by_name(name)
            .and_then(|spec| spec.control.as_ref().map(|control| (spec, control)))
        {
            return self.run_action(spec, control, &a).await;
        }
        let api = |e: ApiError| e.message;
        match name {
            "make_call" => {
                let to = a.req("to")?;
                let body = json!({
                    "to": to,
                    "system_prompt": a.req("systemPrompt")?,
                    "first_message": a.str("firstMessage")?,
                    "voice": a.str("voice")?,
                    "machine_detection": a.bool("machineDetection")?.unwrap_or(false),
                    "voicemail_message": a.str("voicemailMessage")?,
                    "wait": a.bool("wait")?.unwrap_or(true),
                });
                let wait = body["wait"] == json!(true);
                let call = self
                    .post("/calls".into(), body)
                    .await
                    .map_err(|e| format!("Failed to place call: {}", api(e)))?;
                Ok(if wait {
                    format::call_result(&call, true)
                } else {
                    format::call_placed(&call)
                })
            }
            "call_third_party" => {
                let to = a.req("to")?;
                let task = a.req("task")?;
                let body = json!({
                    "to": to,
                    "system_prompt": format!("{THIRD_PARTY_PROMPT}{task}"),
                    "voice": a.str("voice")?,
                    "wait": true,
                });
                let call = self
                    .post("/calls".into(), body)
                    .await
                    .map_err(|e| format!("Third-party call failed: {}", api(e)))?;
                Ok(format::call_result(&call, false))
            }
            "get_calls" => {
                let v = self.get("/calls?limit=50".into()).await.map_err(api)?;
                Ok(format::calls_list(&v))
            }
            "get_transcript" => {
                let id = a.req("callId")?;
                let v = self
                    .get(format!("/calls/{}/transcript", seg(&id)))
                    .await
                    .map_err(|e| {
                        if e.status == 404 {
                            format!("Call {id} not found. Use get_calls to list call ids.")
                        } else {
                            e.message
                        }
                    })?;
                Ok(format::transcript(&v))
            }
            "end_call" => {
                let id = a.req("callId")?;
                let v = self
                    .post(format!("/calls/{}/hangup", seg(&id)), json!({}))
                    .await
                    .map_err(api)?;
                Ok(format!(
                    "Call {id} ended.\nStatus: {}\nDuration: {}s\nUse get_transcript for the transcript.",
                    format::str_of(&v, "status"),
                    format::duration_s(&v)
                ))
            }
            "get_metrics" => {
                let v = match a.str("callId")? {
                    Some(id) => self.get(format!("/calls/{}/metrics", seg(&id))).await,
                    None => self.get("/metrics".into()).await,
                }
                .map_err(api)?;
                Ok(format::metrics(&v))
            }
            "configure_inbound" => {
                let body = json!({
                    "number": a.str("number")?,
                    "systemPrompt": a.str("systemPrompt")?,
                    "firstMessage": a.str("firstMessage")?,
                    "voice": a.str("voice")?,
                    "enabled": a.bool("enabled")?,
                });
                let body = Value::Object(
                    body.as_object()
                        .into_iter()
                        .flatten()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                );
                let v = self
                    .backend
                    .request(&self.grant, Method::PUT, "/inbound".into(), Some(body))
                    .await
                    .map_err(api)?;
                Ok(format::inbound(&v))
            }
            "send_sms" => {
                let body = json!({
                    "to": a.req("to")?,
                    "body": a.req("body")?,
                    "from": a.str("from")?,
                });
                let v = self
                    .post("/messages".into(), body)
                    .await
                    .map_err(|e| format!("Text message not sent: {}", api(e)))?;
                Ok(format!(
                    "Text message sent to {} from {}.\nMessage ID: {}\nStatus: {}",
                    format::str_of(&v, "to"),
                    format::str_of(&v, "from"),
                    format::str_of(&v, "message_id"),
                    format::str_of(&v, "carrier_status"),
                ))
            }
            "lookup_number" => {
                let number = a.req("number")?;
                let v = self
                    .get(format!("/numbers/{}/lookup", seg(&number)))
                    .await
                    .map_err(|e| format!("Lookup of {number} failed: {}", api(e)))?;
                let or_unknown = |k: &str| match format::str_of(&v, k) {
                    "" => "unknown".to_string(),
                    s => s.to_string(),
                };
                Ok(format!(
                    "Number: {}\nValid: {}\nCountry: {}\nCarrier: {}\nLine type: {}",
                    or_unknown("number"),
                    match v["valid"].as_bool() {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "unknown",
                    },
                    or_unknown("country"),
                    or_unknown("carrier"),
                    or_unknown("line_type"),
                ))
            }
            other => {
                let names: Vec<String> = self
                    .visible_tools()
                    .into_iter()
                    .map(|t| t.name.into())
                    .collect();
                Err(format!(
                    "unknown tool `{other}`; the tools are {}",
                    names.join(", ")
                ))
            }
        }
    }

    /// An action on a live call through its REST route (`POST /v1/calls/{id}/{verb}`).
    async fn run_action(
        &self,
        spec: &ActionSpec,
        control: &Control,
        a: &Args,
    ) -> Result<String, String> {
        let id = a.req("callId")?;
        let mut body = Map::new();
        for arg in spec.args {
            body.insert(arg.key.into(), Value::String(a.req(arg.key)?));
        }
        let what = control.label;
        let v = self
            .post(
                format!("/calls/{}/{}", seg(&id), control.verb),
                Value::Object(body),
            )
            .await
            .map_err(|e| format!("{what} on call {id} not done: {}", e.message))?;
        Ok(format!(
            "{what} on call {id}: {}",
            format::str_of(&v, "message")
        ))
    }

    async fn read(&self, uri: &str) -> Result<String, ErrorData> {
        if uri == "patter://dashboard" {
            let calls = self.get("/calls?limit=50".into()).await;
            let metrics = self.get("/metrics".into()).await;
            return match (calls, metrics) {
                (Ok(c), Ok(m)) => Ok(format::dashboard(&c, &m)),
                (Err(e), _) | (_, Err(e)) => Err(ErrorData::internal_error(e.message, None)),
            };
        }
        if let Some(id) = uri.strip_prefix("patter://call/") {
            return Ok(
                match self.get(format!("/calls/{}/transcript", seg(id))).await {
                    Ok(v) => format::call_detail(&v),
                    Err(e) if e.status == 404 => {
                        format!("# Call Not Found\n\nNo call with id `{id}`.\n")
                    }
                    Err(e) => return Err(ErrorData::internal_error(e.message, None)),
                },
            );
        }
        Err(ErrorData::resource_not_found(
            format!("unknown resource {uri}; see patter://dashboard and patter://call/{{callId}}"),
            None,
        ))
    }
}

impl ServerHandler for PatterMcp {
    fn get_info(&self) -> ServerConfig {
        let v = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "patterd", "version": env!("CARGO_PKG_VERSION")},
            "instructions": "patterd places and answers phone calls with an AI voice agent. \
                make_call places a call (waits for it by default); get_calls and get_transcript \
                read the call store; end_call hangs up; get_metrics shows latencies; \
                configure_inbound changes the inbound agent."
        });
        serde_json::from_value(v).unwrap_or_else(|_| {
            ServerConfig::new(Default::default()).with_server_info(
                rmcp::model::Implementation::new("patterd", env!("CARGO_PKG_VERSION")),
            )
        })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let me = self.for_request(&context)?;
        serde_json::from_value(json!({"tools": me.visible_tools()}))
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let me = self.for_request(&context)?;
        let args = request.arguments.unwrap_or_default();
        let result = match me.run_tool(&request.name, args).await {
            Ok(text) => text_result(text, false),
            Err(text) => text_result(text, true),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        serde_json::from_value(json!({"resources": [{
            "uri": "patter://dashboard",
            "name": "dashboard",
            "description": "Live calls, recent calls and totals",
            "mimeType": "text/markdown"
        }]}))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        serde_json::from_value(json!({"resourceTemplates": [{
            "uriTemplate": "patter://call/{callId}",
            "name": "call",
            "description": "One call: fields, metrics and transcript",
            "mimeType": "text/markdown"
        }]}))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let text = self.for_request(&context)?.read(&request.uri).await?;
        let v =
            json!({"contents": [{"uri": request.uri, "mimeType": "text/markdown", "text": text}]});
        let r: ReadResourceResult = serde_json::from_value(v)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(r.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "v3:Wq-9x_AbC.d~e";

    /// An `App` without a listener holding one ended Telnyx-style call.
    async fn app_with_telnyx_call() -> (tempfile::TempDir, Arc<App>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[server]\ndata_dir = {:?}\n\n[carriers.tx]\nkind = \"telnyx\"\n",
            dir.path().display().to_string()
        );
        let loaded = crate::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
        let app = App::new(loaded.config).expect("app");
        app.store
            .tx
            .send(crate::store::Write::Call(crate::store::NewCall {
                call_id: ID.into(),
                carrier: "telnyx".into(),
                carrier_account: "tx".into(),
                direction: "inbound",
                from: "+15550001111".into(),
                to: "+15550002222".into(),
                agent: "front".into(),
                status: "completed".into(),
            }));
        app.store.tx.flush().await.expect("flush");
        (dir, app)
    }

    /// The live-call actions sit after `end_call`, and an unknown tool's answer lists all twelve.
    #[tokio::test]
    async fn the_tool_list_keeps_its_order() {
        let names: Vec<String> = tools().into_iter().map(|t| t.name.into()).collect();
        let want = "make_call, call_third_party, get_calls, get_transcript, end_call, \
                    transfer_call, send_dtmf, say, get_metrics, configure_inbound, send_sms, \
                    lookup_number";
        assert_eq!(names.join(", "), want);
        let (_dir, app) = app_with_telnyx_call().await;
        let mcp = PatterMcp::new(Arc::new(Local(Arc::downgrade(&app))));
        let e = mcp.run_tool("nope", Map::new()).await.expect_err("unknown");
        assert_eq!(e, format!("unknown tool `nope`; the tools are {want}"));
    }

    #[test]
    fn call_ids_are_escaped_as_one_path_segment() {
        assert_eq!(seg("v3:a/b c"), "v3%3Aa%2Fb%20c");
        assert_eq!(seg("CA1-x_y.z~"), "CA1-x_y.z~");
    }

    /// Every tool and resource that names a call reaches a Telnyx call (`v3:` ids), and the
    /// listings show it.
    #[tokio::test]
    async fn every_tool_and_resource_reaches_a_telnyx_call() {
        let (_dir, app) = app_with_telnyx_call().await;
        let mcp = PatterMcp::new(Arc::new(Local(Arc::downgrade(&app))));
        let args = |v: Value| v.as_object().cloned().unwrap_or_default();

        let list = mcp
            .run_tool("get_calls", Map::new())
            .await
            .expect("get_calls");
        assert!(list.contains(ID), "{list}");
        let t = mcp
            .run_tool("get_transcript", args(json!({"callId": ID})))
            .await
            .expect("get_transcript");
        assert!(t.contains(ID) && !t.contains("not found"), "{t}");
        let m = mcp
            .run_tool("get_metrics", args(json!({"callId": ID})))
            .await
            .expect("get_metrics");
        assert!(!m.contains("not found"), "{m}");
        // The call has ended: end_call finds it and says so (not "not found").
        let e = mcp
            .run_tool("end_call", args(json!({"callId": ID})))
            .await
            .expect_err("ended call");
        assert!(e.contains("has already ended"), "{e}");
        let d = mcp.read("patter://dashboard").await.expect("dashboard");
        assert!(d.contains(ID), "{d}");
        let c = mcp
            .read(&format!("patter://call/{ID}"))
            .await
            .expect("call resource");
        assert!(!c.contains("Not Found") && c.contains(ID), "{c}");
    }
}
