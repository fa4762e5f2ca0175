//! systemd's notification protocol (`sd_notify(3)`), the little of it patterd needs: one
//! datagram per message to the unix socket named by `NOTIFY_SOCKET` (a path, or `@name` in the
//! abstract namespace), and the watchdog interval from `WATCHDOG_USEC` (for this process when
//! `WATCHDOG_PID` names it). Without `NOTIFY_SOCKET` (not under systemd, or `Type=` other than
//! `notify`) every call is a no-op.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// A message to systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notify {
    /// The listener is up: startup is complete.
    Ready,
    /// Still alive (sent from the async runtime at half the watchdog interval).
    Watchdog,
    /// Re-reading the configuration (followed by `Ready` and a fresh monotonic time).
    Reloading,
    /// Draining before exit.
    Stopping,
}

impl Notify {
    /// The datagram's text.
    pub(crate) fn message(self) -> String {
        match self {
            Notify::Ready => "READY=1".into(),
            Notify::Watchdog => "WATCHDOG=1".into(),
            Notify::Reloading => format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()),
            Notify::Stopping => "STOPPING=1".into(),
        }
    }
}

/// The time since boot in microseconds, for `MONOTONIC_USEC` beside `RELOADING=1`.
///
/// systemd wants CLOCK_MONOTONIC; std exposes it only opaquely (`Instant`) and the daemon has
/// no `unsafe` for `clock_gettime`, so this reads `/proc/uptime` (CLOCK_BOOTTIME). The two
/// differ only by time spent suspended, and BOOTTIME is never earlier, so systemd never takes
/// the notification for one from before the reload it requested.
fn monotonic_usec() -> u64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(0, |secs| (secs * 1_000_000.0) as u64)
}

/// Sends `msg` to `NOTIFY_SOCKET`; `Ok(false)` when there is none.
pub(crate) fn notify(msg: Notify) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let sock = UnixDatagram::unbound()?;
    let text = msg.message();
    if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(text.as_bytes(), &addr)?;
    } else {
        sock.send_to(text.as_bytes(), &path)?;
    }
    Ok(true)
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set for this process.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.trim().parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_sd_notify() {
        assert_eq!(Notify::Ready.message(), "READY=1");
        assert_eq!(Notify::Watchdog.message(), "WATCHDOG=1");
        assert_eq!(Notify::Stopping.message(), "STOPPING=1");
        assert!(
            Notify::Reloading
                .message()
                .starts_with("RELOADING=1\nMONOTONIC_USEC=")
        );
    }
}
