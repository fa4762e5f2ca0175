//! The call actor's text-to-speech side: it owns the synthesis streams the policy asked for
//! ([`Action::Synthesize`](crate::call::policy::Action::Synthesize)), keyed by utterance id,
//! polls them in the select loop and hands their events back to the policy as
//! [`Input::Synthesis`](crate::call::policy::Input::Synthesis). A stream is dropped when it
//! ends or when the policy cancels it ([`Action::CancelSynthesis`](
//! crate::call::policy::Action::CancelSynthesis)); dropping a [`TtsStream`] aborts its task
//! (its `TaskGuard`), so a cancelled sentence's HTTP request stops. It also times each request
//! to its first audio (the `tts_first_audio` stage).

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::task::Poll;

use tokio::time::Instant;

use crate::provider::{TtsEvent, TtsStream};

/// Requests remembered for their first-audio time (ones dropped unheard are forgotten past it).
const TIMED_REQUESTS: usize = 64;

/// A call's synthesis streams in flight.
#[derive(Default)]
pub(super) struct Synthesis {
    /// By utterance id, polled lowest id first (the order they were asked for).
    streams: BTreeMap<u64, TtsStream>,
    /// Requests waiting for their first audio, with when they were made.
    requested: Vec<(u64, Instant)>,
}

impl Synthesis {
    /// Utterance `id`'s synthesis started at `now` on `stream`.
    pub(super) fn start(&mut self, id: u64, stream: TtsStream, now: Instant) {
        if self.requested.len() >= TIMED_REQUESTS {
            self.requested.remove(0);
        }
        self.requested.push((id, now));
        self.streams.insert(id, stream);
    }

    /// Drops these utterances' streams (cancelling their synthesis).
    pub(super) fn cancel(&mut self, ids: &[u64]) {
        for id in ids {
            self.streams.remove(id);
        }
    }

    /// Drops every stream.
    pub(super) fn clear(&mut self) {
        self.streams.clear();
    }

    /// The next event of any stream in flight (`None`: that stream ended). Pending forever
    /// when none is.
    pub(super) async fn next(&mut self) -> (u64, Option<TtsEvent>) {
        let (id, ev) = poll_fn(|cx| {
            for (id, tts) in self.streams.iter_mut() {
                if let Poll::Ready(ev) = tts.events.poll_recv(cx) {
                    return Poll::Ready((*id, ev));
                }
            }
            Poll::Pending
        })
        .await;
        if matches!(
            ev,
            None | Some(TtsEvent::Done | TtsEvent::Error(_) | TtsEvent::Unavailable(_))
        ) {
            self.streams.remove(&id);
        }
        (id, ev)
    }

    /// When utterance `id`'s request was made, if `ev` is its first audio (a chain's notes
    /// come before the audio they announce; a request that ends without audio is forgotten).
    pub(super) fn first_audio(&mut self, id: u64, ev: &Option<TtsEvent>) -> Option<Instant> {
        if matches!(
            ev,
            Some(TtsEvent::FirstByte { .. } | TtsEvent::Switched { .. } | TtsEvent::Words(_))
        ) {
            return None;
        }
        let i = self.requested.iter().position(|(r, _)| *r == id)?;
        let (_, at) = self.requested.swap_remove(i);
        matches!(ev, Some(TtsEvent::Audio(_))).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::TaskGuard;
    use tokio::sync::mpsc;

    /// A finished or cancelled synthesis' stream is dropped, so its task is aborted.
    #[tokio::test]
    async fn cancelling_drops_the_stream_and_aborts_its_task() {
        let (tx, events) = mpsc::channel(4);
        let task = tokio::spawn(std::future::pending::<()>());
        let abort = task.abort_handle();
        let stream = TtsStream {
            events,
            guard: TaskGuard::new(task),
        };
        let mut s = Synthesis::default();
        s.start(7, stream, Instant::now());
        tx.try_send(TtsEvent::Done).expect("queued");
        assert_eq!(s.next().await, (7, Some(TtsEvent::Done)));
        assert!(s.streams.is_empty(), "a finished stream is dropped");
        tokio::task::yield_now().await;
        assert!(abort.is_finished(), "and its task with it");
        let (_tx, events) = mpsc::channel(4);
        let task = tokio::spawn(std::future::pending::<()>());
        let abort2 = task.abort_handle();
        s.start(
            8,
            TtsStream {
                events,
                guard: TaskGuard::new(task),
            },
            Instant::now(),
        );
        s.cancel(&[8]);
        tokio::task::yield_now().await;
        assert!(abort2.is_finished(), "cancelled: its task is aborted");
    }
}
