//! `transfer_call(to)`: the agent's handoff line, then a cold transfer by the carrier, to a
//! number the agent's `transfer_allowed` permits.

use super::{ActionArg, ActionSpec, CallAction, Control};

pub(super) static SPEC: ActionSpec = ActionSpec {
    name: "transfer_call",
    args: &[ActionArg {
        key: "to",
        in_call: "The number, E.164 such as +15551234567.",
        control: "Number to transfer to, E.164 with country code, e.g. +15551234567",
        pattern: None,
    }],
    in_call: Some(
        "Transfer the caller to another phone number (a cold transfer: you leave the \
         call). Only allowed numbers work; you are told if the number is refused.",
    ),
    control: Some(Control {
        verb: "transfer",
        description: "Cold-transfer a live call to another phone number: the agent's handoff \
                      line is spoken, then the carrier connects the caller. Only numbers the \
                      agent's transfer_allowed list permits; a refusal says why.",
        example: r#"{"to": "+14155551234"}"#,
        label: "Transfer",
    }),
    build: |arg| CallAction::Transfer { to: arg("to") },
};
