//! Phone links: short-lived, single-use URLs that open the browser phone (`/phone`) without
//! the API token. A link carries a call id, the one agent it may call (always named: the
//! default agent is resolved when the link is minted) and an expiry at most [`MAX_TTL_S`]
//! ahead, signed with
//! HMAC-SHA256 under a key derived from the configuration's secret material (`server.api_token`),
//! so `patterd phone-link` can mint one from the config file alone and the running daemon can
//! check it. Single use comes from the call id: a link opens exactly one call with that id, and
//! a call id is admitted once (a second use is refused as a repeated call).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Why a phone link was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("phone link is missing")]
    Missing,
    #[error("phone link is malformed")]
    Malformed,
    #[error("phone link signature is not valid (forged, or made with another api_token)")]
    BadSignature,
    #[error("phone link has expired; make a new one with `patterd phone-link`")]
    Expired,
    #[error(
        "phone link names no agent (made by an older patterd); make a new one with `patterd phone-link`"
    )]
    Unbound,
    #[error("phone link is valid for longer than 24 h; make a new one with `patterd phone-link`")]
    TooLong,
}

/// What a valid link grants: one call with this id, to this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkClaims {
    pub call_id: String,
    pub agent: String,
    /// Seconds since the Unix epoch.
    pub expiry: u64,
}

/// Mints and checks phone links under one key.
pub struct PhoneLinks {
    key: hmac::Key,
}

/// Domain separation of the link key from other uses of the same secret.
const KEY_LABEL: &[u8] = b"patterd phone-link v1";
const VERSION: &str = "1";
/// Longest link accepted (before any decoding).
const MAX_LEN: usize = 512;
/// Longest lifetime of a link: `patterd phone-link --ttl` refuses more, and a link expiring
/// later than this (plus [`CLOCK_SKEW_S`]) from now is refused.
pub const MAX_TTL_S: u64 = 24 * 3600;
/// Allowance for the clocks of the machine that minted a link and the daemon's.
const CLOCK_SKEW_S: u64 = 300;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl PhoneLinks {
    /// The link key derived from `secret` (the API token); `None` when it is empty (links
    /// would then be forgeable).
    pub fn from_secret(secret: &str) -> Option<Self> {
        if secret.is_empty() {
            return None;
        }
        let master = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let derived = hmac::sign(&master, KEY_LABEL);
        Some(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
        })
    }

    /// A fresh call id for a browser call (`web-` + 24 hex digits).
    pub(crate) fn new_call_id() -> String {
        let mut raw = [0u8; 12];
        let _ = SystemRandom::new().fill(&mut raw);
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        format!("web-{hex}")
    }

    /// A link for a new call to `agent` valid until `expiry`.
    pub fn mint(&self, agent: &str, expiry: u64) -> (String, LinkClaims) {
        let claims = LinkClaims {
            call_id: Self::new_call_id(),
            agent: agent.to_string(),
            expiry,
        };
        (self.sign(&claims), claims)
    }

    fn payload(c: &LinkClaims) -> String {
        format!("{VERSION}\n{}\n{}\n{}", c.call_id, c.agent, c.expiry)
    }

    /// The link text for `claims`: `payload.tag`, both base64url.
    pub fn sign(&self, claims: &LinkClaims) -> String {
        let payload = Self::payload(claims);
        let tag = hmac::sign(&self.key, payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// Checks a link's signature, agent and expiry at `now` (it is used up by the call it
    /// opens).
    pub fn verify(&self, link: Option<&str>, now: u64) -> Result<LinkClaims, LinkError> {
        let link = link.filter(|l| !l.is_empty()).ok_or(LinkError::Missing)?;
        if link.len() > MAX_LEN {
            return Err(LinkError::Malformed);
        }
        let (payload, tag) = link.split_once('.').ok_or(LinkError::Malformed)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| LinkError::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| LinkError::Malformed)?;
        hmac::verify(&self.key, &payload, &tag).map_err(|_| LinkError::BadSignature)?;
        let text = String::from_utf8(payload).map_err(|_| LinkError::Malformed)?;
        let mut parts = text.split('\n');
        let (Some(VERSION), Some(call_id), Some(agent), Some(expiry), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(LinkError::Malformed);
        };
        let expiry: u64 = expiry.parse().map_err(|_| LinkError::Malformed)?;
        if expiry < now {
            return Err(LinkError::Expired);
        }
        if expiry > now.saturating_add(MAX_TTL_S + CLOCK_SKEW_S) {
            return Err(LinkError::TooLong);
        }
        if agent.is_empty() {
            return Err(LinkError::Unbound);
        }
        Ok(LinkClaims {
            call_id: call_id.to_string(),
            agent: agent.to_string(),
            expiry,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_verifies_until_it_expires_and_only_under_its_key() {
        let links = PhoneLinks::from_secret("api-token").expect("key");
        let (link, claims) = links.mint("front-desk", 1_000);
        assert!(claims.call_id.starts_with("web-"));
        assert_eq!(links.verify(Some(&link), 999), Ok(claims.clone()));
        assert_eq!(links.verify(Some(&link), 1_001), Err(LinkError::Expired));
        let other = PhoneLinks::from_secret("another-token").expect("key");
        assert_eq!(other.verify(Some(&link), 999), Err(LinkError::BadSignature));
        // The same secret (the CLI and the daemon) derives the same key.
        let again = PhoneLinks::from_secret("api-token").expect("key");
        assert_eq!(again.verify(Some(&link), 999), Ok(claims));
        assert!(PhoneLinks::from_secret("").is_none());
    }

    #[test]
    fn forged_and_garbage_links_fail() {
        let links = PhoneLinks::from_secret("api-token").expect("key");
        let (link, _) = links.mint("front-desk", 1_000);
        let (payload, tag) = link.split_once('.').expect("two parts");
        // Another agent or call id under the old tag.
        let forged_payload = URL_SAFE_NO_PAD.encode(b"1\nweb-00\nother\n1000");
        assert_eq!(
            links.verify(Some(&format!("{forged_payload}.{tag}")), 0),
            Err(LinkError::BadSignature)
        );
        assert_eq!(links.verify(None, 0), Err(LinkError::Missing));
        assert_eq!(links.verify(Some(""), 0), Err(LinkError::Missing));
        assert_eq!(links.verify(Some(payload), 0), Err(LinkError::Malformed));
        assert_eq!(links.verify(Some("!!.!!"), 0), Err(LinkError::Malformed));
        assert_eq!(
            links.verify(Some(&"a".repeat(600)), 0),
            Err(LinkError::Malformed)
        );
    }

    #[test]
    fn a_link_is_bound_to_an_agent_and_lives_at_most_a_day() {
        let links = PhoneLinks::from_secret("api-token").expect("key");
        // A link without an agent (what an older patterd minted) opens nothing.
        let unbound = links.sign(&LinkClaims {
            call_id: "web-00".into(),
            agent: String::new(),
            expiry: 1_000,
        });
        assert_eq!(links.verify(Some(&unbound), 0), Err(LinkError::Unbound));
        // One that expires more than a day from now is refused; a day is accepted.
        let now = 1_000_000;
        let (year, _) = links.mint("front-desk", now + 365 * 24 * 3600);
        assert_eq!(links.verify(Some(&year), now), Err(LinkError::TooLong));
        let (day, claims) = links.mint("front-desk", now + MAX_TTL_S);
        assert_eq!(links.verify(Some(&day), now), Ok(claims));
    }
}
