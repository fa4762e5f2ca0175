//! Plivo webhook signatures, as plivo-python's `signature_v3` does them.
//! V3: HMAC-SHA256 (auth token) over the URL without query, then `?` + the query decoded and
//! sorted as `k=v&…`, then for POSTs with form fields `.` (if there was a query) + the sorted
//! fields as `keyvalue…`, then `.` + the nonce; the header may list several signatures
//! separated by commas and any one may match. All comparisons are constant-time.
//!
//! V2 (HMAC over the URL without its query + nonce) is refused for calls: it signs neither the
//! body nor the query, so one captured V2 signature would let anyone forge any call to that URL.
//! Plivo signs messaging webhooks with V2 only, so the message route alone takes it
//! ([`validate_v2`]), with the same single-use nonce. A V3
//! signature is single use: the daemon's replay guard remembers every nonce that verified for
//! [`NONCE_WINDOW`] (cluster-wide with a shared store), and a request carrying a nonce seen
//! before is a replay.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;

use crate::security::ct_eq;

fn split_query(url: &str) -> (&str, &str) {
    let url = url.split_once('#').map_or(url, |(u, _)| u);
    url.split_once('?').unwrap_or((url, ""))
}

fn sorted_pairs(params: &[(String, String)]) -> Vec<(&str, &str)> {
    let mut pairs: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.sort_unstable();
    pairs
}

/// The V3 string to sign (without the trailing `.nonce`), for `method` (`GET`/`POST`), the
/// full public `url` as requested and the POST form `params`.
pub fn string_to_sign_v3(method: &str, url: &str, params: &[(String, String)]) -> String {
    let (base, query) = split_query(url);
    let query: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let q = sorted_pairs(&query)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut s = base.to_string();
    if method.eq_ignore_ascii_case("POST") && !params.is_empty() {
        s.push('?');
        s.push_str(&q);
        if !q.is_empty() {
            s.push('.');
        }
        for (k, v) in sorted_pairs(params) {
            s.push_str(k);
            s.push_str(v);
        }
    } else if !q.is_empty() {
        s.push('?');
        s.push_str(&q);
    }
    s
}

fn mac_b64(key: &str, data: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes());
    STANDARD.encode(hmac::sign(&key, data.as_bytes()).as_ref())
}

/// The V3 signature Plivo would send.
pub fn compute_v3(
    auth_token: &str,
    method: &str,
    url: &str,
    params: &[(String, String)],
    nonce: &str,
) -> String {
    mac_b64(
        auth_token,
        &format!("{}.{nonce}", string_to_sign_v3(method, url, params)),
    )
}

fn any_matches(expected: &str, header: &str) -> bool {
    // Check every candidate so timing does not reveal which one matched.
    header
        .split(',')
        .map(|c| ct_eq(c.trim().as_bytes(), expected.as_bytes()))
        .fold(false, |a, b| a | b)
}

/// Validates a V3 header value (possibly a comma-separated list).
pub(crate) fn validate_v3(
    auth_token: &str,
    method: &str,
    url: &str,
    params: &[(String, String)],
    nonce: &str,
    header: &str,
) -> bool {
    if auth_token.is_empty() || nonce.is_empty() || header.trim().is_empty() {
        return false;
    }
    any_matches(&compute_v3(auth_token, method, url, params, nonce), header)
}

/// The V3 nonce header's name.
pub(crate) const NONCE_HEADER: &str = "X-Plivo-Signature-V3-Nonce";

