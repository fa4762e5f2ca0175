//! Small shared helpers that belong to no single module: a task guard that aborts a spawned
//! task when dropped (how provider streams are cancelled), and the process-wide TLS setup;
//! phone-number helpers in [`phone`], the never-printed [`secret::Secret`] and systemd's
//! notifications ([`sd_notify`]).

pub mod phone;
pub(crate) mod sd_notify;
pub mod secret;

use tokio::task::JoinHandle;

/// Owns a spawned task and aborts it when dropped. Provider streams hand one of these to the
/// call actor, so dropping the stream is enough to cancel the HTTP request or socket behind it.
#[derive(Debug)]
pub struct TaskGuard(Option<JoinHandle<()>>);

impl TaskGuard {
    pub fn new(handle: JoinHandle<()>) -> Self {
        Self(Some(handle))
    }

    /// A guard owning nothing (used by streams that are already finished).
    pub fn empty() -> Self {
        Self(None)
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// Installs rustls' `ring` crypto provider as the process default. Every TLS client in the
/// daemon (reqwest, the WebSocket client) relies on it; calling it more than once is harmless.
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
