//! What every carrier's accounts share: the neutral view of a `[carriers.NAME]` section
//! ([`AccountConfig`]: API root, missing credentials, outbound readiness) and the list of
//! usable accounts a carrier keeps ([`Accounts`]), built the same way for every carrier.

use std::sync::Arc;

use super::{CarrierError, CarrierKind};

/// A carrier's `[carriers.NAME]` keys, seen carrier-neutrally (validation, warnings, the 503
/// of an unconfigured carrier).
pub trait AccountConfig: Send + Sync {
    /// The carrier's public REST API root.
    fn default_api_base(&self) -> &'static str;
    /// `api_base_url` as written, if set.
    fn api_base_url(&self) -> Option<&str>;
    /// Names of the credentials still empty (none when the account is usable).
    fn missing_credentials(&self) -> Vec<&'static str>;
    /// Why the account cannot place calls, if it cannot (ends "… through [carriers.NAME], ").
    fn outbound_problem(&self) -> Option<String> {
        None
    }
    /// The REST API root: `api_base_url`, or the public default.
    fn api_base(&self) -> &str {
        match self.api_base_url() {
            Some(u) => u.trim_end_matches('/'),
            None => self.default_api_base(),
        }
    }
}

/// One usable account: its `[carriers.NAME]` name, the key that verifies its webhooks and
/// its REST client.
pub struct Account<R> {
    pub name: String,
    pub verify_key: String,
    pub rest: Arc<R>,
}

/// A carrier's usable accounts (those with every credential set and a working client).
pub struct Accounts<R> {
    pub list: Vec<Account<R>>,
    /// The credential keys an account of this carrier needs (for the 503 message).
    pub required: Vec<&'static str>,
}

impl<R> Accounts<R> {
    /// Keeps the accounts with all credentials; `make` builds the verify key and client (an
    /// account it refuses is logged and left out).
    pub fn build<C: AccountConfig + Default>(
        kind: CarrierKind,
        configs: Vec<(String, C)>,
        make: impl Fn(&C) -> Result<(String, R), CarrierError>,
    ) -> Self {
        let list = configs
            .into_iter()
            .filter(|(_, c)| c.missing_credentials().is_empty())
            .filter_map(|(name, c)| match make(&c) {
                Ok((verify_key, rest)) => Some(Account {
                    name,
                    verify_key,
                    rest: Arc::new(rest),
                }),
                Err(e) => {
                    tracing::error!(carrier = %name, kind = kind.as_str(), error = %e, "carrier account unusable");
                    None
                }
            })
            .collect();
        Self {
            list,
            required: C::default().missing_credentials(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Account<R>> {
        self.list.iter().find(|a| a.name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first account whose key verifies a webhook.
    pub fn verifying(&self, mut verify: impl FnMut(&str) -> bool) -> Option<&Account<R>> {
        self.list.iter().find(|a| verify(&a.verify_key))
    }
}
