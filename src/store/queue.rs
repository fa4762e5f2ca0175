//! The store's write queue: what call actors and handlers hand to the writer thread. Pushing
//! never blocks. Timeline events and latency notes are *droppable*: once `cap` writes are
//! waiting (the disk is stalled), new ones are refused and counted. Everything else — call rows,
//! status changes, turns, call ends, webhook events, settings, flushes — is *kept* even then, because losing
//! one orphans or corrupts a call; that overflow is bounded by the number of calls and turns,
//! not by the event rate. A single queue keeps every write in the order it was made.
//!
//! The writer takes writes in batches: once the first write of a batch is waiting it lingers
//! (100 ms in the writer) for more, unless an urgent write (a flush, a call row, a setting) is
//! waiting or the batch is full, so a busy server commits tens of transactions a second
//! instead of one per event or turn (the store's reads flush first, so readers never see the
//! delay). A push wakes the writer only when the writer waits for exactly that (the first
//! write, an urgent one, a full batch): most pushes are a lock and a `push_back`, with no
//! system call.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Write;

/// What became of a pushed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// The queue was full and the write was droppable.
    Dropped,
    /// The writer has stopped.
    Closed,
}

/// What the writer got.
pub(crate) enum Popped {
    Batch(Vec<Write>),
    /// Nothing arrived within the timeout.
    Idle,
    /// Every sender is gone and the queue is empty.
    Closed,
}

/// What the writer is waiting for (a push notifies only for that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Not waiting.
    No,
    /// Any write (the queue was empty).
    Any,
    /// Lingering: only an urgent write or a full batch.
    Urgent,
}

struct State {
    items: VecDeque<Write>,
    closed: bool,
    /// Urgent writes (flushes, call rows, settings) among `items`: they end the linger.
    urgent: usize,
    wake: Wake,
    /// The writer's batch size (a full batch ends its linger).
    batch: usize,
}

pub(crate) struct WriteQueue {
    state: Mutex<State>,
    ready: Condvar,
    cap: usize,
}

impl WriteQueue {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
                urgent: 0,
                wake: Wake::No,
                batch: usize::MAX,
            }),
            ready: Condvar::new(),
            cap: cap.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn push(&self, w: Write) -> Pushed {
        let mut s = self.lock();
        if s.closed {
            return Pushed::Closed;
        }
        if s.items.len() >= self.cap && w.droppable() {
            return Pushed::Dropped;
        }
        let urgent = w.urgent();
        s.urgent += usize::from(urgent);
        s.items.push_back(w);
        let wake = match s.wake {
            Wake::No => false,
            Wake::Any => true,
            Wake::Urgent => urgent || s.items.len() >= s.batch,
        };
        if wake {
            s.wake = Wake::No;
            drop(s);
            self.ready.notify_one();
        }
        Pushed::Queued
    }

    /// Waits on the condition variable until `done` holds or `deadline` passes, telling
    /// pushes what to wake it for (`wake`) before each wait.
    fn wait_until<'a>(
        &self,
        mut s: MutexGuard<'a, State>,
        wake: Wake,
        deadline: Instant,
        done: impl Fn(&State) -> bool,
    ) -> MutexGuard<'a, State> {
        while !done(&s) && !s.closed {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s.wake = wake;
            s = self
                .ready
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        s.wake = Wake::No;
        s
    }

    /// Waits up to `timeout` for writes, then, unless one is urgent, up to `linger` more for
    /// others to join them (ended early by an urgent write, `max` writes or the close), and
    /// takes up to `max` of them, oldest first.
    pub(crate) fn pop_batch(&self, max: usize, timeout: Duration, linger: Duration) -> Popped {
        let mut s = self.lock();
        let max = max.max(1);
        s.batch = max;
        s = self.wait_until(s, Wake::Any, Instant::now() + timeout, |s| {
            !s.items.is_empty()
        });
        if !s.items.is_empty() && !linger.is_zero() {
            s = self.wait_until(s, Wake::Urgent, Instant::now() + linger, |s| {
                s.urgent > 0 || s.items.len() >= s.batch
            });
        }
        if s.items.is_empty() {
            return if s.closed {
                Popped::Closed
            } else {
                Popped::Idle
            };
        }
        let n = s.items.len().min(max);
        let batch: Vec<Write> = s.items.drain(..n).collect();
        let urgent = batch.iter().filter(|w| w.urgent()).count();
        s.urgent -= urgent;
        Popped::Batch(batch)
    }

    /// No more writes will come; the writer ends once it has drained the rest.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Writes waiting for the writer thread (the `/metrics` queue depth).
    pub(super) fn len(&self) -> usize {
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
                outbox: Vec::new(),
            }),
            Pushed::Queued
        );
        assert_eq!(q.len(), 4);
        let Popped::Batch(b) = q.pop_batch(10, Duration::from_millis(1), Duration::ZERO) else {
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
            q.pop_batch(10, Duration::from_millis(1), Duration::ZERO),
            Popped::Batch(b) if b.len() == 1
        ));
        assert!(matches!(
            q.pop_batch(10, Duration::from_millis(1), Duration::ZERO),
            Popped::Closed
        ));
    }

    #[test]
    fn an_idle_queue_times_out() {
        let q = WriteQueue::new(4);
        assert!(matches!(
            q.pop_batch(10, Duration::from_millis(5), Duration::ZERO),
            Popped::Idle
        ));
    }

    /// Runs `pop_batch` on its own thread (a long timeout and linger: only what ends a linger
    /// can return it soon) and gives its batch size back.
    fn pop_on_thread(q: &std::sync::Arc<WriteQueue>, max: usize) -> std::thread::JoinHandle<usize> {
        let q = q.clone();
        std::thread::spawn(move || {
            match q.pop_batch(max, Duration::from_secs(60), Duration::from_secs(60)) {
                Popped::Batch(b) => b.len(),
                _ => 0,
            }
        })
    }

    #[test]
    fn writes_linger_until_an_urgent_one_joins_them() {
        let q = std::sync::Arc::new(WriteQueue::new(16));
        let writer = pop_on_thread(&q, 16);
        q.push(event());
        q.push(event());
        // Events (or turns, ends …) alone would wait out the minute-long linger; a call row
        // ends it.
        q.push(call("CA1"));
        assert_eq!(writer.join().expect("writer"), 3);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_full_batch_ends_the_linger() {
        let q = std::sync::Arc::new(WriteQueue::new(16));
        let writer = pop_on_thread(&q, 3);
        for _ in 0..4 {
            q.push(event());
        }
        assert_eq!(writer.join().expect("writer"), 3);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn the_close_ends_the_linger() {
        let q = std::sync::Arc::new(WriteQueue::new(16));
        let writer = pop_on_thread(&q, 16);
        q.push(event());
        q.close();
        assert_eq!(writer.join().expect("writer"), 1);
    }
}
