//! `X-Twilio-Signature` validation, as twilio-python's `RequestValidator` does it:
//! HMAC over the full URL plus the sorted form parameters, accepted with or without the
//! scheme's default port, the `bodySHA256` variant for JSON bodies, and the shared-key
//! HMAC-SHA256 variant announced by `X-Twilio-Webhooks-Signature-Settings`. All comparisons are
//! constant-time.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::{digest, hmac};

use crate::security::ct_eq;

/// Which MAC Twilio used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureAlgorithm {
    /// Classic: HMAC-SHA1 keyed with the account auth token.
    HmacSha1,
    /// Webhook rules: HMAC-SHA256 keyed with a SharedKey secret.
    HmacSha256,
}

impl SignatureAlgorithm {
    /// Reads `X-Twilio-Webhooks-Signature-Settings` (`key=KS...,algorithm=HMAC_SHA256`).
    /// Absent header → SHA-1; an unknown or missing algorithm → `None` (reject the request).
    pub(crate) fn from_settings_header(header: Option<&str>) -> Option<Self> {
        let Some(header) = header else {
            return Some(Self::HmacSha1);
        };
        let algo = header.split(',').find_map(|part| {
            let (k, v) = part.split_once('=')?;
            (k.trim().eq_ignore_ascii_case("algorithm")).then(|| v.trim())
        })?;
        match algo {
            "HMAC_SHA256" => Some(Self::HmacSha256),
            "HMAC_SHA1" => Some(Self::HmacSha1),
            _ => None,
        }
    }
}

/// The string Twilio signs: the URL, then for each distinct parameter name in byte order its
/// name and value, once per distinct value (values sorted), exactly as the SDK does.
pub fn string_to_sign(url: &str, params: &[(String, String)]) -> String {
    let mut pairs: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut s = String::with_capacity(
        url.len() + pairs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
    );
    s.push_str(url);
    for (k, v) in pairs {
        s.push_str(k);
        s.push_str(v);
    }
    s
}

fn mac(key: &str, data: &[u8], algorithm: SignatureAlgorithm) -> Vec<u8> {
    let algo = match algorithm {
        SignatureAlgorithm::HmacSha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        SignatureAlgorithm::HmacSha256 => hmac::HMAC_SHA256,
    };
    let key = hmac::Key::new(algo, key.as_bytes());
    hmac::sign(&key, data).as_ref().to_vec()
}

/// Computes the base64 signature Twilio would send for `url` + `params`.
pub fn compute_signature(
    key: &str,
    url: &str,
    params: &[(String, String)],
    algorithm: SignatureAlgorithm,
) -> String {
    STANDARD.encode(mac(key, string_to_sign(url, params).as_bytes(), algorithm))
}

/// Splits `scheme://authority/rest` into its three parts.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some((scheme, &rest[..end], &rest[end..]))
}

/// Host part and explicit port of an authority (`host`, `host:8443`, `[::1]:80`).
fn split_port(authority: &str) -> (&str, Option<&str>) {
    let host_start = authority.rfind('@').map_or(0, |i| i + 1);
    let hostport = &authority[host_start..];
    let colon = if hostport.starts_with('[') {
        hostport
            .find(']')
            .and_then(|i| hostport[i..].find(':').map(|j| i + j))
    } else {
        hostport.rfind(':')
    };
    match colon {
        Some(i) => (
            &authority[..host_start + i],
            Some(&hostport[i + 1..]).filter(|p| !p.is_empty()),
        ),
        None => (authority, None),
    }
}

/// The two URL forms the SDK accepts: with the default port added when none is present
/// (`:443` for https, `:80` for anything else) and with any port removed.
fn url_variants(url: &str) -> [String; 2] {
    let Some((scheme, authority, rest)) = split_url(url) else {
        return [url.to_string(), url.to_string()];
    };
    let (host, port) = split_port(authority);
    let with_port = match port {
        Some(_) => url.to_string(),
        None => {
            let default = if scheme.eq_ignore_ascii_case("https") {
                443
            } else {
                80
            };
            format!("{scheme}://{host}:{default}{rest}")
        }
    };
    let without_port = format!("{scheme}://{host}{rest}");
    [with_port, without_port]
}

fn signature_matches(
    key: &str,
    url: &str,
    params: &[(String, String)],
    header_sig: &str,
    algorithm: SignatureAlgorithm,
) -> bool {
    let header = header_sig.trim().as_bytes();
    // Evaluate both variants unconditionally so timing does not reveal which one matched.
    let results = url_variants(url).map(|u| {
        let expected = compute_signature(key, &u, params, algorithm);
        ct_eq(expected.as_bytes(), header)
    });
    results[0] | results[1]
}

