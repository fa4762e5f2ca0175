//! A WebSocket client on fastwebsockets + hyper's HTTP/1 upgrade, over plain TCP (`ws://`) or
//! rustls with the Mozilla root store (`wss://`). Used to reach Deepgram and by the carrier
//! simulators to open media streams.

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::WebSocket;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An open client WebSocket.
pub type ClientSocket = WebSocket<TokioIo<Upgraded>>;

/// Why a WebSocket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum WsConnectError {
    #[error("invalid WebSocket URL `{0}`: {1}")]
    BadUrl(String, String),
    #[error("could not connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS handshake with {0} failed: {1}")]
    Tls(String, std::io::Error),
    /// The server answered the upgrade with another HTTP status (401, 429, 503, ...).
    #[error("WebSocket handshake with {host} failed: Invalid status code: {status}")]
    Refused { host: String, status: u16 },
    #[error("WebSocket handshake with {host} failed: {message}")]
    Handshake { host: String, message: String },
    #[error("timed out after {0:?} opening {1}")]
    Timeout(Duration, String),
}

impl WsConnectError {
    /// The HTTP status of a refused upgrade; `None` when the server was not reached or
    /// answered something other than a status.
    pub fn status(&self) -> Option<u16> {
        match self {
            WsConnectError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

struct SpawnExecutor;

impl<F> hyper::rt::Executor<F> for SpawnExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(fut);
    }
}

/// Opens `url` (`ws://` or `wss://`; `http(s)://` are accepted and mapped), sending the extra
/// request `headers`, within `timeout`. Returns the socket and the handshake response headers.
pub async fn connect(
    url: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<(ClientSocket, hyper::HeaderMap), WsConnectError> {
    match tokio::time::timeout(timeout, connect_inner(url, headers)).await {
        Ok(r) => r,
        Err(_) => Err(WsConnectError::Timeout(timeout, url.to_string())),
    }
}

async fn connect_inner(
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(ClientSocket, hyper::HeaderMap), WsConnectError> {
    let parsed =
        url::Url::parse(url).map_err(|e| WsConnectError::BadUrl(url.into(), e.to_string()))?;
    let tls = match parsed.scheme() {
        "ws" | "http" => false,
        "wss" | "https" => true,
        s => {
            return Err(WsConnectError::BadUrl(
                url.into(),
                format!("scheme `{s}` is not ws, wss, http or https"),
            ));
        }
    };
    let host = parsed
        .host_str()
        .ok_or_else(|| WsConnectError::BadUrl(url.into(), "no host".into()))?
        .to_string();
    let port = parsed
        .port_or_known_default()
        .unwrap_or(if tls { 443 } else { 80 });
    let mut path = parsed.path().to_string();
    if let Some(q) = parsed.query() {
        path.push('?');
        path.push_str(q);
    }
    let host_header = match parsed.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    let connect_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = TcpStream::connect((connect_host.as_str(), port))
        .await
        .map_err(|e| WsConnectError::Connect(host_header.clone(), e))?;
    let _ = tcp.set_nodelay(true);

    let mut req = hyper::Request::builder()
        .method("GET")
        .uri(path)
        .header("Host", &host_header)
        .header("Upgrade", "websocket")
        .header("Connection", "upgrade")
        .header(
            "Sec-WebSocket-Key",
            fastwebsockets::handshake::generate_key(),
        )
        .header("Sec-WebSocket-Version", "13");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| WsConnectError::BadUrl(url.into(), e.to_string()))?;

    let hs = |e: fastwebsockets::WebSocketError| match e {
        fastwebsockets::WebSocketError::InvalidStatusCode(status) => WsConnectError::Refused {
            host: host_header.clone(),
            status,
        },
        e => WsConnectError::Handshake {
            host: host_header.clone(),
            message: e.to_string(),
        },
    };
    let (ws, resp) = if tls {
        let connector = tokio_rustls::TlsConnector::from(tls_config());
        let name = rustls::pki_types::ServerName::try_from(connect_host.clone())
            .map_err(|e| WsConnectError::BadUrl(url.into(), e.to_string()))?;
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|e| WsConnectError::Tls(host_header.clone(), e))?;
        fastwebsockets::handshake::client(&SpawnExecutor, req, stream)
            .await
            .map_err(hs)?
    } else {
        fastwebsockets::handshake::client(&SpawnExecutor, req, tcp)
            .await
            .map_err(hs)?
    };
    Ok((ws, owned_headers(resp.headers())))
}

/// The TLS client configuration every connection shares: the root store is built once per
/// process (a copy per connection would stay alive, tens of KiB, for each call's socket).
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::util::init_tls();
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            Arc::new(
                rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            )
        })
        .clone()
}

/// A copy of the handshake response's headers. hyper's header values are views of the
/// connection's read buffer (8 KiB): a caller keeping them (Deepgram keeps its request id's
/// headers for the session) would keep that buffer alive for the socket's whole life.
fn owned_headers(headers: &http::HeaderMap) -> http::HeaderMap {
    headers
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), http::HeaderValue::from_bytes(v.as_bytes()).ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_refused_upgrade_keeps_its_status_as_a_number() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 2048];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                .await;
        });
        let url = format!("ws://{addr}/x");
        let Err(e) = connect(&url, &[], Duration::from_secs(5)).await else {
            panic!("the upgrade was refused");
        };
        assert_eq!(e.status(), Some(401), "{e}");
        assert_eq!(
            e.to_string(),
            format!("WebSocket handshake with {addr} failed: Invalid status code: 401")
        );
        let e = WsConnectError::Timeout(Duration::from_secs(1), url);
        assert_eq!(e.status(), None);
    }
}
