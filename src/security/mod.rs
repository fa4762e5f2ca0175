//! Security primitives shared by every carrier and the control plane: phone-number masking for
//! logs, constant-time comparison, and (in submodules) webhook signature checks and per-call
//! media tokens. Nothing here knows about sockets or call state.

pub mod token;

/// Masks a phone number for logs: keeps a leading `+`, the first four characters after it and
/// the last four digits, e.g. `+15550001234` → `+1555***1234`. Short or odd inputs are masked
/// entirely except their last four characters, so a number never reaches a log whole.
pub fn mask_number(number: &str) -> String {
    let chars: Vec<char> = number.chars().collect();
    let (plus, rest) = match chars.first() {
        Some('+') => ("+", &chars[1..]),
        _ => ("", &chars[..]),
    };
    if rest.len() <= 4 {
        return format!("{plus}***");
    }
    let last4: String = rest[rest.len() - 4..].iter().collect();
    if rest.len() >= 10 {
        let head: String = rest[..4].iter().collect();
        format!("{plus}{head}***{last4}")
    } else {
        format!("{plus}***{last4}")
    }
}

/// Compares two byte strings in constant time (for signatures and tokens). Both sides are
/// hashed first (SHA-256) and the digests compared with no early exit, so neither the position
/// of the first difference nor the length of the secret side shows in the timing: an early
/// `len() !=` return would tell an attacker how long a token is.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let da = ring::digest::digest(&ring::digest::SHA256, a);
    let db = ring::digest::digest(&ring::digest::SHA256, b);
    let same = da
        .as_ref()
        .iter()
        .zip(db.as_ref())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    same == 0 && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_e164_to_last_four() {
        assert_eq!(mask_number("+15550001234"), "+1555***1234");
        assert_eq!(mask_number("+447700900123"), "+4477***0123");
    }

    #[test]
    fn masks_short_and_odd_inputs() {
        assert_eq!(mask_number("5551234"), "***1234");
        assert_eq!(mask_number("123"), "***");
        assert_eq!(mask_number(""), "***");
        assert_eq!(mask_number("client:alice"), "clie***lice");
        assert!(!mask_number("+15550001234").contains("0001"));
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"", b"a"));
        assert!(ct_eq(b"", b""));
        let long = vec![7u8; 10_000];
        assert!(ct_eq(&long, &long.clone()));
    }
}
