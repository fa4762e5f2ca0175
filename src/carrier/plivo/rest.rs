//! Plivo's REST API, the calls patterd makes (HTTP Basic
//! `auth_id:auth_token`, the SDK's JSON bodies): place an outbound call with `POST
//! {api_base_url}/v1/Account/{auth_id}/Call/` (answered by a `request_uuid`; the call's
//! `CallUUID` arrives with the answer URL), cancel a call that has not been answered with
//! `DELETE …/Request/{request_uuid}/`, and hang up a live call with `DELETE
//! …/Call/{call_uuid}/`. 404 on a delete means the call already ended and counts as done.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use crate::carrier::CarrierError;
use crate::carrier::rest_client::{build_client, path_safe, send_error};
use super::Config;
use crate::carrier::AccountConfig;

const CARRIER: &str = "Plivo";
/// Plivo's public API root.
pub(crate) const DEFAULT_API_BASE: &str = "https://api.plivo.com";

/// An outbound call to place (`POST Call/`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MakeCall {
    /// E.164; sent as digits without `+`, as Plivo writes numbers.
    pub from: String,
    pub to: String,
    pub answer_url: String,
    pub hangup_url: String,
    pub ring_timeout: u32,
    pub time_limit: u64,
    /// Synchronous machine detection: the answer URL gets `Machine=true|false`.
    pub machine_detection: bool,
}

/// Body of `POST Call/`, with the fields the SDK's `calls.create` sends.
pub fn make_call_body(c: &MakeCall) -> serde_json::Value {
    let mut v = json!({
        "from": c.from.trim_start_matches('+'),
        "to": c.to.trim_start_matches('+'),
        "answer_url": c.answer_url,
        "answer_method": "POST",
        "ring_method": "POST",
        "hangup_url": c.hangup_url,
        "hangup_method": "POST",
        "fallback_method": "POST",
        "time_limit": c.time_limit,
        "ring_timeout": c.ring_timeout,
        "error_if_parent_not_found": false,
    });
    if c.machine_detection
        && let Some(m) = v.as_object_mut()
    {
        m.insert("machine_detection".into(), json!("true"));
        m.insert("machine_detection_time".into(), json!(5000));
        m.insert("machine_detection_method".into(), json!("POST"));
    }
    v
}

/// Client for Plivo's Call API.
#[derive(Clone)]
pub struct PlivoRest {
    pub client: reqwest::Client,
    pub base: String,
    pub auth_id: String,
    auth_token: String,
    /// The Lookup API root without trailing slash: `lookup_base_url`, else
    /// `https://lookup.plivo.com` for the public API and the API root itself for any other (a
    /// proxy or a fake serves both).
    pub(crate) lookup_base: String,
}

impl std::fmt::Debug for PlivoRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlivoRest")
            .field("base", &self.base)
            .field("auth_id", &self.auth_id)
            .field("auth_token", &"***")
            .finish()
    }
}

