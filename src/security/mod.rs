//! Security primitives shared by every carrier and the control plane: phone-number masking for
//! logs, constant-time comparison, and (in submodules) webhook signature checks and per-call
//! media tokens, the per-call API tokens and the count of failed authentications per peer. Nothing here knows about sockets or call state.

pub(crate) mod auth_limit;
pub mod call_token;
pub mod link;
pub mod replay;
pub mod token;

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a peer-controlled field may be in a log line before authentication.
pub(crate) const LOG_FIELD_MAX: usize = 64;

/// A peer-controlled string for a log line: cut to `max` characters (with `…` when cut) and
/// with control characters escaped, so an unauthenticated peer can neither flood nor forge
/// log lines.
pub(crate) fn truncate_for_log(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// The process-wide limit for warnings unauthenticated peers trigger in carrier webhook
/// handlers (20 a second): `Some(suppressed)` when one may be logged now.
pub(crate) fn peer_warning_allowed() -> Option<u64> {
    static LIMIT: std::sync::LazyLock<LogLimiter> =
        std::sync::LazyLock::new(|| LogLimiter::new(20, Duration::from_secs(1)));
    LIMIT.allow()
}

/// Rate limit for warnings a peer can trigger before authentication: at most `per_window`
/// lines per window; the rest are counted and the count is reported with the next line let
/// through.
pub(crate) struct LogLimiter {
    per_window: u32,
    window: Duration,
    state: Mutex<(Instant, u32, u64)>,
}

impl LogLimiter {
    pub(crate) fn new(per_window: u32, window: Duration) -> Self {
        Self {
            per_window,
            window,
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// `Some(suppressed)` when a line may be logged now (with how many were suppressed since
    /// the last one), `None` when it must be dropped.
    pub(crate) fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    pub(crate) fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(st.0) >= self.window {
            st.0 = now;
            st.1 = 0;
        }
        if st.1 >= self.per_window {
            st.2 += 1;
            return None;
        }
        st.1 += 1;
        Some(std::mem::take(&mut st.2))
    }
}

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
    fn log_fields_are_cut_and_escaped() {
        assert_eq!(truncate_for_log("abc", 64), "abc");
        assert_eq!(truncate_for_log(&"x".repeat(10_000), 4), "xxxx…");
        assert_eq!(truncate_for_log("a\nb\u{1b}", 64), "a\\nb\\u{1b}");
        assert_eq!(truncate_for_log(&"€".repeat(70), 64).chars().count(), 65);
    }

    #[test]
    fn warnings_are_rate_limited() {
        let l = LogLimiter::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(l.allow_at(t0), Some(0));
        assert_eq!(l.allow_at(t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(l.allow_at(t0), None);
        }
        assert_eq!(l.allow_at(t0 + Duration::from_secs(2)), Some(1000));
    }

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
