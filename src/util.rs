//! Small shared helpers that belong to no single module: a task guard that aborts a spawned
//! task when dropped (how provider streams are cancelled), and the process-wide TLS setup;
//! phone-number helpers in [`phone`], the never-printed [`secret::Secret`] and systemd's
//! notifications ([`sd_notify`]); [`create_private_dir`] for the directories that hold call
//! data; RFC 3339 timestamps in [`time`]; the W3C `traceparent` header in [`traceparent`]; the
//! one onnxruntime library of the process (`onnxruntime`, features `smart_turn` and `piper`).

#[cfg(any(feature = "smart_turn", feature = "piper"))]
pub mod onnxruntime;
pub mod phone;
pub(crate) mod sd_notify;
pub mod secret;
pub mod time;
pub mod traceparent;

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

/// Creates `dir` and its missing parents with mode 0700 (owner only): the data directory and
/// the recordings hold callers' numbers, transcripts and voices. An existing directory keeps
/// its mode (the operator chose it).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The host name (`/proc/sys/kernel/hostname`), or `patterd` when it cannot be read: an
/// instance's name when `[cluster] instance_name` is not set.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "patterd".into())
}

/// This process's instance id, random per start: `/healthz` sends it in
/// `X-Patterd-Instance` so `patterd doctor` can tell whether `public_url` reaches the daemon
/// on `server.listen` or another one; in a cluster it is the instance's incarnation.
pub(crate) fn instance_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        use ring::rand::{SecureRandom, SystemRandom};
        let mut b = [0u8; 8];
        // Only fails without an OS entropy source; the pid is then unique enough here.
        if SystemRandom::new().fill(&mut b).is_err() {
            b = u64::from(std::process::id()).to_le_bytes();
        }
        hex::encode(b)
    })
}

/// The program `name` names: a path with a `/` as it is (when it is a file), a bare name
/// through `PATH`; `None` when there is no such file.
pub fn find_program(name: &str) -> Option<std::path::PathBuf> {
    if name.contains('/') {
        let p = std::path::PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