/// Validates a request's V3 headers (`X-Plivo-Signature-V3` and `-Ma-V3`, joined) with the V3
/// nonce. A request signed only with V2 (or not at all) is refused. `header` looks a header
/// up by name (case-insensitively). The caller also checks the nonce is fresh
/// (`Host::first_seen`).
pub fn validate_request(
    auth_token: &str,
    method: &str,
    url: &str,
    params: &[(String, String)],
    header: impl Fn(&str) -> Option<String>,
) -> bool {
    let joined = |a: &str, b: &str| {
        [header(a), header(b)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(",")
    };
    let v3 = joined("X-Plivo-Signature-V3", "X-Plivo-Signature-Ma-V3");
    match header(NONCE_HEADER) {
        Some(nonce) if !v3.is_empty() => validate_v3(auth_token, method, url, params, &nonce, &v3),
        _ => false,
    }
}

/// The V2 nonce header's name (messaging webhooks).
pub(crate) const NONCE_V2_HEADER: &str = "X-Plivo-Signature-V2-Nonce";

/// The V2 signature of a request to `url` with `nonce`: HMAC-SHA256 (auth token) over the URL
/// without its query, then the nonce. What Plivo signs its messaging webhooks with (they carry
/// no V3 signature).
pub fn compute_v2(auth_token: &str, url: &str, nonce: &str) -> String {
    let (base, _) = split_query(url);
    mac_b64(auth_token, &format!("{base}{nonce}"))
}

/// Validates a messaging webhook's V2 headers (`X-Plivo-Signature-V2` and `-Ma-V2`, either
/// may match) with its V2 nonce. Only the message route accepts V2, and only with a fresh
/// nonce (`Host::first_seen`): V2 signs neither the body nor the query, so a signature is
/// worth one request, the one Plivo sent. `header` looks a header up by name.
pub(crate) fn validate_v2(
    auth_token: &str,
    url: &str,
    header: impl Fn(&str) -> Option<String>,
) -> bool {
    let signatures = [
        header("X-Plivo-Signature-V2"),
        header("X-Plivo-Signature-Ma-V2"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(",");
    match header(NONCE_V2_HEADER) {
        Some(nonce) if !auth_token.is_empty() && !nonce.is_empty() && !signatures.is_empty() => {
            any_matches(&compute_v2(auth_token, url, &nonce), &signatures)
        }
        _ => false,
    }
}

/// How long a verified V3 nonce is remembered: a replay inside this window is refused. Plivo's
/// nonce carries no timestamp, so the window is ours: a day covers any retry or capture that
/// is still worth replaying while the call it names can matter.
pub(crate) const NONCE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Longest nonce recorded; longer ones are refused (Plivo's are about 20 digits).
pub(crate) const NONCE_MAX_LEN: usize = crate::security::replay::MAX_KEY_LEN;

/// V3 nonces that already verified, in one process: the replay memory the daemon's replay
/// guard uses without a shared store (`Host::first_seen`).
pub type Nonces = crate::security::replay::SeenSet;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn p(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn strings_to_sign() {
        let f = string_to_sign_v3;
        assert_eq!(f("GET", "https://h/a", &[]), "https://h/a");
        assert_eq!(f("POST", "https://h/a?x=1", &[]), "https://h/a?x=1");
        assert_eq!(
            f("POST", "https://h/a?b=2&a=%2B1", &[p("Z", "1"), p("A", "")]),
            "https://h/a?a=+1&b=2.AZ1"
        );
        assert_eq!(f("POST", "https://h/a", &[p("B", "2")]), "https://h/a?B2");
        assert_eq!(f("GET", "https://h/a?t=b&t=a", &[]), "https://h/a?t=a&t=b");
    }

    #[test]
    fn multi_and_legacy() {
        let sig = compute_v3("tok", "POST", "https://h/a", &[p("A", "1")], "n1");
        let params = [p("A", "1")];
        assert!(validate_v3(
            "tok",
            "POST",
            "https://h/a",
            &params,
            "n1",
            &format!("x,{sig}")
        ));
        assert!(!validate_v3(
            "tok",
            "POST",
            "https://h/a",
            &params,
            "n2",
            &sig
        ));
        assert!(!validate_v3("", "POST", "https://h/a", &params, "n1", &sig));
        let v3 = compute_v3("tok", "POST", "https://h/a", &[], "n");
        let h = |name: &str| match name {
            "X-Plivo-Signature-V3" => Some(v3.clone()),
            "X-Plivo-Signature-V3-Nonce" => Some("n".to_string()),
            _ => None,
        };
        assert!(validate_request("tok", "POST", "https://h/a", &[], h));
        assert!(!validate_request("tok", "POST", "https://h/a", &[], |_| {
            None
        }));
    }

    /// A legacy V2 signature (URL without query + nonce) over the very URL is refused: it
    /// signs nothing a forger could not change.
    #[test]
    fn v2_is_refused() {
        let v2 = mac_b64("tok", "https://h/an");
        let h = |name: &str| match name {
            "X-Plivo-Signature-V2" => Some(v2.clone()),
            "X-Plivo-Signature-V2-Nonce" => Some("n".to_string()),
            _ => None,
        };
        assert!(!validate_request("tok", "POST", "https://h/a", &[], h));
        // A V3 nonce with only a V2 signature is no V3 request either.
        let h = |name: &str| match name {
            "X-Plivo-Signature-V2" => Some(v2.clone()),
            "X-Plivo-Signature-V3-Nonce" => Some("n".to_string()),
            _ => None,
        };
        assert!(!validate_request("tok", "POST", "https://h/a", &[], h));
    }

    /// The messaging webhook's V2: URL without query + nonce, either header, and nothing
    /// without the nonce.
    #[test]
    fn v2_for_messages() {
        let sig = compute_v2("tok", "https://h/plivo/message?x=1", "n1");
        assert_eq!(sig, mac_b64("tok", "https://h/plivo/messagen1"));
        let h = |name: &str| match name {
            "X-Plivo-Signature-Ma-V2" => Some(sig.clone()),
            "X-Plivo-Signature-V2-Nonce" => Some("n1".to_string()),
            _ => None,
        };
        assert!(validate_v2("tok", "https://h/plivo/message", h));
        assert!(!validate_v2("other", "https://h/plivo/message", h));
        assert!(!validate_v2("tok", "https://h/plivo/answer", h));
        let no_nonce = |name: &str| (name == "X-Plivo-Signature-V2").then(|| sig.clone());
        assert!(!validate_v2("tok", "https://h/plivo/message", no_nonce));
    }

    #[test]
    fn nonces_are_single_use_inside_the_window() {
        let n = Nonces::new(Duration::from_secs(60), 1000);
        let t0 = Instant::now();
        assert!(n.first_use_at("a", t0));
        assert!(!n.first_use_at("a", t0 + Duration::from_secs(59)), "replay");
        assert!(n.first_use_at("b", t0 + Duration::from_secs(30)));
        // After the window the old nonce is forgotten (and pruned).
        assert!(n.first_use_at("c", t0 + Duration::from_secs(61)));
        assert_eq!(n.len(), 2);
        assert!(!n.first_use_at("", t0), "empty nonce");
        assert!(!n.first_use_at(&"9".repeat(NONCE_MAX_LEN + 1), t0), "oversized nonce");
    }

    #[test]
    fn nonces_are_bounded() {
        let n = Nonces::new(Duration::from_secs(3600), 3);
        let t0 = Instant::now();
        for i in 0..10 {
            assert!(n.first_use_at(&format!("n{i}"), t0));
        }
        assert_eq!(n.len(), 3);
        assert!(!n.first_use_at("n9", t0), "the newest are kept");
    }
}
