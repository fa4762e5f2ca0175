//! The client side of `/healthz` for `patterd healthcheck`: one plain HTTP/1.1 `GET /healthz`
//! over a blocking TCP socket with a deadline, so a container `HEALTHCHECK` (or any supervisor)
//! can probe the daemon without curl in the image and without starting an async runtime. It owns
//! only the probe: which address to ask (`target`) and what counts as healthy (status 200).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Why the probe failed; each message says what was tried.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0:?} is not an http:// URL with host:port (write e.g. http://127.0.0.1:8080)")]
    BadUrl(String),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot connect to {0}: {1} (is patterd running and listening there?)")]
    Connect(String, std::io::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0} answered something that is not HTTP: {1:?}")]
    NotHttp(String, String),
    #[error("{0} answered {1} (healthy is 200)")]
    Status(String, u16),
}

/// The base URL to probe for a daemon listening on `listen` (`server.listen`): a wildcard
/// address (`0.0.0.0`, `[::]`) is asked on its loopback twin.
pub fn target(listen: &str) -> String {
    let listen = listen.trim();
    let listen = if let Some(port) = listen.strip_prefix("0.0.0.0:") {
        format!("127.0.0.1:{port}")
    } else if let Some(port) = listen.strip_prefix("[::]:") {
        format!("[::1]:{port}")
    } else {
        listen.to_string()
    };
    format!("http://{listen}")
}

/// `GET {base}/healthz` within `timeout` (connect, write and read together). Ok when the answer
/// is `200`.
pub fn probe(base: &str, timeout: Duration) -> Result<(), ProbeError> {
    let authority = base
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| ProbeError::BadUrl(base.to_string()))?;
    let url = format!("http://{authority}/healthz");
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| ProbeError::Resolve(authority.to_string(), e))?
        .collect();
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, left()) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| ProbeError::Connect(url.clone(), last))?;
    let io = |e| ProbeError::Io(url.clone(), e);
    stream.set_write_timeout(Some(left())).map_err(io)?;
    stream
        .write_all(
            format!(
                "GET /healthz HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: patterd-healthcheck\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .map_err(io)?;
    // The status line is all we need; read until it is complete (or 1 KiB, or the deadline).
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 1024 {
        stream.set_read_timeout(Some(left())).map_err(io)?;
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let line = line.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let status = match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(v), Some(Ok(code))) if v.starts_with("HTTP/1.") => code,
        _ => return Err(ProbeError::NotHttp(url, line.chars().take(80).collect())),
    };
    if status == 200 {
        Ok(())
    } else {
        Err(ProbeError::Status(url, status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server on port 0 that reads the request and answers `reply`; returns its base
    /// URL and a handle yielding the request it read.
    fn serve_once(reply: &'static [u8]) -> (String, std::thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", l.local_addr().expect("addr"));
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(reply).expect("write");
            String::from_utf8_lossy(&req).into_owned()
        });
        (base, h)
    }

    #[test]
    fn healthy_on_200_and_asks_for_healthz() {
        let (base, h) = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n");
        probe(&base, Duration::from_secs(5)).expect("healthy");
        let req = h.join().expect("server");
        assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
        assert!(req.contains(&format!("Host: {}", &base[7..])), "{req}");
    }

    #[test]
    fn unhealthy_on_other_status_or_garbage() {
        let (base, h) = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n");
        let e = probe(&base, Duration::from_secs(5)).expect_err("503");
        assert!(matches!(e, ProbeError::Status(_, 503)), "{e}");
        h.join().expect("server");

        let (base, h) = serve_once(b"SSH-2.0-OpenSSH\r\n");
        let e = probe(&base, Duration::from_secs(5)).expect_err("not http");
        assert!(matches!(e, ProbeError::NotHttp(..)), "{e}");
        h.join().expect("server");
    }

    #[test]
    fn unhealthy_when_nothing_listens() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", l.local_addr().expect("addr"));
        drop(l);
        let e = probe(&base, Duration::from_secs(5)).expect_err("closed port");
        assert!(matches!(e, ProbeError::Connect(..)), "{e}");
        assert!(e.to_string().contains("is patterd running"), "{e}");
    }

    #[test]
    fn urls_and_targets() {
        assert_eq!(target("0.0.0.0:8080"), "http://127.0.0.1:8080");
        assert_eq!(target("[::]:9000"), "http://[::1]:9000");
        assert_eq!(target("10.0.0.5:80"), "http://10.0.0.5:80");
        for bad in [
            "https://127.0.0.1:1",
            "127.0.0.1:1",
            "http://",
            "http://h:1/x",
        ] {
            assert!(
                matches!(
                    probe(bad, Duration::from_secs(1)),
                    Err(ProbeError::BadUrl(_))
                ),
                "{bad}"
            );
        }
    }
}
