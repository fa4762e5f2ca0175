//! A secret configuration value (API key, auth token) that never prints itself. Lives below
//! both `config` and `carrier`, which each hold secrets. Inside [`fingerprinted`] a secret
//! serializes as a digest of its value instead of `***`, so two configurations can be compared
//! by value (a rotated token differs) without either value appearing in the comparison.

use std::cell::Cell;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How every call token (`crate::security::call_token`) starts: a configured token may not
/// (config validation), and the access check tells call tokens by it.
pub const CALL_TOKEN_PREFIX: &str = "pdc1.";

/// A secret value (API key, auth token). Never printed: `Debug` and `Serialize` show `***`
/// (or an empty string when unset, so `check` still shows what is unconfigured).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The secret's value, for the one place that needs it (a request header, an HMAC key).
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("\"***\"")
        }
    }
}

thread_local! {
    /// Set while [`fingerprinted`] runs on this thread.
    static FINGERPRINT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every [`Secret`] serializing as `sha256:<hex of its value>` (empty stays
/// empty): serialized configurations then differ exactly when a secret's value does.
pub fn fingerprinted<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            FINGERPRINT.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(FINGERPRINT.with(|c| c.replace(true)));
    f()
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_empty() {
            return s.serialize_str("");
        }
        if FINGERPRINT.with(Cell::get) {
            let d = ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes());
            return s.serialize_str(&format!("sha256:{}", hex::encode(d.as_ref())));
        }
        s.serialize_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_print_stars_and_compare_by_value_only_when_fingerprinted() {
        let a = Secret::new("token-one");
        let b = Secret::new("token-two");
        let json = |s: &Secret| serde_json::to_string(s).expect("json");
        assert_eq!(json(&a), json(&b));
        assert_eq!(json(&a), "\"***\"");
        let (fa, fb) = fingerprinted(|| (json(&a), json(&b)));
        assert_ne!(fa, fb);
        assert!(!fa.contains("token-one"), "{fa}");
        assert_eq!(fa, fingerprinted(|| json(&Secret::new("token-one"))));
        // The mode ends with the closure.
        assert_eq!(json(&a), "\"***\"");
        assert_eq!(fingerprinted(|| json(&Secret::default())), "\"\"");
    }
}
