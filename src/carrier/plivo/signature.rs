//! Plivo webhook signatures, as plivo-python's `signature_v3` does them.
//! V3: HMAC-SHA256 (auth token) over the URL without query, then `?` + the query decoded and
//! sorted as `k=v&…`, then for POSTs with form fields `.` (if there was a query) + the sorted
//! fields as `keyvalue…`, then `.` + the nonce; the header may list several signatures
//! separated by commas and any one may match. V2 (legacy): HMAC-SHA256 over the URL without
//! query + nonce. All comparisons are constant-time.

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

/// The V2 signature Plivo would send.
pub fn compute_v2(auth_token: &str, url: &str, nonce: &str) -> String {
    mac_b64(auth_token, &format!("{}{nonce}", split_query(url).0))
}

fn any_matches(expected: &str, header: &str) -> bool {
    // Check every candidate so timing does not reveal which one matched.
    header
        .split(',')
        .map(|c| ct_eq(c.trim().as_bytes(), expected.as_bytes()))
        .fold(false, |a, b| a | b)
}

/// Validates a V3 header value (possibly a comma-separated list).
pub fn validate_v3(
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

/// Validates a V2 header value.
pub fn validate_v2(auth_token: &str, url: &str, nonce: &str, header: &str) -> bool {
    if auth_token.is_empty() || nonce.is_empty() || header.trim().is_empty() {
        return false;
    }
    any_matches(&compute_v2(auth_token, url, nonce), header)
}

/// Validates a request the way Plivo's own gateway does: the V3 headers
/// (`X-Plivo-Signature-V3` and `-Ma-V3`, joined) with the V3 nonce first, then V2. `header`
/// looks a header up by name (case-insensitively).
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
    if let Some(nonce) = header("X-Plivo-Signature-V3-Nonce")
        && !v3.is_empty()
    {
        return validate_v3(auth_token, method, url, params, &nonce, &v3);
    }
    let v2 = joined("X-Plivo-Signature-V2", "X-Plivo-Signature-Ma-V2");
    match header("X-Plivo-Signature-V2-Nonce") {
        Some(nonce) if !v2.is_empty() => validate_v2(auth_token, url, &nonce, &v2),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let v2 = compute_v2("tok", "https://h/a?q=1", "n");
        assert!(validate_v2("tok", "https://h/a", "n", &v2));
        let h = |name: &str| match name {
            "X-Plivo-Signature-V2" => Some(v2.clone()),
            "X-Plivo-Signature-V2-Nonce" => Some("n".to_string()),
            _ => None,
        };
        assert!(validate_request("tok", "POST", "https://h/a", &[], h));
        assert!(!validate_request("tok", "POST", "https://h/a", &[], |_| {
            None
        }));
    }
}
