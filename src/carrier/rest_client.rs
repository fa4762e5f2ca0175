//! Plumbing shared by the carriers' REST clients: one `reqwest` client with the 10 s
//! budget every carrier call gets, and the mapping of transport failures to [`CarrierError`]s
//! that say what to check.

use std::time::Duration;

use super::CarrierError;

/// Whole-request timeout for every carrier REST call.
pub(crate) const REST_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the HTTP client (installs the TLS provider first).
pub(crate) fn build_client(carrier: &'static str) -> Result<reqwest::Client, CarrierError> {
    crate::util::init_tls();
    reqwest::Client::builder()
        // No redirects: the carrier credentials travel in the Authorization header, and a
        // redirect is never part of a carrier's REST API.
        .redirect(reqwest::redirect::Policy::none())
        .timeout(REST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|source| CarrierError::Client { carrier, source })
}

/// Maps a failed send to a timeout (naming the API root `base`) or a network error naming
/// `url`; the transport error stays the source.
pub(crate) fn send_error(
    carrier: &'static str,
    base: &str,
    url: &str,
    e: reqwest::Error,
) -> CarrierError {
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
pub(crate) fn path_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%' | b'\\'))
}

#[cfg(test)]
mod redirect_tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A carrier REST client never follows a redirect (it would carry the credentials to
    /// wherever the `Location` points).
    #[tokio::test]
    async fn carrier_clients_do_not_follow_redirects() {
        let elsewhere = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = format!("http://{}/steal", elsewhere.local_addr().expect("addr"));
        let api = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let api_url = format!("http://{}/call", api.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = api.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n"
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        let (hit_tx, mut hit_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = elsewhere.accept().await {
                let _ = hit_tx.send(());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let client = super::build_client("test").expect("client");
        let resp = client
            .get(&api_url)
            .basic_auth("AC1", Some("secret"))
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status().as_u16(), 302);
        assert!(hit_rx.try_recv().is_err(), "the redirect was followed");
    }
}
