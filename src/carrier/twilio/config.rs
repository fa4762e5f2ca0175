//! Twilio's `[carriers.NAME]` keys (`kind = "twilio"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::carrier::account::{account_api_base, missing_credentials};
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
    /// The Lookup API root (default `https://lookups.twilio.com`, or `api_base_url` when that
    /// is set: a proxy or a fake serves both).
    #[serde(default)]
    pub lookup_base_url: Option<String>,
}

impl AccountConfig for Config {
    account_api_base!(DEFAULT_API_BASE);

    fn missing_credentials(&self) -> Vec<&'static str> {
        missing_credentials(&[
            ("account_sid", self.account_sid.is_empty()),
            ("auth_token", self.auth_token.is_empty()),
        ])
    }

    fn sms_problem(&self) -> Option<String> {
        None
    }
}
