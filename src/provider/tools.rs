//! The brain's side of tool calling: what a tool looks like to the model
//! ([`ToolSpec`]), one call the model asked for ([`ToolCall`]), what came of it
//! ([`ToolOutput`]) and the port a chat turn runs its tools through ([`ToolRunner`]). The
//! provider owns the rounds (request, accumulate `delta.tool_calls`, run, feed the results back
//! as `role: tool` messages); what a tool does is the runner's business (`crate::tools`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Value, json};

/// A tool as offered to the model (`{"type":"function","function":{…}}`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema object for the arguments.
    pub parameters: Value,
}

impl ToolSpec {
    /// The entry of the request's `tools` array.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

/// One tool call the model made, its arguments as the JSON text it streamed (unvalidated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// The span of this tool call (a child of the turn's), set by the brain's client before
    /// the call runs: the tool sends it as `traceparent`, the call records the span under it.
    /// `None` without `[telemetry]`.
    pub trace: Option<crate::util::traceparent::TraceParent>,
}

impl ToolCall {
    /// The entry of the assistant message's `tool_calls` array.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// What came of a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// Whether the tool did its job (false: refused, failed, timed out, bad arguments).
    pub ok: bool,
    /// The `role: tool` message's content: what the model is told.
    pub content: String,
    /// A line the caller hears before the model continues (the consult's fallback line).
    pub say: Option<String>,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            ok: true,
            content: content.into(),
            say: None,
        }
    }

    pub fn failed(content: impl Into<String>) -> Self {
        Self {
            ok: false,
            content: content.into(),
            say: None,
        }
    }
}

/// A boxed tool future (tools run inside the brain's stream task, never in the call actor).
pub(crate) type ToolFuture = Pin<Box<dyn Future<Output = ToolOutput> + Send>>;

/// The tools one call's brain may use.
pub trait ToolRunner: Send + Sync {
    /// What the model is offered (empty: no `tools` in the request).
    fn specs(&self) -> Vec<ToolSpec>;
    /// Tool rounds allowed per caller turn; the request after the last one offers no tools.
    fn max_rounds(&self) -> u32;
    /// A line spoken as soon as the model calls `name` (the consult's reassurance).
    fn announce(&self, _name: &str) -> Option<String> {
        None
    }
    /// What kind of tool `name` is (`builtin`, `consult`, `webhook`), for the call's trace.
    fn kind(&self, _name: &str) -> &'static str {
        "tool"
    }
    /// Runs one call. Never panics on what the model sent: bad arguments are an output.
    fn run(&self, call: ToolCall) -> ToolFuture;
}

/// A call's tools, carried by a [`super::ChatTurn`].
#[derive(Clone)]
pub struct Tools(pub Arc<dyn ToolRunner>);

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.0.specs().into_iter().map(|s| s.name).collect();
        f.debug_tuple("Tools").field(&names).finish()
    }
}

/// Tool-call fragments of one streamed response, accumulated by `index`.
#[derive(Debug, Default)]
pub(crate) struct ToolCallAccumulator {
    calls: Vec<(u64, ToolCall)>,
}

impl ToolCallAccumulator {
    /// Adds one `delta.tool_calls` array.
    pub(crate) fn push(&mut self, deltas: &Value) {
        let Some(items) = deltas.as_array() else {
            return;
        };
        for (pos, d) in items.iter().enumerate() {
            let index = d.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
            let i = match self.calls.iter().position(|(k, _)| *k == index) {
                Some(i) => i,
                None => {
                    self.calls.push((
                        index,
                        ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                            trace: None,
                        },
                    ));
                    self.calls.len() - 1
                }
            };
            let call = &mut self.calls[i].1;
            if let Some(id) = d
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                call.id = id.to_string();
            }
            let f = d.get("function");
            if let Some(name) = f
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                call.name = name.to_string();
            }
            if let Some(a) = f.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                call.arguments.push_str(a);
            }
        }
    }

    /// The calls in index order; a missing id is synthesised (`call_<index>`).
    pub(crate) fn finish(mut self) -> Vec<ToolCall> {
        self.calls.sort_by_key(|(k, _)| *k);
        self.calls
            .into_iter()
            .map(|(k, mut c)| {
                if c.id.is_empty() {
                    c.id = format!("call_{k}");
                }
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_accumulate_by_index_interleaved() {
        let mut acc = ToolCallAccumulator::default();
        acc.push(&json!([{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]));
        acc.push(&json!([{"index":1,"id":"call_b","type":"function","function":{"name":"end_call","arguments":"{\"re"}}]));
        acc.push(&json!([{"index":0,"function":{"arguments":"{\"city\":"}}]));
        acc.push(&json!([{"index":1,"function":{"arguments":"ason\":\"done\"}"}}]));
        acc.push(&json!([{"index":0,"id":"","function":{"name":"","arguments":"\"Paris\"}"}}]));
        let calls = acc.finish();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_a");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[1].name, "end_call");
        assert_eq!(calls[1].arguments, r#"{"reason":"done"}"#);
    }

    #[test]
    fn missing_ids_are_synthesised() {
        let mut acc = ToolCallAccumulator::default();
        acc.push(&json!([{"index":3,"function":{"name":"x","arguments":"{}"}}]));
        assert_eq!(acc.finish()[0].id, "call_3");
    }
}
