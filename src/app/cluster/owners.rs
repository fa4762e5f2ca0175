//! The owners this instance has recently forwarded to, by call id. A call's owner never
//! changes for the call's life (the instance that admitted it runs it to the end), so once
//! `store::postgres::owner::owner_of` has named a live peer, the forwards that follow skip the
//! database and go straight to it (`api::forward`). What can change is whether that peer still
//! runs, and forwarding learns that from the hop itself: an entry is dropped when the peer
//! cannot be reached or answers that the call is not live there, and the next request asks
//! the database again. Entries also expire (`TTL`), so a long-finished call's owner is not
//! kept, and the map is bounded (`CAPACITY`): when full, expired entries go first, then all.
//!
//! Only fresh live peers are kept; a peer whose lease lapsed, an ended, lost or unknown call is
//! always looked up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::postgres::owner::PeerRef;

/// How long a remembered owner is trusted without a database lookup.
const TTL: Duration = Duration::from_secs(30);
/// How many calls' owners are remembered at most.
const CAPACITY: usize = 8192;

/// Call id → its owner (a peer) and when that was looked up.
#[derive(Default)]
pub(crate) struct OwnerCache {
    entries: Mutex<HashMap<String, (PeerRef, Instant)>>,
}

impl OwnerCache {
    /// The owner remembered for `call_id`, when still within its time.
    pub(crate) fn get(&self, call_id: &str) -> Option<PeerRef> {
        self.get_at(call_id, Instant::now())
    }

    /// Remembers that `peer` runs `call_id`.
    pub(crate) fn put(&self, call_id: &str, peer: &PeerRef) {
        self.put_at(call_id, peer, Instant::now());
    }

    /// Forgets `call_id`'s owner (it did not answer, or the call is no longer live there).
    pub(crate) fn forget(&self, call_id: &str) {
        self.lock().remove(call_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (PeerRef, Instant)>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get_at(&self, call_id: &str, now: Instant) -> Option<PeerRef> {
        let mut map = self.lock();
        match map.get(call_id) {
            Some((peer, at)) if now.duration_since(*at) < TTL => Some(peer.clone()),
            Some(_) => {
                map.remove(call_id);
                None
            }
            None => None,
        }
    }

    fn put_at(&self, call_id: &str, peer: &PeerRef, now: Instant) {
        let mut map = self.lock();
        if map.len() >= CAPACITY && !map.contains_key(call_id) {
            map.retain(|_, (_, at)| now.duration_since(*at) < TTL);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        map.insert(call_id.to_string(), (peer.clone(), now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str) -> PeerRef {
        PeerRef {
            name: name.into(),
            internal_url: format!("http://{name}:8080"),
        }
    }

    #[test]
    fn an_owner_is_remembered_until_forgotten_or_expired() {
        let cache = OwnerCache::default();
        let t0 = Instant::now();
        assert_eq!(cache.get_at("CA1", t0), None);
        cache.put_at("CA1", &peer("p1"), t0);
        assert_eq!(cache.get_at("CA1", t0 + TTL / 2), Some(peer("p1")));
        assert_eq!(cache.get_at("CA2", t0), None);
        cache.forget("CA1");
        assert_eq!(cache.get_at("CA1", t0), None);
        cache.put_at("CA1", &peer("p2"), t0);
        assert_eq!(cache.get_at("CA1", t0 + TTL), None, "expired");
        assert_eq!(cache.len(), 0, "an expired entry is dropped when read");
    }

    #[test]
    fn the_map_stays_bounded() {
        let cache = OwnerCache::default();
        let t0 = Instant::now();
        for i in 0..CAPACITY {
            cache.put_at(&format!("old{i}"), &peer("p1"), t0);
        }
        assert_eq!(cache.len(), CAPACITY);
        // Full of live entries: a new one clears the map and is kept.
        cache.put_at("new", &peer("p2"), t0);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get_at("new", t0), Some(peer("p2")));
        // Full with expired entries: only those go.
        let cache = OwnerCache::default();
        for i in 0..CAPACITY - 1 {
            cache.put_at(&format!("x{i}"), &peer("p1"), t0);
        }
        cache.put_at("fresh", &peer("p3"), t0 + TTL - Duration::from_secs(10));
        let later = t0 + TTL;
        assert_eq!(cache.len(), CAPACITY);
        cache.put_at("newest", &peer("p3"), later);
        assert_eq!(cache.len(), 2, "the expired entries were dropped");
        assert_eq!(cache.get_at("fresh", later), Some(peer("p3")));
    }
}
