//! Per-call media tokens. When a carrier webhook is accepted we mint a token bound to the call id
//! and an expiry; the carrier brings it back when it opens the media WebSocket. A token is an
//! HMAC-SHA256 under a secret drawn at process start, valid for a short time and usable once, so
//! a media socket can only be opened for a call this process just answered.
//!
//! One token per call: minting again for a call whose token is still valid returns the same
//! token, and once a call has redeemed a token no other token redeems for it (a replayed
//! webhook cannot open a second stream). Tokens carried in the URL can be checked before the
//! WebSocket upgrade ([`MediaTokens::precheck`]): only a token this process minted, unexpired
//! and unused, passes.

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
    #[error("media token was not issued by this process")]
    Unknown,
    #[error("this call already has a media stream; a second one is refused")]
    CallHasStream,
}

/// Mints and checks media tokens. One per process; cheap to share behind an `Arc`.
pub struct MediaTokens {
    key: hmac::Key,
    ttl: Duration,
    state: Mutex<State>,
}

/// How long a call that redeemed a token is remembered (no second stream for it).
const STREAMED_KEEP_S: u64 = 24 * 3600;

#[derive(Default)]
struct State {
    /// Tokens already redeemed, by their nonce, with their expiry (pruned as they expire).
    used: HashMap<[u8; NONCE_LEN], u64>,
    /// Tokens minted and not yet redeemed: nonce → (call id, expiry).
    issued: HashMap<[u8; NONCE_LEN], (String, u64)>,
    /// The one token of each call while it is valid: call id → (token, expiry).
    by_call: HashMap<String, (String, u64)>,
    /// Calls that redeemed a token, with when.
    streamed: HashMap<String, u64>,
    /// The second of the last prune (at most one a second).
    pruned_at: u64,
}

impl State {
    fn prune(&mut self, now: u64) {
        if now == self.pruned_at {
            return;
        }
        self.pruned_at = now;
        self.used.retain(|_, exp| *exp >= now);
        self.issued.retain(|_, (_, exp)| *exp >= now);
        self.by_call.retain(|_, (_, exp)| *exp >= now);
        self.streamed
            .retain(|_, at| at.saturating_add(STREAMED_KEEP_S) >= now);
    }
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
            state: Mutex::new(State::default()),
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

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token for `call_id`: the one already minted while it is valid (one token per
    /// call), else a new one that expires after the configured lifetime.
    pub fn mint(&self, call_id: &str) -> String {
        let now = Self::now();
        {
            let mut st = self.state();
            st.prune(now);
            if let Some((t, _)) = st.by_call.get(call_id) {
                return t.clone();
            }
        }
        let expiry = now + self.ttl.as_secs();
        let token = self.mint_with_expiry(call_id, expiry);
        self.state()
            .by_call
            .insert(call_id.to_string(), (token.clone(), expiry));
        token
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
        self.state()
            .issued
            .insert(nonce, (call_id.to_string(), expiry));
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Splits a token into expiry, nonce and tag.
    fn parse(token: Option<&str>) -> Result<(u64, [u8; NONCE_LEN], Vec<u8>), TokenError> {
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
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&raw[8..8 + NONCE_LEN]);
        Ok((
            u64::from_be_bytes(exp),
            nonce,
            raw[8 + NONCE_LEN..].to_vec(),
        ))
    }

    /// Checks a token before its call id is known (a URL token, before the WebSocket
    /// upgrade): it must be one this process minted, unexpired and unused. Does not use it.
    pub(crate) fn precheck(&self, token: Option<&str>) -> Result<(), TokenError> {
        let (expiry, nonce, tag) = Self::parse(token)?;
        let now = Self::now();
        let mut st = self.state();
        st.prune(now);
        if st.used.contains_key(&nonce) {
            return Err(TokenError::Reused);
        }
        let Some((call_id, _)) = st.issued.get(&nonce) else {
            return Err(if expiry < now {
                TokenError::Expired
            } else {
                TokenError::Unknown
            });
        };
        hmac::verify(&self.key, &Self::message(call_id, expiry, &nonce), &tag)
            .map_err(|_| TokenError::BadSignature)?;
        if expiry < now {
            return Err(TokenError::Expired);
        }
        Ok(())
    }

    fn message(call_id: &str, expiry: u64, nonce: &[u8]) -> Vec<u8> {
        let mut msg = Vec::with_capacity(call_id.len() + 1 + 8 + NONCE_LEN);
        msg.extend_from_slice(call_id.as_bytes());
        msg.push(0);
        msg.extend_from_slice(&expiry.to_be_bytes());
        msg.extend_from_slice(nonce);
        msg
    }

    /// Checks a token for `call_id` and marks it used. Succeeds at most once per token and
    /// once per call.
    pub fn redeem(&self, call_id: &str, token: Option<&str>) -> Result<(), TokenError> {
        let (expiry, nonce, tag) = Self::parse(token)?;
        hmac::verify(&self.key, &Self::message(call_id, expiry, &nonce), &tag)
            .map_err(|_| TokenError::BadSignature)?;
        let now = Self::now();
        if expiry < now {
            return Err(TokenError::Expired);
        }
        let mut st = self.state();
        st.prune(now);
        if st.used.contains_key(&nonce) {
            return Err(TokenError::Reused);
        }
        if st.streamed.contains_key(call_id) {
            return Err(TokenError::CallHasStream);
        }
        st.used.insert(nonce, expiry);
        st.issued.remove(&nonce);
        st.streamed.insert(call_id.to_string(), now);
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

    #[test]
    fn one_token_and_one_stream_per_call() {
        let t = MediaTokens::new(Duration::from_secs(60));
        let first = t.mint("CA1");
        // A replayed webhook gets the same token, not a second one.
        assert_eq!(t.mint("CA1"), first);
        assert_eq!(t.redeem("CA1", Some(&first)), Ok(()));
        // Even a distinct valid token for the call cannot open a second stream.
        let second = t.mint_with_expiry("CA1", MediaTokens::now() + 60);
        assert_eq!(
            t.redeem("CA1", Some(&second)),
            Err(TokenError::CallHasStream)
        );
    }

    #[test]
    fn precheck_passes_only_tokens_this_process_minted() {
        let t = MediaTokens::new(Duration::from_secs(60));
        let tok = t.mint("v3:call");
        assert_eq!(t.precheck(Some(&tok)), Ok(()));
        assert_eq!(
            t.precheck(Some(&tok)),
            Ok(()),
            "precheck does not use the token"
        );
        assert_eq!(t.precheck(None), Err(TokenError::Missing));
        assert_eq!(t.precheck(Some("x")), Err(TokenError::Malformed));
        let foreign = MediaTokens::new(Duration::from_secs(60)).mint("v3:call");
        assert_eq!(t.precheck(Some(&foreign)), Err(TokenError::Unknown));
        let old = t.mint_with_expiry("v3:old", 1000);
        assert_eq!(t.precheck(Some(&old)), Err(TokenError::Expired));
        assert_eq!(t.redeem("v3:call", Some(&tok)), Ok(()));
        assert_eq!(t.precheck(Some(&tok)), Err(TokenError::Reused));
    }
}
