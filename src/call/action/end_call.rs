//! `end_call(reason)`: the in-call model hangs up after the sentence being spoken. Not on the
//! control surface: there, hanging up is `POST /v1/calls/{id}/hangup` (MCP `end_call`).

use super::{ActionArg, ActionSpec, CallAction};

pub(super) static SPEC: ActionSpec = ActionSpec {
    name: "end_call",
    args: &[ActionArg {
        key: "reason",
        in_call: "Why the call ends.",
        control: "Why the call ends.",
        pattern: None,
    }],
    in_call: Some(
        "End the phone call. The sentence being spoken finishes first, so say goodbye \
         before calling this.",
    ),
    control: None,
    build: |arg| CallAction::EndCall {
        reason: arg("reason"),
    },
};
