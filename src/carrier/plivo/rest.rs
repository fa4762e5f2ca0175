//! Plivo's REST API, the one call patterd makes: hang up a live call with
//! `DELETE {api_base_url}/v1/Account/{auth_id}/Call/{call_uuid}/` (HTTP Basic
//! `auth_id:auth_token`, the SDK's JSON body). 404 means the call already ended and counts as
//! done (carriers.md §3.6).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use crate::carrier::CarrierError;
use crate::carrier::rest_client::{build_client, path_safe, send_error};
use crate::config::schema::CarrierConfig;

const CARRIER: &str = "Plivo";
/// Plivo's public API root.
pub const DEFAULT_API_BASE: &str = "https://api.plivo.com";

/// Client for Plivo's Call API.
#[derive(Clone)]
pub struct PlivoRest {
    pub client: reqwest::Client,
    pub base: String,
    pub auth_id: String,
    auth_token: String,
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
        Ok(Self {
            client: build_client(CARRIER)?,
            base: base.trim_end_matches('/').to_string(),
            auth_id: auth_id.trim().to_string(),
            auth_token: auth_token.trim().to_string(),
        })
    }

    /// From a `[carriers.*]` entry of kind plivo.
    pub fn from_config(cfg: &CarrierConfig) -> Result<Self, CarrierError> {
        Self::new(
            cfg.api_base(),
            cfg.auth_id.expose(),
            cfg.auth_token.expose(),
        )
    }

    fn authorization(&self) -> String {
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

    /// Hangs up a call; one that has already ended counts as hung up.
    pub async fn hang_up(&self, call_uuid: &str) -> Result<(), CarrierError> {
        if !path_safe(call_uuid) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", call_uuid.escape_default()),
            });
        }
        let url = self.call_url(call_uuid);
        let resp = self
            .client
            .delete(&url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/json")
            .body(json!({"call_uuid": call_uuid}).to_string())
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, &url, e))?;
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
