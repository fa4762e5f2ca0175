//! The inbound-override operations (`configure_inbound`, `GET`/`PUT /v1/inbound`): read the
//! overrides, or change one number's (or every number's, key `*`) system prompt, first
//! message, voice or whether inbound calls are taken, and persist the result. The overrides
//! themselves, and how admission applies them, are [`crate::app::inbound`].

use std::sync::Arc;

use serde_json::{Value, json};

use super::{ApiError, ErrorCode};
use crate::app::App;
pub use crate::app::inbound::{InboundOverride, Overrides, SETTING_KEY, effective};

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
            let n = crate::util::phone::normalize_e164(&n).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "number {n:?} is not a phone number; use E.164, e.g. +15551234567"
                ))
            })?;
            if app.config().number(&n).is_none() {
                return Err(ApiError::new(
                    404,
                    ErrorCode::UnknownNumber,
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
        && !app.config().tts.contains_key(v)
    {
        return Err(ApiError::bad_request(format!(
            "voice {v:?} is not a configured [tts.NAME] section; configured: {}",
            app.config()
                .tts
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let snapshot = crate::app::inbound::change(app, &key, &change).await?;
    Ok(json!({"number": key, "override": effective(app, &key), "overrides": snapshot}))
}

pub(crate) fn configured_numbers(app: &App) -> String {
    app.config()
        .numbers
        .iter()
        .map(|n| n.number.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
