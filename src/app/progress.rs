//! A call's progress for a media socket that shows it (the browser phone): watches the call's
//! change counter, takes a snapshot of its record when it moves, and sends what is new —
//! timeline events since the last look, transcript entries that are new or changed — as
//! carrier-neutral [`CallProgress`] updates on a bounded channel. It runs in its own task and
//! only asks the actor for snapshots (never blocks it); it ends with the call or the socket.

use tokio::sync::mpsc;

use crate::call::{CallHandle, Speaker, TranscriptEntry};
use crate::carrier::CallProgress;

/// Updates waiting for the socket's writer.
pub(crate) const QUEUE: usize = 256;

/// Sends `handle`'s progress on `tx` until the call ends or `tx` closes.
pub async fn watch(handle: CallHandle, tx: mpsc::Sender<CallProgress>) {
    let mut changes = handle.changes();
    let mut events_seen = 0usize;
    let mut entries: Vec<TranscriptEntry> = Vec::new();
    loop {
        let Ok(record) = handle.snapshot().await else {
            return;
        };
        for e in record.events.iter().skip(events_seen) {
            let p = CallProgress::Event {
                t_ms: e.t_ms,
                kind: e.kind.as_str().to_string(),
                detail: e.detail.clone(),
            };
            if tx.send(p).await.is_err() {
                return;
            }
        }
        events_seen = events_seen.max(record.events.len());
        for (index, e) in record.transcript.iter().enumerate() {
            if entries.get(index) == Some(e) {
                continue;
            }
            let p = CallProgress::Transcript {
                index,
                agent: e.speaker == Speaker::Agent,
                text: e.text.clone(),
                heard: e.heard_text.clone(),
                interrupted: e.interrupted,
            };
            if tx.send(p).await.is_err() {
                return;
            }
        }
        entries = record.transcript;
        if changes.changed().await.is_err() {
            return;
        }
    }
}
