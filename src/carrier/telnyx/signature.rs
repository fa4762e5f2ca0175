//! Telnyx webhook signatures: an Ed25519 signature, base64 in
//! `telnyx-signature-ed25519`, over `telnyx-timestamp + "|" + raw body`, checked with the
//! account's public key (base64 of the raw 32 bytes). Timestamps more than [`TOLERANCE_S`]
//! seconds from `now` are refused either way (replay protection); `now` is a parameter so tests
//! can pin the clock.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, UnparsedPublicKey};

/// Largest accepted distance between the webhook's timestamp and our clock, in seconds.
pub(crate) const TOLERANCE_S: u64 = 300;

/// Why a Telnyx webhook signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("telnyx-signature-ed25519 or telnyx-timestamp header is missing")]
    MissingHeader,
    #[error("telnyx-timestamp is not a Unix time in seconds")]
    BadTimestamp,
    #[error("webhook timestamp is {0} s away from our clock (more than 300 s)")]
    Stale(u64),
    #[error("public_key is not base64 of a 32-byte Ed25519 key; copy it from the Telnyx portal")]
    BadPublicKey,
    #[error("signature is not base64 of 64 bytes")]
    BadSignature,
    #[error("signature does not match the body and timestamp")]
    Mismatch,
}

/// Decodes a configured public key (base64 of the raw 32 bytes; base64url tolerated).
pub(crate) fn decode_public_key(public_key_b64: &str) -> Result<[u8; 32], SignatureError> {
    let s = public_key_b64.trim();
    let raw = STANDARD
        .decode(s)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(s))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s))
        .map_err(|_| SignatureError::BadPublicKey)?;
    raw.try_into().map_err(|_| SignatureError::BadPublicKey)
}

/// Verifies one webhook. `signature` and `timestamp` are the header values (`None` when
/// absent), `body` the raw bytes as received, `now` the current Unix time in seconds.
pub fn verify_webhook(
    public_key_b64: &str,
    signature: Option<&str>,
    timestamp: Option<&str>,
    body: &[u8],
    now: u64,
) -> Result<(), SignatureError> {
    let (Some(signature), Some(timestamp)) = (signature, timestamp) else {
        return Err(SignatureError::MissingHeader);
    };
    let timestamp = timestamp.trim();
    let ts: u64 = timestamp
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    let skew = now.abs_diff(ts);
    if skew > TOLERANCE_S {
        return Err(SignatureError::Stale(skew));
    }
    let key = decode_public_key(public_key_b64)?;
    let sig = STANDARD
        .decode(signature.trim())
        .map_err(|_| SignatureError::BadSignature)?;
    if sig.len() != 64 {
        return Err(SignatureError::BadSignature);
    }
    let mut msg = Vec::with_capacity(timestamp.len() + 1 + body.len());
    msg.extend_from_slice(timestamp.as_bytes());
    msg.push(b'|');
    msg.extend_from_slice(body);
    UnparsedPublicKey::new(&ED25519, key)
        .verify(&msg, &sig)
        .map_err(|_| SignatureError::Mismatch)
}
