//! A bounded in-process replay memory: keys (a webhook's nonce, an event id) seen within a
//! window, oldest forgotten first past a capacity. It is the one-instance implementation of
//! the carriers' replay guard (`carrier::port::Host::first_seen` with the SQLite store) and
//! Plivo's `Nonces`; in a cluster the guard is the shared store's `webhook_seen` table instead.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest key recorded; longer ones are refused (nonces and event ids are far shorter).
pub(crate) const MAX_KEY_LEN: usize = 128;

/// Keys already seen, oldest first, each kept for the window.
pub struct SeenSet {
    window: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    seen: HashSet<String>,
    order: VecDeque<(Instant, String)>,
}

impl SeenSet {
    pub fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Records `key`; false if it was seen inside the window (a replay) or is unusable
    /// (empty, or longer than [`MAX_KEY_LEN`]).
    pub(crate) fn first_use(&self, key: &str) -> bool {
        self.first_use_at(key, Instant::now())
    }

    /// [`SeenSet::first_use`] at the instant `now` (tests).
    pub fn first_use_at(&self, key: &str, now: Instant) -> bool {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return false;
        }
        let mut set = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((at, _)) = set.order.front() {
            let expired = now.saturating_duration_since(*at) >= self.window;
            if !expired && set.order.len() < self.capacity {
                break;
            }
            if let Some((_, old)) = set.order.pop_front() {
                set.seen.remove(&old);
            }
        }
        if !set.seen.insert(key.to_string()) {
            return false;
        }
        set.order.push_back((now, key.to_string()));
        true
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .order
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
