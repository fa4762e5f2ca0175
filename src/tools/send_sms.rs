//! The built-in `send_sms(body, to?)` (`[agents.X] tools = ["send_sms"]`): the in-call model
//! texts the caller ("text me that address") from the call's own number. It runs through the
//! daemon's [`super::Texter`], which refuses any other destination unless the number's
//! `allowed_destinations` admit it and counts the message toward `[outbound]
//! max_sms_per_day`; the model is told what happened.

use crate::util::traceparent::TraceParent;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{CallCtx, Tool, ToolEnv, ToolSetupError};
use crate::config::BuiltinTool;
use crate::provider::{ToolFuture, ToolOutput, ToolSpec};

/// The tool, when the agent has it.
pub(crate) fn build(env: &ToolEnv) -> Result<Vec<Arc<dyn Tool>>, ToolSetupError> {
    Ok(if env.agent.tools.contains(&BuiltinTool::SendSms) {
        vec![Arc::new(SendSms) as Arc<dyn Tool>]
    } else {
        Vec::new()
    })
}

struct SendSms;

impl Tool for SendSms {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: BuiltinTool::SendSms.name().into(),
            description: "Send a text message (SMS) from this call's number, e.g. when the \
                          caller asks you to text them an address or a confirmation. It goes to \
                          the caller unless you give `to`; other numbers are refused unless \
                          they are allowed destinations. Keep it short and say it was sent."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "body": {"type": "string", "minLength": 1,
                             "description": "The message text"},
                    "to": {"type": "string",
                           "description": "E.164 number to text; omit for the caller"}
                },
                "required": ["body"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> &'static str {
        "builtin"
    }

    fn run(&self, ctx: Arc<CallCtx>, args: Value, _trace: Option<TraceParent>) -> ToolFuture {
        let body = args
            .get("body")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let to = args
            .get("to")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        match ctx.texter.clone() {
            Some(texter) => texter.text_from_call(&ctx, to, body),
            None => Box::pin(async {
                ToolOutput::failed("Text messages cannot be sent from this call.")
            }),
        }
    }
}
