//! The built-in tools (`[agents.X] tools = [...]`): the call actions the in-call model may take
//! (`end_call(reason)`, `transfer_call(to)`, `send_dtmf(digits)`), each made from its
//! descriptor in `call::action` (name, description, argument schema). A tool turns the model's
//! call into a [`crate::call::CallAction`] sent to the call's own actor with
//! [`crate::call::CallHandle::act`] — the same path, and so the same policies (allow-lists,
//! digit checks), as the MCP and REST actions — and tells the model the outcome.

use std::sync::Arc;

use serde_json::Value;

use super::{CallCtx, Tool, ToolEnv, ToolSetupError};
use crate::call::action::ActionSpec;
use crate::config::BuiltinTool;
use crate::provider::{ToolFuture, ToolOutput, ToolSpec};
use crate::util::traceparent::TraceParent;

/// The agent's built-ins that are call actions, in the order configured (the others are
/// their own kinds, e.g. `send_sms`).
pub(crate) fn build(env: &ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError> {
    let mut seen = Vec::new();
    let mut tools = Vec::new();
    for t in &env.agent.tools {
        if seen.contains(t) || !t.is_call_action() {
            continue;
        }
        seen.push(*t);
        tools.push(Arc::new(Builtin(in_call_action(*t).ok_or_else(|| {
            ToolSetupError::Invalid {
                agent: env.agent_name.to_string(),
                tool: t.name().to_string(),
                message: "no in-call action has this name".into(),
            }
        })?)) as Arc<dyn Tool>);
    }
    Ok(tools)
}

/// The descriptor of the action a configured built-in names, if the model may take it.
fn in_call_action(t: BuiltinTool) -> Option<&'static ActionSpec> {
    ActionSpec::by_name(t.name()).filter(|s| s.in_call.is_some())
}

struct Builtin(&'static ActionSpec);

fn string_arg(args: &Value, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl Tool for Builtin {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.0.name.into(),
            description: self.0.in_call.unwrap_or_default().into(),
            parameters: self.0.in_call_schema(),
        }
    }

    fn kind(&self) -> &'static str {
        "builtin"
    }

    fn run(&self, ctx: Arc<CallCtx>, args: Value, _trace: Option<TraceParent>) -> ToolFuture {
        let action = (self.0.build)(&|key| string_arg(&args, key));
        Box::pin(async move {
            let Some(handle) = ctx.calls.get(&ctx.call_id) else {
                return ToolOutput::failed("The call has already ended.");
            };
            match handle.act(action).await {
                Ok(outcome) => ToolOutput {
                    ok: outcome.is_done(),
                    content: outcome.message().to_string(),
                    say: None,
                },
                Err(e) => ToolOutput::failed(format!("The action could not be carried out: {e}.")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call-action built-in the configuration accepts is an action the in-call model
    /// may take.
    #[test]
    fn every_configured_builtin_has_an_in_call_action() {
        for t in BuiltinTool::ALL.into_iter().filter(|t| t.is_call_action()) {
            let spec = in_call_action(t).unwrap_or_else(|| panic!("{}", t.name()));
            assert_eq!(spec.name, t.name());
        }
    }
}
