//! The browser phone's `[carriers.NAME]` keys (`kind = "web"`). The section is optional: the
//! browser phone is always served (behind the API's credentials or a phone link); a section
//! only changes its settings.

use serde::{Deserialize, Serialize};

use crate::carrier::AccountConfig;

/// `[carriers.NAME]` with `kind = "web"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The agent a page opens when it names none (default: the first `[agents.*]`).
    #[serde(default)]
    pub agent: Option<String>,
}

impl AccountConfig for Config {
    fn default_api_base(&self) -> &'static str {
        ""
    }

    fn api_base_url(&self) -> Option<&str> {
        None
    }

    fn missing_credentials(&self) -> Vec<&'static str> {
        Vec::new()
    }

    fn outbound_problem(&self) -> Option<String> {
        Some("the browser phone cannot place calls (open /phone instead)".into())
    }
}
