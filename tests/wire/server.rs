//! The HTTP server's limits and edges: TLS, body size, slow clients, unknown routes,
//! unconfigured carriers.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server on port 0 with its own data directory (kept as long as the returned guard).
async fn start(extra: &str) -> (patterd::server::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_timeout_s = 1\nmax_body_bytes = 1024\n\
         data_dir = {:?}\n{extra}",
        dir.path()
    );
    let loaded = patterd::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
    (
        patterd::server::bind(loaded.config).await.expect("bind"),
        dir,
    )
}

#[tokio::test]
async fn unknown_routes_methods_and_unconfigured_carriers() {
    patterd::util::init_tls();
    let (s, _dir) = start("").await;
    let base = format!("http://{}", s.local_addr);
    let c = reqwest::Client::new();
    assert_eq!(
        c.get(format!("{base}/nope")).send().await.unwrap().status(),
        404
    );
    assert_eq!(
        c.post(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        405
    );
    // No Twilio account configured: its routes answer 503 and say what to set.
    let r = c
        .post(format!("{base}/twilio/voice"))
        .body("a=b")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("auth_token"));
    assert_eq!(
        c.get(format!("{base}/twilio/media"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
}

#[tokio::test]
async fn oversized_webhook_bodies_are_refused() {
    patterd::util::init_tls();
    let (s, _dir) =
        start("[carriers.twilio]\nkind = \"twilio\"\naccount_sid = \"AC1\"\nauth_token = \"t\"\n")
            .await;
    let base = format!("http://{}", s.local_addr);
    let r = reqwest::Client::new()
        .post(format!("{base}/twilio/voice"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("x=".to_string() + &"a".repeat(4096))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    let (s, _dir) = start("").await;
    let mut sock = tokio::net::TcpStream::connect(s.local_addr).await.unwrap();
    // Half a request line, then nothing: the server must hang up after header_timeout_s.
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut buf))
        .await
        .expect("server closed the slow connection")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(!text.contains("200 OK"), "{text}");
}

#[tokio::test]
async fn serves_tls_when_configured() {
    patterd::util::init_tls();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let (s, _data) = start(&format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert_path.display(),
        key_path.display()
    ))
    .await;
    let root = reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([root])
        .resolve("localhost", s.local_addr)
        .build()
        .unwrap();
    let r = client
        .get(format!("https://localhost:{}/healthz", s.local_addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Plain HTTP on the TLS port does not get an answer.
    let plain = reqwest::get(format!("http://{}/healthz", s.local_addr)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}

#[tokio::test]
async fn bad_tls_files_are_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[server.tls]\ncert = \"{0}/missing.pem\"\nkey = \"{0}/missing.key\"\n",
        dir.path().display()
    );
    let loaded = patterd::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
    let err = patterd::server::bind(loaded.config)
        .await
        .err()
        .expect("must fail");
    let msg = err.to_string();
    assert!(msg.contains("missing.pem"), "{msg}");
}
