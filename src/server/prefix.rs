//! The path prefix of this instance's `advertise_url` (`https://voice.example.com/i/patterd-0`
//! in Kubernetes, where an Ingress routes `/i/<pod>/…` to the pod): requests that arrive with
//! it — a carrier following a media URL or a per-call callback the answer named — are routed
//! as if it were not there, so the Ingress need not rewrite paths. Signatures are unaffected:
//! carriers sign the full URL, which `Host::signature_bases` rebuilds from `advertise_url`.

use hyper::Uri;

/// The path of `url` when it is more than `/` (no trailing slash), else `None`.
pub(crate) fn of(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    let path = parsed.path().trim_end_matches('/');
    (!path.is_empty()).then(|| path.to_string())
}

/// `uri` without `prefix` when its path is `prefix` followed by `/…`; `None` when it does not
/// start with it (the request is routed as it came).
pub(crate) fn strip(uri: &Uri, prefix: &str) -> Option<Uri> {
    let rest = uri.path().strip_prefix(prefix)?;
    if !rest.starts_with('/') {
        return None;
    }
    let path_and_query = match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_real_path_is_a_prefix() {
        assert_eq!(of("https://gw.example.com"), None);
        assert_eq!(of("https://gw.example.com/"), None);
        assert_eq!(
            of("https://gw.example.com/i/p-0/").as_deref(),
            Some("/i/p-0")
        );
        assert_eq!(of("not a url"), None);
    }

    #[test]
    fn the_prefix_goes_and_the_query_stays() {
        let uri: Uri = "/i/p-0/twilio/status?call=CA1&x=2".parse().unwrap();
        assert_eq!(
            strip(&uri, "/i/p-0").unwrap().to_string(),
            "/twilio/status?call=CA1&x=2"
        );
        let ws: Uri = "/i/p-0/telnyx/media/tok".parse().unwrap();
        assert_eq!(strip(&ws, "/i/p-0").unwrap().path(), "/telnyx/media/tok");
        // Another pod's prefix, a longer name and the bare prefix are left alone.
        for other in ["/i/p-1/twilio/status", "/i/p-01/twilio/status", "/i/p-0"] {
            assert!(
                strip(&other.parse().unwrap(), "/i/p-0").is_none(),
                "{other}"
            );
        }
    }
}
