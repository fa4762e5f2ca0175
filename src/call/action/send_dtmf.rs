//! `send_dtmf(digits)`: keys pressed on the call, through the carrier or as in-band tones.

use super::{ActionArg, ActionSpec, CallAction, Control};

pub(super) static SPEC: ActionSpec = ActionSpec {
    name: "send_dtmf",
    args: &[ActionArg {
        key: "digits",
        in_call: "Keys to press: 0-9, *, #, A-D.",
        control: "The keys to press, e.g. 1 or 123#",
        pattern: Some("^[0-9*#A-Da-d]{1,32}$"),
    }],
    in_call: Some("Press keys on the phone keypad (for menus and extensions)."),
    control: Some(Control {
        verb: "dtmf",
        description: "Press keys on a live call (e.g. to navigate a phone menu): digits 0-9, \
                      *, # and A-D, at most 32 at a time.",
        example: r#"{"digits": "123#"}"#,
        label: "DTMF",
    }),
    build: |arg| CallAction::SendDtmf {
        digits: arg("digits"),
    },
};
