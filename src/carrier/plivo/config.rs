//! Plivo's `[carriers.NAME]` keys (`kind = "plivo"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::util::secret::Secret;

/// `[carriers.NAME]` with `kind = "plivo"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub auth_id: Secret,
    /// Also verifies `X-Plivo-Signature-V3`.
    #[serde(default)]
    pub auth_token: Secret,
    /// The REST API root (proxies, regions, tests).
    #[serde(default)]
    pub api_base_url: Option<String>,
}

impl AccountConfig for Config {
    fn default_api_base(&self) -> &'static str {
        DEFAULT_API_BASE
    }

    fn api_base_url(&self) -> Option<&str> {
        self.api_base_url.as_deref()
    }

    fn missing_credentials(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.auth_id.is_empty() {
            missing.push("auth_id");
        }
        if self.auth_token.is_empty() {
            missing.push("auth_token");
        }
        missing
    }
}