impl PlivoRest {
    pub fn new(base: &str, auth_id: &str, auth_token: &str) -> Result<Self, CarrierError> {
        if auth_id.trim().is_empty() || auth_token.trim().is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: "auth_id and auth_token must both be set".into(),
            });
        }
        let base = base.trim_end_matches('/').to_string();
        let lookup_base = if base == DEFAULT_API_BASE {
            super::sms::DEFAULT_LOOKUP_BASE.to_string()
        } else {
            base.clone()
        };
        Ok(Self {
            client: build_client(CARRIER)?,
            base,
            auth_id: auth_id.trim().to_string(),
            auth_token: auth_token.trim().to_string(),
            lookup_base,
        })
    }

    /// From a `[carriers.*]` entry of kind plivo.
    pub(crate) fn from_config(cfg: &Config) -> Result<Self, CarrierError> {
        let mut rest = Self::new(
            cfg.api_base(),
            cfg.auth_id.expose(),
            cfg.auth_token.expose(),
        )?;
        if let Some(lookup) = &cfg.lookup_base_url {
            rest.lookup_base = lookup.trim_end_matches('/').to_string();
        }
        Ok(rest)
    }

    pub(crate) fn authorization(&self) -> String {
        let raw = format!("{}:{}", self.auth_id, self.auth_token);
        format!("Basic {}", STANDARD.encode(raw))
    }

    /// The hang-up URL for `call_uuid`.
    pub fn call_url(&self, call_uuid: &str) -> String {
        format!(
            "{}/v1/Account/{}/Call/{call_uuid}/",
            self.base, self.auth_id
        )
    }

    /// Places an outbound call; returns its `request_uuid`.
    pub(crate) async fn make_call(&self, c: &MakeCall) -> Result<String, CarrierError> {
        let url = format!("{}/v1/Account/{}/Call/", self.base, self.auth_id);
        let resp = self
            .client
            .post(&url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json")
            .body(make_call_body(c).to_string())
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, &url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        match status {
            200..=299 => {
                let id = v.get("request_uuid");
                let id = id
                    .and_then(|i| i.as_str())
                    .or_else(|| id.and_then(|i| i.get(0)).and_then(|i| i.as_str()));
                id.filter(|i| path_safe(i))
                    .map(str::to_string)
                    .ok_or_else(|| CarrierError::Http {
                        carrier: CARRIER,
                        status,
                        message: "the response has no usable request_uuid".into(),
                    })
            }
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            _ => Err(CarrierError::Http {
                carrier: CARRIER,
                status,
                message: v
                    .get("error")
                    .and_then(|e| e.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| text.chars().take(200).collect()),
            }),
        }
    }

    /// Cancels a call that has not been answered yet, by its `request_uuid`.
    pub(crate) async fn cancel_request(&self, request_uuid: &str) -> Result<(), CarrierError> {
        let url = format!(
            "{}/v1/Account/{}/Request/{request_uuid}/",
            self.base, self.auth_id
        );
        self.delete(&url, request_uuid, None).await
    }

    /// Hangs up a call; one that has already ended counts as hung up.
    pub async fn hang_up(&self, call_uuid: &str) -> Result<(), CarrierError> {
        let url = self.call_url(call_uuid);
        self.delete(&url, call_uuid, Some(json!({"call_uuid": call_uuid})))
            .await
    }

    /// Transfers the live call's A leg: Plivo then fetches `aleg_url`
    /// for the new XML (our `<Dial>`).
    pub async fn transfer(&self, call_uuid: &str, aleg_url: &str) -> Result<(), CarrierError> {
        let url = self.call_url(call_uuid);
        let body = json!({"legs": "aleg", "aleg_url": aleg_url, "aleg_method": "POST"});
        self.post(&url, call_uuid, &body).await
    }

    /// Sends DTMF on the live call's A leg.
    pub async fn send_dtmf(&self, call_uuid: &str, digits: &str) -> Result<(), CarrierError> {
        let url = format!("{}DTMF/", self.call_url(call_uuid));
        let body = json!({"digits": digits, "leg": "aleg"});
        self.post(&url, call_uuid, &body).await
    }

    async fn post(
        &self,
        url: &str,
        id: &str,
        body: &serde_json::Value,
    ) -> Result<(), CarrierError> {
        if !path_safe(id) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", id.escape_default()),
            });
        }
        let resp = self
            .client
            .post(url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        match status {
            200..=299 => Ok(()),
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            404 => Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("live call {id}"),
            }),
            _ => Err(CarrierError::Http {
                carrier: CARRIER,
                status,
                message: serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(200).collect()),
            }),
        }
    }

    async fn delete(
        &self,
        url: &str,
        id: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(), CarrierError> {
        if !path_safe(id) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", id.escape_default()),
            });
        }
        let mut req = self
            .client
            .delete(url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json");
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let status = resp.status().as_u16();
        match status {
            200..=299 | 404 => Ok(()),
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            _ => {
                let text = resp.text().await.unwrap_or_default();
                let message = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(200).collect());
                Err(CarrierError::Http {
                    carrier: CARRIER,
                    status,
                    message,
                })
            }
        }
    }
}