/// The algorithm a webhook is signed with, if the settings header names one we know and there
/// is both a key and a signature to check (otherwise the webhook is refused).
fn checkable(
    key: &str,
    header_sig: &str,
    settings_header: Option<&str>,
) -> Option<SignatureAlgorithm> {
    let algorithm = SignatureAlgorithm::from_settings_header(settings_header)?;
    (!key.is_empty() && !header_sig.is_empty()).then_some(algorithm)
}

/// Validates a form-encoded (or GET) webhook. `url` is the public URL Twilio requested (see
/// [`super::public_request_url`]), `params` every form field as received (empty for GET),
/// `header_sig` the `X-Twilio-Signature` value and `settings_header` the
/// `X-Twilio-Webhooks-Signature-Settings` value if present. `key` is the auth token, or the
/// SharedKey secret when the settings header selects HMAC-SHA256.
pub fn validate_signature(
    key: &str,
    url: &str,
    params: &[(String, String)],
    header_sig: &str,
    settings_header: Option<&str>,
) -> bool {
    let Some(algorithm) = checkable(key, header_sig, settings_header) else {
        return false;
    };
    signature_matches(key, url, params, header_sig, algorithm)
}

/// Validates a JSON-body webhook: the URL must carry `bodySHA256=<hex sha256 of body>`, the
/// body must hash to it, and the signature covers the URL alone. A JSON body without
/// `bodySHA256` is rejected (nothing would protect it).
pub fn validate_signature_json(
    key: &str,
    url: &str,
    body: &[u8],
    header_sig: &str,
    settings_header: Option<&str>,
) -> bool {
    let Some(algorithm) = checkable(key, header_sig, settings_header) else {
        return false;
    };
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    let Some(claimed) = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "bodySHA256")
        .map(|(_, v)| v.into_owned())
    else {
        return false;
    };
    let actual = hex::encode(digest::digest(&digest::SHA256, body));
    let body_ok = ct_eq(actual.as_bytes(), claimed.to_ascii_lowercase().as_bytes());
    let sig_ok = signature_matches(key, url, &[], header_sig, algorithm);
    body_ok & sig_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn sdk_fixture() {
        let params = [
            p("CallSid", "CA1234567890ABCDE"),
            p("Caller", "+14158675309"),
            p("Digits", "1234"),
            p("From", "+14158675309"),
            p("To", "+18005551212"),
        ];
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        assert_eq!(
            compute_signature("12345", url, &params, SignatureAlgorithm::HmacSha1),
            "RSOYDt4T1cUTdK1PDd93/VVr8B8="
        );
        assert!(validate_signature(
            "12345",
            url,
            &params,
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            None
        ));
        assert!(!validate_signature("12345", url, &params, "", None));
    }

    #[test]
    fn sorting_is_byte_order_and_dedups() {
        let s = string_to_sign(
            "u",
            &[
                p("a", "1"),
                p("To", "x"),
                p("ToCountry", "US"),
                p("a", "0"),
                p("a", "1"),
            ],
        );
        assert_eq!(s, "uToxToCountryUSa0a1");
    }

    #[test]
    fn url_variants_follow_sdk() {
        assert_eq!(
            url_variants("https://h.example/x?y=1"),
            [
                "https://h.example:443/x?y=1".to_string(),
                "https://h.example/x?y=1".to_string()
            ]
        );
        assert_eq!(
            url_variants("http://h:8080/x"),
            ["http://h:8080/x".to_string(), "http://h/x".to_string()]
        );
        assert_eq!(
            url_variants("wss://h/m"),
            ["wss://h:80/m".to_string(), "wss://h/m".to_string()]
        );
        assert_eq!(url_variants("https://[::1]:443/")[1], "https://[::1]/");
        assert_eq!(url_variants("garbage")[0], "garbage");
    }

    #[test]
    fn settings_header() {
        use SignatureAlgorithm::*;
        assert_eq!(
            SignatureAlgorithm::from_settings_header(None),
            Some(HmacSha1)
        );
        assert_eq!(
            SignatureAlgorithm::from_settings_header(Some("key=KS1,algorithm=HMAC_SHA256")),
            Some(HmacSha256)
        );
        assert_eq!(
            SignatureAlgorithm::from_settings_header(Some("key=KS1,algorithm=MD5")),
            None
        );
        assert_eq!(
            SignatureAlgorithm::from_settings_header(Some("key=KS1")),
            None
        );
    }
}
