//! Telnyx's `[carriers.NAME]` keys (`kind = "telnyx"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::carrier::account::{account_api_base, missing_credentials};
use crate::util::secret::Secret;

/// `[carriers.NAME]` with `kind = "telnyx"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub api_key: Secret,
    /// Base64 Ed25519 public key for webhook signatures.
    #[serde(default)]
    pub public_key: String,
    /// The Call Control application that places outbound calls.
    #[serde(default)]
    pub connection_id: String,
    /// The REST API root (proxies, regions, tests).
    #[serde(default)]
    pub api_base_url: Option<String>,
}

impl AccountConfig for Config {
    account_api_base!(DEFAULT_API_BASE);

    fn missing_credentials(&self) -> Vec<&'static str> {
        missing_credentials(&[
            ("api_key", self.api_key.is_empty()),
            ("public_key", self.public_key.trim().is_empty()),
        ])
    }

    fn sms_problem(&self) -> Option<String> {
        None
    }

    fn outbound_problem(&self) -> Option<String> {
        self.connection_id.trim().is_empty().then(|| {
            "which has no connection_id: set it to the id of the Call Control application that \
             places the calls"
                .to_string()
        })
    }
}
