//! The store's write queue: what call actors and handlers hand to the writer thread. Pushing
//! never blocks. Timeline events and latency notes are *droppable*: once `cap` writes are
//! waiting (the disk is stalled), new ones are refused and counted. Everything else — call rows,
//! status changes, turns, call ends, settings, flushes — is *kept* even then, because losing
//! one orphans or corrupts a call; that overflow is bounded by the number of calls and turns,
//! not by the event rate. A single queue keeps every write in the order it was made.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::Write;

/// What became of a pushed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// The queue was full and the write was droppable.
    Dropped,
    /// The writer has stopped.
    Closed,
}

/// What the writer got.
pub enum Popped {
    Batch(Vec<Write>),
    /// Nothing arrived within the timeout.
    Idle,
    /// Every sender is gone and the queue is empty.
    Closed,
}

struct State {
    items: VecDeque<Write>,
    closed: bool,
}

pub struct WriteQueue {
    state: Mutex<State>,
    ready: Condvar,
    cap: usize,
}

impl WriteQueue {
    pub fn new(cap: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            cap: cap.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(&self, w: Write) -> Pushed {
        let mut s = self.lock();
        if s.closed {
            return Pushed::Closed;
        }
        if s.items.len() >= self.cap && w.droppable() {
            return Pushed::Dropped;
        }
        s.items.push_back(w);
        drop(s);
        self.ready.notify_one();
        Pushed::Queued
    }

    /// Waits up to `timeout` for writes and takes up to `max` of them, oldest first.
    pub fn pop_batch(&self, max: usize, timeout: Duration) -> Popped {
        let mut s = self.lock();
        if s.items.is_empty() && !s.closed {
            s = self
                .ready
                .wait_timeout_while(s, timeout, |s| s.items.is_empty() && !s.closed)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        if s.items.is_empty() {
            return if s.closed {
                Popped::Closed
            } else {
                Popped::Idle
            };
        }
        let n = s.items.len().min(max.max(1));
        Popped::Batch(s.items.drain(..n).collect())
    }

    /// No more writes will come; the writer ends once it has drained the rest.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Writes waiting for the writer thread (the `/metrics` queue depth).
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallEvent, EventKind};
    use crate::store::NewCall;

    fn event() -> Write {
        Write::Event {
            call_id: "CA1".into(),
            event: CallEvent {
                t_ms: 1,
                kind: EventKind::MarkPlayed,
                detail: String::new(),
            },
            at: 1,
        }
    }

    fn call(id: &str) -> Write {
        Write::Call(NewCall {
            call_id: id.into(),
            carrier: "twilio".into(),
            carrier_account: "twilio".into(),
            direction: "inbound",
            from: "+15550001111".into(),
            to: "+15550002222".into(),
            agent: "a".into(),
            status: "ringing".into(),
        })
    }

    #[test]
    fn a_full_queue_drops_events_but_keeps_calls_and_ends_in_order() {
        let q = WriteQueue::new(2);
        assert_eq!(q.push(event()), Pushed::Queued);
        assert_eq!(q.push(event()), Pushed::Queued);
        assert_eq!(q.push(event()), Pushed::Dropped);
        assert_eq!(q.push(call("CA2")), Pushed::Queued);
        assert_eq!(
            q.push(Write::Ended {
                call_id: "CA2".into(),
                reason: "caller hung up".into(),
                at: 2,
            }),
            Pushed::Queued
        );
        assert_eq!(q.len(), 4);
        let Popped::Batch(b) = q.pop_batch(10, Duration::from_millis(1)) else {
            panic!("expected a batch");
        };
        assert!(matches!(b[2], Write::Call(_)));
        assert!(matches!(b[3], Write::Ended { .. }));
    }

    #[test]
    fn the_writer_drains_before_it_sees_the_close() {
        let q = WriteQueue::new(4);
        q.push(call("CA1"));
        q.close();
        assert_eq!(q.push(call("CA2")), Pushed::Closed);
        assert!(matches!(
            q.pop_batch(10, Duration::from_millis(1)),
            Popped::Batch(b) if b.len() == 1
        ));
        assert!(matches!(
            q.pop_batch(10, Duration::from_millis(1)),
            Popped::Closed
        ));
    }

    #[test]
    fn an_idle_queue_times_out() {
        let q = WriteQueue::new(4);
        assert!(matches!(
            q.pop_batch(10, Duration::from_millis(5)),
            Popped::Idle
        ));
    }
}
