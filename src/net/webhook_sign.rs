//! Standard Webhooks signatures for the webhooks patterd sends (`[[webhooks]]`): the secret's
//! key (`whsec_` + base64 is decoded, any other string is its own bytes), and the
//! `webhook-signature` header — `v1,` + base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`,
//! one per key, space-separated, so a receiver mid-rotation verifies with either. What the
//! Standard Webhooks libraries (Python `standardwebhooks`, npm `standardwebhooks`, Go
//! `standard-webhooks`) check.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use ring::hmac;

/// The prefix of a Standard Webhooks symmetric secret.
pub(crate) const SECRET_PREFIX: &str = "whsec_";

/// The shortest key accepted, in bytes (the specification's minimum, 192 bits).
pub(crate) const MIN_KEY_BYTES: usize = 24;

/// The longest key accepted, in bytes (512 bits, the specification's maximum).
pub(crate) const MAX_KEY_BYTES: usize = 64;

/// Why a secret is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("is empty; set secret = \"${{PATTERD_WEBHOOK_SECRET}}\"")]
    Empty,
    #[error(
        "starts with whsec_ but the rest is not base64; make one with \
         `echo whsec_$(openssl rand -base64 32)`"
    )]
    NotBase64,
    #[error(
        "gives a key of {0} bytes; the Standard Webhooks specification wants 24 to 64 \
         (`echo whsec_$(openssl rand -base64 32)` makes a 32-byte one)"
    )]
    Length(usize),
}

/// The HMAC key of `secret`: the base64 after `whsec_`, or the string's own bytes.
pub(crate) fn key(secret: &str) -> Result<Vec<u8>, KeyError> {
    let secret = secret.trim();
    if secret.is_empty() {
        return Err(KeyError::Empty);
    }
    let bytes = match secret.strip_prefix(SECRET_PREFIX) {
        Some(b64) => {
            let b64 = b64.trim_end_matches('=');
            STANDARD_NO_PAD
                .decode(b64)
                .map_err(|_| KeyError::NotBase64)?
        }
        None => secret.as_bytes().to_vec(),
    };
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
        return Err(KeyError::Length(bytes.len()));
    }
    Ok(bytes)
}

/// One `v1,<base64>` signature of `{id}.{timestamp}.{body}` with `key`.
pub(crate) fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(id.as_bytes());
    ctx.update(b".");
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("v1,{}", STANDARD.encode(ctx.sign().as_ref()))
}

/// The `webhook-signature` header: one signature per key, space-separated.
pub(crate) fn header(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| sign(k, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example secret, id, timestamp and body, and the signature the
    /// reference libraries' tests expect for them.
    #[test]
    fn signs_like_the_reference_libraries() {
        let k = key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("key");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&k, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_plain_secret_is_its_bytes_and_padding_is_optional() {
        assert_eq!(
            key("a-plain-secret-of-enough-bytes").expect("plain"),
            b"a-plain-secret-of-enough-bytes".to_vec()
        );
        let padded = key("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=").expect("padded");
        let bare = key("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY").expect("bare");
        assert_eq!(padded, bare);
        assert_eq!(padded, b"0123456789abcdef0123456789abcdef".to_vec());
    }

    #[test]
    fn bad_secrets_are_refused_with_a_reason() {
        assert_eq!(key("  "), Err(KeyError::Empty));
        assert_eq!(key("whsec_not base64!"), Err(KeyError::NotBase64));
        assert_eq!(key("short"), Err(KeyError::Length(5)));
        assert_eq!(key("whsec_c2hvcnQ="), Err(KeyError::Length(5)));
    }

    #[test]
    fn several_keys_give_space_separated_signatures() {
        let a = vec![1u8; 32];
        let b = vec![2u8; 32];
        let h = header(&[a.clone(), b.clone()], "msg_1", 5, b"{}");
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(
            parts,
            [sign(&a, "msg_1", 5, b"{}"), sign(&b, "msg_1", 5, b"{}")]
        );
    }
}
