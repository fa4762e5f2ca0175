//! Vonage's signed webhooks: every answer and event request carries `Authorization: Bearer
//! <JWT>`, HS256 with the account's signature secret. A request verifies when the signature
//! matches (constant time), the `iat` claim is within [`MAX_SKEW_S`] of our clock, the `exp`
//! claim (if any) has not passed, the `payload_hash` claim (if any) is the hex SHA-256 of the
//! body, and its `jti` has not been seen before ([`Jtis`], a bounded replay set).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::{digest, hmac};
use serde::Deserialize;

/// How far a token's `iat` may be from our clock, either way.
pub(crate) const MAX_SKEW_S: u64 = 300;
/// Most `jti`s remembered for replay detection (the oldest are forgotten first).
pub(crate) const MAX_JTIS: usize = 100_000;

/// Why a webhook's token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("no `Authorization: Bearer` token")]
    Missing,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token is not HS256")]
    Algorithm,
    #[error("the token's signature does not match the signature secret")]
    Signature,
    #[error("the token's iat is too far from our clock")]
    Stale,
    #[error("the token has expired")]
    Expired,
    #[error("the token's payload_hash does not match the body")]
    PayloadHash,
    #[error("the token's jti was already used (a replayed request)")]
    Replayed,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

/// The claims patterd checks.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iat: u64,
    #[serde(default)]
    pub exp: Option<u64>,
    pub jti: String,
    #[serde(default)]
    pub payload_hash: Option<String>,
}

/// The token of an `Authorization` header value.
pub fn bearer(authorization: Option<&str>) -> Result<&str, JwtError> {
    authorization
        .and_then(|a| a.strip_prefix("Bearer ").or_else(|| a.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(JwtError::Missing)
}

/// Verifies `token`'s signature with `secret` and its time and body claims against `now`
/// (unix seconds) and `body`; the replay check is [`Jtis::first_use`]'s.
pub fn verify(secret: &str, token: &str, body: &[u8], now: u64) -> Result<Claims, JwtError> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    let decode = |s: &str| URL_SAFE_NO_PAD.decode(s).map_err(|_| JwtError::Malformed);
    let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| JwtError::Malformed)?;
    if header.alg != "HS256" {
        return Err(JwtError::Algorithm);
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let signed = &token[..h.len() + 1 + p.len()];
    hmac::verify(&key, signed.as_bytes(), &decode(s)?).map_err(|_| JwtError::Signature)?;
    let claims: Claims = serde_json::from_slice(&decode(p)?).map_err(|_| JwtError::Malformed)?;
    if claims.iat.abs_diff(now) > MAX_SKEW_S {
        return Err(JwtError::Stale);
    }
    if claims.exp.is_some_and(|exp| exp <= now) {
        return Err(JwtError::Expired);
    }
    if let Some(hash) = &claims.payload_hash {
        let ours = hex::encode(digest::digest(&digest::SHA256, body));
        if !hash.eq_ignore_ascii_case(&ours) {
            return Err(JwtError::PayloadHash);
        }
    }
    Ok(claims)
}

/// Signs `claims` (a JSON object) as an HS256 JWT with `secret`: what Vonage sends, for tests
/// and the simulator.
#[cfg(test)]
pub(crate) fn sign_hs256(secret: &str, claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{payload}");
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, signed.as_bytes()));
    format!("{signed}.{sig}")
}

/// The `jti`s of tokens that verified: each token is good once.
#[derive(Default)]
pub(crate) struct Jtis(Mutex<(HashSet<String>, VecDeque<String>)>);

impl Jtis {
    /// True the first time `jti` is seen.
    pub(crate) fn first_use(&self, jti: &str) -> bool {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (seen, order) = &mut *guard;
        if seen.contains(jti) {
            return false;
        }
        if order.len() >= MAX_JTIS
            && let Some(old) = order.pop_front()
        {
            seen.remove(&old);
        }
        seen.insert(jti.to_string());
        order.push_back(jti.to_string());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &str = "sig-secret";
    const NOW: u64 = 1_800_000_000;
    const BODY: &[u8] = br#"{"uuid":"u1"}"#;

    fn token(claims: serde_json::Value) -> String {
        sign_hs256(SECRET, &claims)
    }

    fn hash(body: &[u8]) -> String {
        hex::encode(digest::digest(&digest::SHA256, body))
    }

    #[test]
    fn a_good_token_verifies_once() {
        let t = token(json!({"iat": NOW, "jti": "j1", "payload_hash": hash(BODY)}));
        let claims = verify(SECRET, &t, BODY, NOW + 10).expect("good token");
        assert_eq!(claims.jti, "j1");
        let jtis = Jtis::default();
        assert!(jtis.first_use(&claims.jti));
        assert!(!jtis.first_use(&claims.jti), "a replayed jti is refused");
        // Without a payload_hash the body is not bound (GET answer webhooks).
        let t = token(json!({"iat": NOW, "jti": "j2"}));
        assert!(verify(SECRET, &t, b"", NOW).is_ok());
    }

    #[test]
    fn forged_expired_and_tampered_tokens_are_refused() {
        let good = json!({"iat": NOW, "jti": "j1", "payload_hash": hash(BODY)});
        let forged = sign_hs256("other", &good);
        assert_eq!(verify(SECRET, &forged, BODY, NOW), Err(JwtError::Signature));
        let t = token(good.clone());
        assert_eq!(
            verify(SECRET, &t, b"{\"uuid\":\"u2\"}", NOW),
            Err(JwtError::PayloadHash)
        );
        assert_eq!(
            verify(SECRET, &t, BODY, NOW + MAX_SKEW_S + 1),
            Err(JwtError::Stale)
        );
        let expired = token(json!({"iat": NOW, "exp": NOW + 5, "jti": "j"}));
        assert_eq!(verify(SECRET, &expired, b"", NOW + 6), Err(JwtError::Expired));
        // A payload swapped under the old signature.
        let mut parts: Vec<&str> = t.split('.').collect();
        let other = URL_SAFE_NO_PAD.encode(json!({"iat": NOW, "jti": "j9"}).to_string());
        parts[1] = &other;
        assert_eq!(verify(SECRET, &parts.join("."), BODY, NOW), Err(JwtError::Signature));
        // alg=none and garbage.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(good.to_string())
        );
        assert_eq!(verify(SECRET, &none, BODY, NOW), Err(JwtError::Algorithm));
        assert_eq!(verify(SECRET, "a.b", BODY, NOW), Err(JwtError::Malformed));
        assert_eq!(bearer(None), Err(JwtError::Missing));
        assert_eq!(bearer(Some("Basic x")), Err(JwtError::Missing));
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
    }
}
