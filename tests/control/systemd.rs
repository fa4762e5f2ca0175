//! systemd's notify protocol against the real binary: a fake `NOTIFY_SOCKET` (a unix datagram
//! socket in a temp dir) receives `READY=1` once the daemon serves, `WATCHDOG=1` at half of
//! `WATCHDOG_USEC`, `RELOADING=1` then `READY=1` around a SIGHUP reload, and `STOPPING=1`
//! when SIGTERM starts the drain.

use std::time::Duration;

use tokio::net::UnixDatagram;

use crate::common::daemon::{Daemon, Fakes};

async fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(20), sock.recv(&mut buf))
        .await
        .expect("a notification within 20 s")
        .expect("recv");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn notify_socket_receives_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    let fakes = Fakes::start(vec![]).await;
    let notify = path.to_string_lossy().into_owned();
    let mut daemon = Daemon::start_with_env(
        &fakes.config_text(),
        &[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "200000")],
    );
    assert_eq!(next(&sock).await, "READY=1");
    // READY comes after the listener is up: it answers now.
    patterd::util::init_tls();
    let health = reqwest::get(daemon.url("/healthz")).await.expect("healthz");
    assert_eq!(health.status(), 200);
    assert_eq!(next(&sock).await, "WATCHDOG=1");
    assert_eq!(next(&sock).await, "WATCHDOG=1");
    // A reload (SIGHUP) is bracketed by RELOADING=1 and READY=1.
    daemon.signal(libc::SIGHUP);
    let mut msg = next(&sock).await;
    while msg == "WATCHDOG=1" {
        msg = next(&sock).await;
    }
    assert!(msg.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{msg}");
    let mut msg = next(&sock).await;
    while msg == "WATCHDOG=1" {
        msg = next(&sock).await;
    }
    assert_eq!(msg, "READY=1");
    daemon.signal(libc::SIGTERM);
    // Watchdog pings may still be in flight; STOPPING must follow.
    let mut msg = next(&sock).await;
    while msg == "WATCHDOG=1" {
        msg = next(&sock).await;
    }
    assert_eq!(msg, "STOPPING=1");
    let code = tokio::task::spawn_blocking(move || daemon.wait_exit(Duration::from_secs(20)))
        .await
        .expect("join");
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn a_watchdog_for_another_pid_sends_no_pings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    let fakes = Fakes::start(vec![]).await;
    let notify = path.to_string_lossy().into_owned();
    // WATCHDOG_PID names another process: READY is sent, watchdog pings are not (when they
    // are, the first follows READY at once: the interval's first tick is immediate).
    let mut daemon = Daemon::start_with_env(
        &fakes.config_text(),
        &[
            ("NOTIFY_SOCKET", &notify),
            ("WATCHDOG_USEC", "100000"),
            ("WATCHDOG_PID", "1"),
        ],
    );
    assert_eq!(next(&sock).await, "READY=1");
    daemon.signal(libc::SIGTERM);
    assert_eq!(next(&sock).await, "STOPPING=1");
    let code = tokio::task::spawn_blocking(move || daemon.wait_exit(Duration::from_secs(20)))
        .await
        .expect("join");
    assert_eq!(code, Some(0));
}
