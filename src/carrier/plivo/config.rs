//! Plivo's `[carriers.NAME]` keys (`kind = "plivo"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::carrier::account::{account_api_base, missing_credentials};
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
    /// The Lookup API root (default `https://lookup.plivo.com`, or `api_base_url` when that is
    /// set: a proxy or a fake serves both).
    #[serde(default)]
    pub lookup_base_url: Option<String>,
}

impl AccountConfig for Config {
    account_api_base!(DEFAULT_API_BASE);

    fn missing_credentials(&self) -> Vec<&'static str> {
        missing_credentials(&[
            ("auth_id", self.auth_id.is_empty()),
            ("auth_token", self.auth_token.is_empty()),
        ])
    }

    fn sms_problem(&self) -> Option<String> {
        None
    }
}
