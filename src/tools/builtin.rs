//! The built-in tools (`[agents.X] tools = [...]`): `end_call(reason)`, `transfer_call(to)` and
//! `send_dtmf(digits)`. Each turns the model's call into a [`CallAction`] sent to the call's own
//! actor with [`crate::call::CallHandle::act`] — the same path, and so the same policies
//! (allow-lists, digit checks), as the MCP and REST actions — and tells the model the outcome.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CallCtx, Tool, ToolEnv, ToolSetupError};
use crate::call::CallAction;
use crate::config::BuiltinTool;
use crate::provider::{ToolFuture, ToolOutput, ToolSpec};

/// The agent's built-ins, in the order configured.
pub fn build(env: &ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError> {
    let mut seen = Vec::new();
    Ok(env
        .agent
        .tools
        .iter()
        .filter(|t| {
            let new = !seen.contains(*t);
            seen.push(**t);
            new
        })
        .map(|t| Arc::new(Builtin(*t)) as Arc<dyn Tool>)
        .collect())
}

struct Builtin(BuiltinTool);

fn string_arg(args: &Value, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl Tool for Builtin {
    fn spec(&self) -> ToolSpec {
        let (description, parameters) = match self.0 {
            BuiltinTool::EndCall => (
                "End the phone call. The sentence being spoken finishes first, so say goodbye \
                 before calling this.",
                json!({
                    "type": "object",
                    "properties": {"reason": {"type": "string", "description": "Why the call ends."}},
                    "required": ["reason"],
                }),
            ),
            BuiltinTool::TransferCall => (
                "Transfer the caller to another phone number (a cold transfer: you leave the \
                 call). Only allowed numbers work; you are told if the number is refused.",
                json!({
                    "type": "object",
                    "properties": {"to": {"type": "string", "description": "The number, E.164 such as +15551234567."}},
                    "required": ["to"],
                }),
            ),
            BuiltinTool::SendDtmf => (
                "Press keys on the phone keypad (for menus and extensions).",
                json!({
                    "type": "object",
                    "properties": {"digits": {"type": "string", "pattern": "^[0-9*#A-Da-d]{1,32}$", "description": "Keys to press: 0-9, *, #, A-D."}},
                    "required": ["digits"],
                }),
            ),
        };
        ToolSpec {
            name: self.0.name().into(),
            description: description.into(),
            parameters,
        }
    }

    fn run(&self, ctx: Arc<CallCtx>, args: Value) -> ToolFuture {
        let action = match self.0 {
            BuiltinTool::EndCall => CallAction::EndCall {
                reason: string_arg(&args, "reason"),
            },
            BuiltinTool::TransferCall => CallAction::Transfer {
                to: string_arg(&args, "to"),
            },
            BuiltinTool::SendDtmf => CallAction::SendDtmf {
                digits: string_arg(&args, "digits"),
            },
        };
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
