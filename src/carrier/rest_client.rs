//! Plumbing shared by the carriers' REST clients: one `reqwest` client with the 10 s
//! budget every carrier call gets, and the mapping of transport failures to [`CarrierError`]s
//! that say what to check.

use std::time::Duration;

use super::CarrierError;

/// Whole-request timeout for every carrier REST call.
pub const REST_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the HTTP client (installs the TLS provider first).
pub fn build_client(carrier: &'static str) -> Result<reqwest::Client, CarrierError> {
    crate::util::init_tls();
    reqwest::Client::builder()
        .timeout(REST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|source| CarrierError::Client { carrier, source })
}

/// Maps a failed send to a timeout (naming the API root `base`) or a network error naming
/// `url`; the transport error stays the source.
pub fn send_error(carrier: &'static str, base: &str, url: &str, e: reqwest::Error) -> CarrierError {
    if e.is_timeout() {
        return CarrierError::Timeout {
            carrier,
            seconds: REST_TIMEOUT.as_secs(),
            url: base.to_string(),
            source: e,
        };
    }
    CarrierError::Network {
        carrier,
        url: url.to_string(),
        source: e,
    }
}

/// True for ids that are safe to put raw into a URL path segment: printable ASCII without
/// `/ ? # %` or whitespace (Telnyx ids contain `:`, which is fine).
pub fn path_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%' | b'\\'))
}
