//! The registry of live calls, keyed by the carrier's call id, plus a bounded list of recently
//! finished calls' records. It is the only state calls share; its lock is held for a map lookup
//! at a time and never across an `.await`. Drain waits on its count reaching zero.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::watch;

use super::{CallHandle, CallRecord};

/// How many finished calls' records are kept in memory for quick lookup; the durable record is
/// in the store (`src/store/`) when one is configured.
const RECENT_LIMIT: usize = 256;

pub struct CallRegistry {
    live: Mutex<HashMap<String, CallHandle>>,
    recent: Mutex<VecDeque<CallRecord>>,
    count: watch::Sender<usize>,
}

impl Default for CallRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl CallRegistry {
    pub fn new() -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            recent: Mutex::new(VecDeque::new()),
            count: watch::channel(0).0,
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, CallHandle>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a call unless one with the same id exists or `max` calls are live.
    pub fn insert(&self, handle: CallHandle, max: usize) -> Result<(), InsertError> {
        let mut live = self.live();
        if live.contains_key(&*handle.call_id) {
            return Err(InsertError::Duplicate);
        }
        if live.len() >= max {
            return Err(InsertError::Full);
        }
        live.insert(handle.call_id.to_string(), handle);
        self.count.send_replace(live.len());
        Ok(())
    }

    pub fn get(&self, call_id: &str) -> Option<CallHandle> {
        self.live().get(call_id).cloned()
    }

    /// Called by an actor as it ends, with its final record.
    pub fn finish(&self, record: CallRecord) {
        // The record goes in first: a waiter woken by the count change must find it.
        let call_id = record.call_id.clone();
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() >= RECENT_LIMIT {
                recent.pop_front();
            }
            recent.push_back(record);
        }
        let mut live = self.live();
        live.remove(&call_id);
        self.count.send_replace(live.len());
    }

    pub fn len(&self) -> usize {
        *self.count.borrow()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handles of every live call (for shutdown and operators).
    pub fn handles(&self) -> Vec<CallHandle> {
        self.live().values().cloned().collect()
    }

    /// The record of a finished call, if still in memory.
    pub fn finished(&self, call_id: &str) -> Option<CallRecord> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().rev().find(|r| r.call_id == call_id).cloned()
    }

    /// Resolves when no call is live.
    pub async fn wait_empty(&self) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Resolves when the call has finished (immediately if unknown and not live).
    pub async fn wait_finished(&self, call_id: &str) -> Option<CallRecord> {
        let mut rx = self.count.subscribe();
        loop {
            if let Some(r) = self.finished(call_id) {
                return Some(r);
            }
            if self.get(call_id).is_none() {
                return self.finished(call_id);
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    #[error("a call with this id is already live")]
    Duplicate,
    #[error("the daemon is at max_calls")]
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::EndReason;
    use tokio::sync::{mpsc, watch};

    fn record(id: &str) -> CallRecord {
        CallRecord {
            call_id: id.into(),
            carrier: "twilio".into(),
            agent: "a".into(),
            from_masked: "***".into(),
            to_masked: "***".into(),
            ended_reason: EndReason::CallerHungUp,
            transcript: Vec::new(),
            events: Vec::new(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_woken_by_the_end_finds_the_record() {
        // Many calls ending together: every waiter gets its call's record, never `None`.
        let reg = std::sync::Arc::new(CallRegistry::new());
        let mut keep = Vec::new();
        for i in 0..50 {
            let (tx, rx) = mpsc::channel(1);
            let (_ctx, crx) = watch::channel(0);
            keep.push(rx);
            reg.insert(CallHandle::new(&format!("CA{i}"), "twilio", tx, crx), 100)
                .expect("insert");
        }
        let waiters: Vec<_> = (0..50)
            .map(|i| {
                let reg = reg.clone();
                tokio::spawn(async move { reg.wait_finished(&format!("CA{i}")).await })
            })
            .collect();
        tokio::task::yield_now().await;
        for i in 0..50 {
            reg.finish(record(&format!("CA{i}")));
        }
        for (i, w) in waiters.into_iter().enumerate() {
            let r = w.await.expect("join");
            assert_eq!(r.map(|r| r.call_id), Some(format!("CA{i}")));
        }
    }
}
