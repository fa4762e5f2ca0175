//! The descriptors against the schemas and texts the surfaces sent before they were derived
//! from them (byte for byte), and each descriptor against its own action.

use std::cell::RefCell;

use serde_json::{Value, json};

use super::*;

fn spec(name: &str) -> &'static ActionSpec {
    ActionSpec::by_name(name).unwrap_or_else(|| panic!("no action {name}"))
}

/// The in-call tools' schemas, as `tools::builtin` wrote them by hand.
#[test]
fn in_call_schemas_are_unchanged() {
    let cases = [
        (
            "end_call",
            json!({
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why the call ends."}},
                "required": ["reason"],
            }),
        ),
        (
            "transfer_call",
            json!({
                "type": "object",
                "properties": {"to": {"type": "string", "description": "The number, E.164 such as +15551234567."}},
                "required": ["to"],
            }),
        ),
        (
            "send_dtmf",
            json!({
                "type": "object",
                "properties": {"digits": {"type": "string", "pattern": "^[0-9*#A-Da-d]{1,32}$", "description": "Keys to press: 0-9, *, #, A-D."}},
                "required": ["digits"],
            }),
        ),
    ];
    for (name, want) in cases {
        let got = spec(name).in_call_schema();
        assert_eq!(got.to_string(), want.to_string(), "{name}");
    }
    assert_eq!(
        spec("end_call").in_call,
        Some(
            "End the phone call. The sentence being spoken finishes first, so say goodbye before \
             calling this."
        )
    );
    assert_eq!(
        spec("transfer_call").in_call,
        Some(
            "Transfer the caller to another phone number (a cold transfer: you leave the call). \
             Only allowed numbers work; you are told if the number is refused."
        )
    );
    assert_eq!(
        spec("send_dtmf").in_call,
        Some("Press keys on the phone keypad (for menus and extensions).")
    );
    assert_eq!(spec("say").in_call, None);
}

/// The MCP tools' schemas and descriptions and the REST bodies, as `mcp` and `api` wrote them.
#[test]
fn control_schemas_and_routes_are_unchanged() {
    let s = |d: &str| json!({"type": "string", "description": d});
    let call = s("The live call (from make_call or get_calls)");
    let cases = [
        (
            "transfer_call",
            "transfer",
            "Transfer",
            r#"{"to": "+14155551234"}"#,
            "Cold-transfer a live call to another phone number: the agent's handoff line is \
             spoken, then the carrier connects the caller. Only numbers the agent's \
             transfer_allowed list permits; a refusal says why.",
            json!({
                "type": "object",
                "properties": {
                    "callId": call,
                    "to": s("Number to transfer to, E.164 with country code, e.g. +15551234567")
                },
                "required": ["callId", "to"]
            }),
        ),
        (
            "send_dtmf",
            "dtmf",
            "DTMF",
            r#"{"digits": "123#"}"#,
            "Press keys on a live call (e.g. to navigate a phone menu): digits 0-9, *, # and \
             A-D, at most 32 at a time.",
            json!({
                "type": "object",
                "properties": {
                    "callId": call,
                    "digits": s("The keys to press, e.g. 1 or 123#")
                },
                "required": ["callId", "digits"]
            }),
        ),
        (
            "say",
            "say",
            "Say",
            r#"{"text": "One moment please."}"#,
            "Speak a sentence on a live call, after what the agent is saying now.",
            json!({
                "type": "object",
                "properties": {
                    "callId": call,
                    "text": s("What to say")
                },
                "required": ["callId", "text"]
            }),
        ),
    ];
    let controls: Vec<_> = ActionSpec::controls().map(|(s, _)| s.name).collect();
    assert_eq!(controls, ["transfer_call", "send_dtmf", "say"]);
    for (name, verb, label, example, description, schema) in cases {
        let (spec, control) = ActionSpec::by_verb(verb).expect(verb);
        assert_eq!(spec.name, name);
        assert_eq!(spec.rest_name(), verb);
        assert_eq!(
            (control.label, control.example, control.description),
            (label, example, description)
        );
        let got = spec.control_schema(&[("callId", "The live call (from make_call or get_calls)")]);
        assert_eq!(got.to_string(), schema.to_string(), "{name}");
        let body: Value = serde_json::from_str(example).expect("example is JSON");
        assert!(spec.args.iter().all(|a| body[a.key].is_string()), "{name}");
    }
    assert!(ActionSpec::by_verb("end_call").is_none());
    assert_eq!(spec("end_call").rest_name(), "end_call");
}

/// Every descriptor builds its own action from exactly its arguments, and names are unique.
#[test]
fn each_descriptor_builds_its_own_action() {
    let mut names = std::collections::HashSet::new();
    for spec in ACTIONS {
        assert!(names.insert(spec.name), "duplicate {}", spec.name);
        let asked = RefCell::new(Vec::new());
        let action = (spec.build)(&|k| {
            asked.borrow_mut().push(k.to_string());
            format!("value of {k}")
        });
        let keys: Vec<_> = spec.args.iter().map(|a| a.key.to_string()).collect();
        assert_eq!(asked.into_inner(), keys, "{}", spec.name);
        assert!(std::ptr::eq(action.spec(), *spec), "{}", spec.name);
    }
}
