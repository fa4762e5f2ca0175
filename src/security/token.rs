//! Per-call media tokens. When a carrier webhook is accepted we mint a token bound to the call id
//! and an expiry; the carrier brings it back when it opens the media WebSocket. A token is an
//! HMAC-SHA256 under a secret drawn at process start, valid for a short time and usable once, so
//! a media socket can only be opened for a call this process just answered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Why a media token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("media token is missing")]
    Missing,
    #[error("media token is malformed")]
    Malformed,
    #[error("media token signature does not match this call")]
    BadSignature,
    #[error("media token has expired")]
    Expired,
    #[error("media token was already used")]
    Reused,
}

/// Mints and checks media tokens. One per process; cheap to share behind an `Arc`.
pub struct MediaTokens {
    key: hmac::Key,
    ttl: Duration,
    /// Tokens already redeemed, by their nonce, with their expiry (pruned as they expire).
    used: Mutex<HashMap<[u8; 12], u64>>,
}

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 32;

impl MediaTokens {
    /// A token factory with a fresh random secret and the given lifetime.
    pub fn new(ttl: Duration) -> Self {
        let rng = SystemRandom::new();
        let mut secret = [0u8; 32];
        // SystemRandom only fails when the OS has no entropy source at all.
        rng.fill(&mut secret)
            .expect("the operating system's random number generator failed");
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            ttl,
            used: Mutex::new(HashMap::new()),
        }
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    fn tag(&self, call_id: &str, expiry: u64, nonce: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(call_id.as_bytes());
        ctx.update(&[0]);
        ctx.update(&expiry.to_be_bytes());
        ctx.update(nonce);
        ctx.sign()
    }

    /// Mints a token for `call_id` that expires after the configured lifetime.
    pub fn mint(&self, call_id: &str) -> String {
        self.mint_with_expiry(call_id, Self::now() + self.ttl.as_secs())
    }

    /// Mints a token with an explicit expiry (seconds since the epoch); tests use it to make
    /// already-expired tokens.
    pub fn mint_with_expiry(&self, call_id: &str, expiry: u64) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        let _ = SystemRandom::new().fill(&mut nonce);
        let tag = self.tag(call_id, expiry, &nonce);
        let mut raw = Vec::with_capacity(8 + NONCE_LEN + TAG_LEN);
        raw.extend_from_slice(&expiry.to_be_bytes());
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(tag.as_ref());
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Checks a token for `call_id` and marks it used. Succeeds at most once per token.
    pub fn redeem(&self, call_id: &str, token: Option<&str>) -> Result<(), TokenError> {
        let token = token.filter(|t| !t.is_empty()).ok_or(TokenError::Missing)?;
        if token.len() > 128 {
            return Err(TokenError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| TokenError::Malformed)?;
        if raw.len() != 8 + NONCE_LEN + TAG_LEN {
            return Err(TokenError::Malformed);
        }
        let mut exp = [0u8; 8];
        exp.copy_from_slice(&raw[..8]);
        let expiry = u64::from_be_bytes(exp);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&raw[8..8 + NONCE_LEN]);
        let mut msg = Vec::with_capacity(call_id.len() + 1 + 8 + NONCE_LEN);
        msg.extend_from_slice(call_id.as_bytes());
        msg.push(0);
        msg.extend_from_slice(&exp);
        msg.extend_from_slice(&nonce);
        hmac::verify(&self.key, &msg, &raw[8 + NONCE_LEN..])
            .map_err(|_| TokenError::BadSignature)?;
        let now = Self::now();
        if expiry < now {
            return Err(TokenError::Expired);
        }
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|_, exp| *exp >= now);
        if used.insert(nonce, expiry).is_some() {
            return Err(TokenError::Reused);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_single_use_and_bound_to_the_call() {
        let t = MediaTokens::new(Duration::from_secs(60));
        let tok = t.mint("CA1");
        assert_eq!(t.redeem("CA2", Some(&tok)), Err(TokenError::BadSignature));
        assert_eq!(t.redeem("CA1", Some(&tok)), Ok(()));
        assert_eq!(t.redeem("CA1", Some(&tok)), Err(TokenError::Reused));
    }

    #[test]
    fn expired_missing_and_garbage_tokens_fail() {
        let t = MediaTokens::new(Duration::from_secs(60));
        let old = t.mint_with_expiry("CA1", 1000);
        assert_eq!(t.redeem("CA1", Some(&old)), Err(TokenError::Expired));
        assert_eq!(t.redeem("CA1", None), Err(TokenError::Missing));
        assert_eq!(t.redeem("CA1", Some("")), Err(TokenError::Missing));
        assert_eq!(t.redeem("CA1", Some("!!!")), Err(TokenError::Malformed));
        let other = MediaTokens::new(Duration::from_secs(60)).mint("CA1");
        assert_eq!(t.redeem("CA1", Some(&other)), Err(TokenError::BadSignature));
    }
}
