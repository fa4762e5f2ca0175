//! Twilio's `[carriers.NAME]` keys (`kind = "twilio"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::util::secret::Secret;

/// `[carriers.NAME]` with `kind = "twilio"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub account_sid: Secret,
    /// Also verifies webhook signatures.
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
        if self.account_sid.is_empty() {
            missing.push("account_sid");
        }
        if self.auth_token.is_empty() {
            missing.push("auth_token");
        }
        missing
    }
}
