//! Actions an agent takes on its own call — hang up, transfer, send DTMF, say something — and
//! what came of them. Both the in-call brain's tools and the MCP / REST control surface ask for
//! them through [`super::CallHandle::act`]; the call's actor carries them out (it alone knows
//! what is being said and owns the media stream through which the carrier is reached), so the
//! same policies (allow-lists, digit checks) apply whoever asks.
//!
//! Each action is described once, by an [`ActionSpec`] in its own file under `action/`
//! (name, arguments, what the in-call model and MCP clients are told, the REST route), listed
//! in [`ACTIONS`]. The in-call tools (`tools::builtin`), the MCP tools (`mcp`) and the REST
//! routes (`api`) are all made from these descriptors: none of them spells an action's schema.

mod end_call;
mod say;
mod send_dtmf;
#[cfg(test)]
mod tests;
mod transfer;

use serde_json::{Map, Value, json};

/// One action on a live call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallAction {
    /// Finish the sentence being spoken, then hang up.
    EndCall { reason: String },
    /// Speak the agent's handoff line, then cold-transfer the caller to `to`.
    Transfer { to: String },
    /// Send these DTMF digits to the other party.
    SendDtmf { digits: String },
    /// Speak this text (queued after what is already being said).
    Say { text: String },
}

/// The registration list: every action's descriptor, one line each, in the order the
/// surfaces list them.
pub(crate) static ACTIONS: &[&ActionSpec] = &[
    &end_call::SPEC,
    &transfer::SPEC,
    &send_dtmf::SPEC,
    &say::SPEC,
];

impl CallAction {
    /// The descriptor of this action.
    pub(crate) fn spec(&self) -> &'static ActionSpec {
        match self {
            Self::EndCall { .. } => &end_call::SPEC,
            Self::Transfer { .. } => &transfer::SPEC,
            Self::SendDtmf { .. } => &send_dtmf::SPEC,
            Self::Say { .. } => &say::SPEC,
        }
    }
}

/// An action's argument value getter, handed to [`ActionSpec::build`]: the (already checked)
/// string given for an argument's key.
pub(crate) type ArgValue<'a> = &'a dyn Fn(&str) -> String;

/// Everything the surfaces need to know about one action.
#[derive(Debug)]
pub(crate) struct ActionSpec {
    /// The tool name the in-call model and MCP clients call (`transfer_call`).
    pub name: &'static str,
    /// Its arguments, all strings, all required.
    pub args: &'static [ActionArg],
    /// What the in-call model is told when the action is one of its tools
    /// (`[agents.X] tools`); `None`: the model is not offered it.
    pub(crate) in_call: Option<&'static str>,
    /// Its REST route and MCP tool; `None`: not on the control surface.
    pub control: Option<Control>,
    /// The action, from its arguments' values.
    pub build: fn(ArgValue<'_>) -> CallAction,
}

/// One (string, required) argument of an action.
#[derive(Debug)]
pub(crate) struct ActionArg {
    /// Its key in the tool's arguments, the MCP arguments and the REST body.
    pub key: &'static str,
    /// What the in-call model is told about it.
    pub(crate) in_call: &'static str,
    /// What MCP clients are told about it.
    pub control: &'static str,
    /// A regular expression the in-call model's value must match (in its schema).
    pub(crate) pattern: Option<&'static str>,
}

/// An action on the control surface: `POST /v1/calls/{id}/{verb}` and its MCP tool.
#[derive(Debug)]
pub struct Control {
    /// The route's last segment, also the `action` of the REST answer (`transfer`).
    pub verb: &'static str,
    /// The MCP tool's description.
    pub description: &'static str,
    /// A valid REST body, quoted when a body is refused.
    pub example: &'static str,
    /// The action's name in the MCP tool's answers (`Transfer on call …`).
    pub label: &'static str,
}

impl ActionSpec {
    /// The action called `name` (in-call tool or MCP tool name).
    pub(crate) fn by_name(name: &str) -> Option<&'static ActionSpec> {
        ACTIONS.iter().copied().find(|s| s.name == name)
    }

    /// The control-surface action whose REST route ends in `verb`.
    pub(crate) fn by_verb(verb: &str) -> Option<(&'static ActionSpec, &'static Control)> {
        ACTIONS.iter().find_map(|s| {
            s.control
                .as_ref()
                .filter(|c| c.verb == verb)
                .map(|c| (*s, c))
        })
    }

    /// The actions on the control surface, in order.
    pub(crate) fn controls() -> impl Iterator<Item = (&'static ActionSpec, &'static Control)> {
        ACTIONS
            .iter()
            .filter_map(|s| s.control.as_ref().map(|c| (*s, c)))
    }

    /// The name the REST answer gives the action (`action`): its verb, else its name.
    pub(crate) fn rest_name(&self) -> &'static str {
        self.control.as_ref().map_or(self.name, |c| c.verb)
    }

    /// The JSON schema of the in-call tool's arguments.
    pub(crate) fn in_call_schema(&self) -> Value {
        let props = self.args.iter().map(|a| {
            let mut p = Map::new();
            p.insert("type".into(), json!("string"));
            if let Some(pattern) = a.pattern {
                p.insert("pattern".into(), json!(pattern));
            }
            p.insert("description".into(), json!(a.in_call));
            (a.key.to_string(), Value::Object(p))
        });
        object_schema(props, self.args.iter().map(|a| a.key))
    }

    /// The JSON schema of the MCP tool's arguments: `lead` (the arguments the MCP tool adds
    /// first, such as the call id, with their descriptions) then the action's own.
    pub(crate) fn control_schema(&self, lead: &[(&str, &str)]) -> Value {
        let string = |d: &str| json!({"type": "string", "description": d});
        let props = lead.iter().map(|(k, d)| (k.to_string(), string(d))).chain(
            self.args
                .iter()
                .map(|a| (a.key.to_string(), string(a.control))),
        );
        let required = lead
            .iter()
            .map(|(k, _)| *k)
            .chain(self.args.iter().map(|a| a.key));
        object_schema(props, required)
    }
}

fn object_schema<'a>(
    props: impl Iterator<Item = (String, Value)>,
    required: impl Iterator<Item = &'a str>,
) -> Value {
    let mut s = Map::new();
    s.insert("type".into(), json!("object"));
    s.insert("properties".into(), Value::Object(props.collect()));
    s.insert("required".into(), json!(required.collect::<Vec<_>>()));
    Value::Object(s)
}

/// What came of a [`CallAction`]; its text is what the model (or API client) is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    /// Done (or accepted and under way); `detail` says what happened.
    Done { detail: String },
    /// Refused by policy before anything reached the carrier; `reason` says why.
    Refused { reason: String },
    /// Allowed, but the carrier or the call could not do it.
    Failed { reason: String },
}

impl ActionOutcome {
    /// The sentence the model or API client is told.
    pub fn message(&self) -> &str {
        match self {
            Self::Done { detail } => detail,
            Self::Refused { reason } | Self::Failed { reason } => reason,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done { .. })
    }
}
