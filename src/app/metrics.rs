//! Daemon-wide counters (rendered at `GET /metrics` by the server).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub calls_accepted: AtomicU64,
    pub calls_rejected_unknown_number: AtomicU64,
    pub calls_rejected_caller: AtomicU64,
    pub calls_rejected_busy: AtomicU64,
    pub webhooks_forbidden: AtomicU64,
    /// Webhooks for a call id already handled (replays), refused.
    pub webhooks_replayed: AtomicU64,
    pub media_rejected: AtomicU64,
    pub media_frames_bad: AtomicU64,
}

impl Metrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
