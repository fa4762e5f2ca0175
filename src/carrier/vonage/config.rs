//! Vonage's `[carriers.NAME]` keys (`kind = "vonage"`).

use serde::{Deserialize, Serialize};

use super::rest::DEFAULT_API_BASE;
use crate::carrier::AccountConfig;
use crate::carrier::account::{account_api_base, missing_credentials};
use crate::util::secret::Secret;

/// `[carriers.NAME]` with `kind = "vonage"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The Vonage application's id (the `application_id` claim of the REST JWT).
    #[serde(default)]
    pub application_id: Secret,
    /// The application's RSA private key, PKCS#8 PEM (signs the REST JWT, RS256).
    #[serde(default)]
    pub private_key: Secret,
    /// The account's signature secret: verifies the HS256 JWT on every webhook.
    #[serde(default)]
    pub signature_secret: Secret,
    /// The REST API root (proxies, regions, tests).
    #[serde(default)]
    pub api_base_url: Option<String>,
}

impl AccountConfig for Config {
    account_api_base!(DEFAULT_API_BASE);

    fn missing_credentials(&self) -> Vec<&'static str> {
        missing_credentials(&[
            ("application_id", self.application_id.is_empty()),
            ("private_key", self.private_key.is_empty()),
            ("signature_secret", self.signature_secret.is_empty()),
        ])
    }
}
