//! Failed authentications per peer: a fixed-window count per client address ([`AuthFailures`],
//! keyed by [`peer_key`]) that says when a peer has used up its tries and for how long. The
//! control API (`api::auth`) counts its 401s here and answers 429 while a peer is blocked.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::HeaderMap;

/// Failed authentications a peer may have in [`AUTH_FAILURE_WINDOW`] before it gets 429.
pub(crate) const AUTH_FAILURES_PER_WINDOW: u32 = 20;
/// The window of [`AUTH_FAILURES_PER_WINDOW`].
pub(crate) const AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Peers tracked at most (past it, expired entries go, then all: memory stays bounded).
const MAX_TRACKED_PEERS: usize = 10_000;

/// Who failed, for [`AuthFailures`]: an IPv4 address, or an IPv6 address's /64 (one host
/// usually holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey(u128);

/// The peer a request counts against: its address — or, when the peer is a loopback address
/// (a reverse proxy on this machine), the last `X-Forwarded-For` entry, the one the proxy
/// added — so one client behind the proxy cannot lock out the others.
pub(crate) fn peer_key(peer: SocketAddr, headers: &HeaderMap) -> PeerKey {
    let forwarded = || {
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .next_back()
            .and_then(|ip| ip.trim().parse::<IpAddr>().ok())
    };
    let ip = match peer.ip() {
        ip if ip.is_loopback() => forwarded().unwrap_or(ip),
        ip => ip,
    };
    PeerKey(match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => (u128::from(v6) & !u128::from(u64::MAX)) | 1 << 32,
    })
}

/// Failed authentications per peer in a fixed window: [`Self::blocked`] says when a peer is
/// over the limit and for how long.
pub(crate) struct AuthFailures {
    per_window: u32,
    window: Duration,
    state: Mutex<HashMap<PeerKey, (Instant, u32)>>,
}

impl Default for AuthFailures {
    fn default() -> Self {
        Self::new(AUTH_FAILURES_PER_WINDOW, AUTH_FAILURE_WINDOW)
    }
}

impl AuthFailures {
    pub(crate) fn new(per_window: u32, window: Duration) -> Self {
        Self {
            per_window,
            window,
            state: Mutex::new(HashMap::new()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<PeerKey, (Instant, u32)>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `peer` must wait when it has used up its failures, `None` when it may try.
    pub(crate) fn blocked(&self, peer: PeerKey, now: Instant) -> Option<Duration> {
        let st = self.state();
        let &(since, n) = st.get(&peer)?;
        let left = (since + self.window).checked_duration_since(now)?;
        (n >= self.per_window && !left.is_zero()).then_some(left)
    }

    /// Counts one failed authentication of `peer`.
    pub(crate) fn failed(&self, peer: PeerKey, now: Instant) {
        let mut st = self.state();
        if st.len() >= MAX_TRACKED_PEERS && !st.contains_key(&peer) {
            let window = self.window;
            st.retain(|_, (since, _)| now.duration_since(*since) < window);
            if st.len() >= MAX_TRACKED_PEERS {
                st.clear();
            }
        }
        let e = st.entry(peer).or_insert((now, 0));
        if now.duration_since(e.0) >= self.window {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        h
    }

    /// Past the limit a peer is blocked for the rest of the window; other peers are not, and a
    /// new window starts afresh.
    #[test]
    fn failures_are_limited_per_peer() {
        let l = AuthFailures::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        let none = HeaderMap::new();
        let a = peer_key("203.0.113.9:1000".parse().expect("peer"), &none);
        let b = peer_key("198.51.100.7:1000".parse().expect("peer"), &none);
        for _ in 0..3 {
            assert_eq!(l.blocked(a, t0), None);
            l.failed(a, t0);
        }
        let wait = l.blocked(a, t0 + Duration::from_secs(10)).expect("blocked");
        assert_eq!(wait, Duration::from_secs(50));
        assert_eq!(l.blocked(b, t0), None, "another peer is not blocked");
        assert_eq!(
            l.blocked(a, t0 + Duration::from_secs(60)),
            None,
            "a new window"
        );
        // One IPv6 /64 is one peer; a loopback peer counts as the proxy's forwarded client.
        let v6 = |s: &str| peer_key(s.parse().expect("peer"), &none);
        assert_eq!(v6("[2001:db8::1]:1"), v6("[2001:db8::ffff]:2"));
        assert_ne!(v6("[2001:db8::1]:1"), v6("[2001:db8:0:1::1]:1"));
        let proxied = |xff: &str| {
            peer_key(
                "127.0.0.1:1".parse().expect("peer"),
                &headers(&[("x-forwarded-for", xff)]),
            )
        };
        assert_eq!(proxied("1.1.1.1, 203.0.113.9"), a);
        assert_ne!(proxied("203.0.113.9, 198.51.100.7"), a);
    }
}
