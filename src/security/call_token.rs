//! Per-call API tokens (scope `call`): patterd mints one for each call and hands it to the
//! call's brain in the `X-Patterd-Call-Token` request header
//! (`crate::provider::openai::CALL_TOKEN_HEADER`); presented as a bearer token on
//! `/v1` or `/mcp` it allows only reads of, and actions on, that one call. A token is
//! `pdc1.<base64url(call id)>.<base64url(HMAC-SHA256(key, label + call id))>` under a key
//! drawn at process start, so nothing is stored per call: a token names its call and proves
//! patterd minted it. It stops working when its call ends (the access check requires the call
//! to be live) and when the process restarts (a new key).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The prefix that tells a call token from a configured one.
const PREFIX: &str = crate::util::secret::CALL_TOKEN_PREFIX;
/// Domain separation from the key's other uses (none today).
const LABEL: &[u8] = b"patterd call token v1\n";
/// The longest call id a token is minted or checked for (carrier ids are far shorter).
const MAX_CALL_ID: usize = 256;

/// Mints and checks call tokens. One per process.
pub struct CallTokens {
    key: hmac::Key,
}

impl Default for CallTokens {
    fn default() -> Self {
        Self::new()
    }
}

impl CallTokens {
    /// A factory with a fresh random key.
    pub fn new() -> Self {
        let mut secret = [0u8; 32];
        // SystemRandom only fails when the OS has no entropy source at all.
        SystemRandom::new()
            .fill(&mut secret)
            .expect("the operating system's random number generator failed");
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
        }
    }

    fn tag(&self, call_id: &str) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(LABEL);
        ctx.update(call_id.as_bytes());
        ctx.sign()
    }

    /// The token of `call_id` (the same every time for one call and process).
    pub fn mint(&self, call_id: &str) -> String {
        format!(
            "{PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(call_id.as_bytes()),
            URL_SAFE_NO_PAD.encode(self.tag(call_id).as_ref())
        )
    }

    /// True when `given` looks like a call token (whether or not it is valid).
    pub fn looks_like(given: &str) -> bool {
        given.starts_with(PREFIX)
    }

    /// The call a token names, decoded but NOT checked (any process's token, or a
    /// forgery): what a cluster instance reads from a call token another instance minted, to
    /// know which call's owner must check it.
    pub fn named_call(given: &str) -> Option<String> {
        Self::split(given).map(|(id, _)| id)
    }

    fn split(given: &str) -> Option<(String, Vec<u8>)> {
        let rest = given.strip_prefix(PREFIX)?;
        let (id, tag) = rest.split_once('.')?;
        if id.len() > MAX_CALL_ID * 2 {
            return None;
        }
        let id = String::from_utf8(URL_SAFE_NO_PAD.decode(id).ok()?).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        Some((id, tag))
    }

    /// The call `given` was minted for by this process; `None` for anything else.
    pub fn verify(&self, given: &str) -> Option<String> {
        let (id, tag) = Self::split(given)?;
        let mut msg = LABEL.to_vec();
        msg.extend_from_slice(id.as_bytes());
        hmac::verify(&self.key, &msg, &tag).ok()?;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_call_and_only_this_process_mints_it() {
        let t = CallTokens::new();
        let tok = t.mint("CA1:x/y");
        assert!(CallTokens::looks_like(&tok));
        assert_eq!(t.verify(&tok).as_deref(), Some("CA1:x/y"));
        assert_eq!(t.mint("CA1:x/y"), tok, "one token per call");
        // Another process (key) does not accept it.
        assert_eq!(CallTokens::new().verify(&tok), None);
        // Any process reads which call a token names, without being able to check it.
        assert_eq!(CallTokens::named_call(&tok).as_deref(), Some("CA1:x/y"));
        // The call id cannot be swapped under the tag.
        let (_, tag) = tok.rsplit_once('.').expect("tag");
        let forged = format!("{PREFIX}{}.{tag}", URL_SAFE_NO_PAD.encode("CA2"));
        assert_eq!(t.verify(&forged), None);
        for bad in [
            "",
            "pdc1.",
            "pdc1.x",
            "pdc1.!!.!!",
            "Bearer x",
            &tok[..tok.len() - 2],
        ] {
            assert_eq!(t.verify(bad), None, "{bad:?}");
        }
    }
}
