//! `say(text)`: a sentence spoken after what the agent is saying now. Control surface only:
//! the in-call model speaks by replying.

use super::{ActionArg, ActionSpec, CallAction, Control};

pub(super) static SPEC: ActionSpec = ActionSpec {
    name: "say",
    args: &[ActionArg {
        key: "text",
        in_call: "What to say.",
        control: "What to say",
        pattern: None,
    }],
    in_call: None,
    control: Some(Control {
        verb: "say",
        description: "Speak a sentence on a live call, after what the agent is saying now.",
        example: r#"{"text": "One moment please."}"#,
        label: "Say",
    }),
    build: |arg| CallAction::Say { text: arg("text") },
};
