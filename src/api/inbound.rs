//! Runtime overrides of the inbound agent (`configure_inbound`, `PUT /v1/inbound`): per number
//! (or for every number, key `*`) a different system prompt, first message or voice, or inbound
//! calls switched off. Kept in memory for the webhook path and persisted in the store's
//! settings, so they survive a restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ApiError;
use crate::config::AgentConfig;
use crate::server::App;
use crate::store::Write;

/// Settings key the overrides are stored under.
pub const SETTING_KEY: &str = "inbound_overrides";

/// One override; unset fields keep the configured agent's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InboundOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_message: Option<String>,
    /// The name of a `[tts.NAME]` section to speak with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Overrides by number (`*` = every number).
pub type Overrides = BTreeMap<String, InboundOverride>;

impl InboundOverride {
    /// `self` with `more`'s set fields on top.
    fn merged(&self, more: &InboundOverride) -> InboundOverride {
        InboundOverride {
            system_prompt: more.system_prompt.clone().or(self.system_prompt.clone()),
            first_message: more.first_message.clone().or(self.first_message.clone()),
            voice: more.voice.clone().or(self.voice.clone()),
            enabled: more.enabled.or(self.enabled),
        }
    }

    /// The agent with this override applied.
    pub fn apply(&self, agent: &AgentConfig) -> AgentConfig {
        let mut a = agent.clone();
        if let Some(p) = &self.system_prompt {
            a.system_prompt = p.clone();
        }
        if let Some(m) = &self.first_message {
            a.first_message = m.clone();
        }
        if let Some(v) = &self.voice {
            a.tts = v.clone();
        }
        a
    }
}

/// The effective override for `number`: the `*` entry with the number's own on top.
pub fn effective(app: &App, number: &str) -> InboundOverride {
    let all = app.inbound.read().unwrap_or_else(|e| e.into_inner());
    let base = all.get("*").cloned().unwrap_or_default();
    match all.get(number) {
        Some(o) => base.merged(o),
        None => base,
    }
}

pub fn get(app: &App) -> Value {
    let all = app
        .inbound
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    json!({"overrides": all})
}

/// Applies `{number?, systemPrompt?, firstMessage?, voice?, enabled?}` and persists it.
pub async fn configure(app: &Arc<App>, body: Value) -> Result<Value, ApiError> {
    let mut obj = match body {
        Value::Object(o) => o,
        Value::Null => serde_json::Map::new(),
        _ => return Err(ApiError::bad_request("the body must be a JSON object")),
    };
    let key = match obj.remove("number") {
        None | Some(Value::Null) => "*".to_string(),
        Some(Value::String(n)) => {
            let n = crate::config::normalize_e164(&n).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "number {n:?} is not a phone number; use E.164, e.g. +15551234567"
                ))
            })?;
            if app.config.number(&n).is_none() {
                return Err(ApiError::new(
                    404,
                    "unknown_number",
                    format!(
                        "{n} is not one of this daemon's [[numbers]]; configured: {}",
                        configured_numbers(app)
                    ),
                ));
            }
            n
        }
        Some(_) => return Err(ApiError::bad_request("number must be a string")),
    };
    let change: InboundOverride = serde_json::from_value(Value::Object(obj)).map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; expected systemPrompt, firstMessage, voice (strings), enabled (boolean)"
        ))
    })?;
    if let Some(v) = &change.voice
        && !app.config.tts.contains_key(v)
    {
        return Err(ApiError::bad_request(format!(
            "voice {v:?} is not a configured [tts.NAME] section; configured: {}",
            app.config
                .tts
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let snapshot = {
        let mut all = app.inbound.write().unwrap_or_else(|e| e.into_inner());
        let merged = all.get(&key).cloned().unwrap_or_default().merged(&change);
        all.insert(key.clone(), merged);
        all.clone()
    };
    let text = serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".into());
    app.store.tx.send(Write::Setting {
        key: SETTING_KEY.into(),
        value: text,
    });
    app.store.tx.flush().await?;
    Ok(json!({"number": key, "override": effective(app, &key), "overrides": snapshot}))
}

pub(crate) fn configured_numbers(app: &App) -> String {
    app.config
        .numbers
        .iter()
        .map(|n| n.number.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
