//! A live call's timeline in memory and what a reader of it gets: the actor's [`EventLog`]
//! keeps the newest [`LIVE_EVENTS`] events (the store has them all), numbered so a reader can
//! ask for the ones after those it has; [`ProgressCursor`] is where one reader (the browser
//! phone's progress stream) is, and [`EventLog::delta`] hands it only what is new — events
//! after its cursor, at most [`DELTA_EVENTS`] at a time, and the transcript entries that
//! changed since it last looked — never the whole record. Pure state, no I/O.

use std::collections::VecDeque;

use super::transcript::{CallEvent, TranscriptEntry};

/// Events a live call keeps in memory (older ones are only in the store).
pub(crate) const LIVE_EVENTS: usize = 4096;

/// Events handed to a reader at most per [`EventLog::delta`].
pub(crate) const DELTA_EVENTS: usize = 256;

/// The newest events of a call, numbered from 0 in the order they happened.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: VecDeque<CallEvent>,
    /// The number of the oldest event kept.
    first: u64,
}

impl EventLog {
    /// Records `e` (forgetting the oldest beyond [`LIVE_EVENTS`]); returns how many events
    /// the call has recorded in all.
    pub(crate) fn push(&mut self, e: CallEvent) -> u64 {
        if self.events.len() >= LIVE_EVENTS {
            self.events.pop_front();
            self.first += 1;
        }
        self.events.push_back(e);
        self.total()
    }

    /// Events recorded in all (kept or forgotten).
    pub(crate) fn total(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    /// The newest event.
    pub(crate) fn last(&self) -> Option<&CallEvent> {
        self.events.back()
    }

    /// The events kept, oldest first.
    pub(crate) fn to_vec(&self) -> Vec<CallEvent> {
        self.events.iter().cloned().collect()
    }

    /// What is new for the reader at `cursor`, given the call's `transcript`.
    pub(crate) fn delta(
        &self,
        transcript: &[TranscriptEntry],
        mut cursor: ProgressCursor,
    ) -> ProgressDelta {
        let skipped = self.first.saturating_sub(cursor.next_event);
        let from = cursor.next_event.max(self.first);
        let events: Vec<CallEvent> = self
            .events
            .iter()
            .skip((from - self.first) as usize)
            .take(DELTA_EVENTS)
            .cloned()
            .collect();
        cursor.next_event = from + events.len() as u64;
        let more = cursor.next_event < self.total();
        let mut entries = Vec::new();
        cursor.entries.truncate(transcript.len());
        for (i, e) in transcript.iter().enumerate() {
            let mark = EntryMark::of(e);
            if cursor.entries.get(i) == Some(&mark) {
                continue;
            }
            if i < cursor.entries.len() {
                cursor.entries[i] = mark;
            } else {
                cursor.entries.push(mark);
            }
            entries.push((i, e.clone()));
        }
        ProgressDelta {
            events,
            skipped,
            more,
            entries,
            cursor,
        }
    }
}

/// What identifies a version of a transcript entry (its texts only grow; the flag and end
/// time change once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EntryMark {
    text: usize,
    heard: usize,
    interrupted: bool,
    end_ms: u64,
}

impl EntryMark {
    fn of(e: &TranscriptEntry) -> Self {
        Self {
            text: e.text.len(),
            heard: e.heard_text.len(),
            interrupted: e.interrupted,
            end_ms: e.end_ms,
        }
    }
}

/// Where a reader of a call's progress is: the number of the next event it wants and the
/// version of each transcript entry it has.
#[derive(Debug, Clone, Default)]
pub struct ProgressCursor {
    next_event: u64,
    entries: Vec<EntryMark>,
}

/// What is new since a [`ProgressCursor`].
#[derive(Debug, Clone)]
pub struct ProgressDelta {
    /// Events after the cursor, oldest first.
    pub events: Vec<CallEvent>,
    /// Events the reader missed because the call no longer keeps them in memory.
    pub skipped: u64,
    /// More events are waiting (ask again without waiting for a change).
    pub more: bool,
    /// Transcript entries new or changed since the cursor, with their index.
    pub entries: Vec<(usize, TranscriptEntry)>,
    /// The cursor after this delta.
    pub cursor: ProgressCursor,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{EventKind, Speaker};

    fn ev(n: u64) -> CallEvent {
        CallEvent {
            t_ms: n,
            kind: EventKind::Dtmf,
            detail: n.to_string(),
        }
    }

    fn entry(text: &str, heard: &str) -> TranscriptEntry {
        TranscriptEntry {
            speaker: Speaker::Agent,
            text: text.into(),
            heard_text: heard.into(),
            interrupted: false,
            start_ms: 0,
            end_ms: 0,
        }
    }

    #[test]
    fn the_log_keeps_the_newest_events_and_counts_them_all() {
        let mut log = EventLog::default();
        for n in 0..(LIVE_EVENTS as u64 + 10) {
            log.push(ev(n));
        }
        assert_eq!(log.total(), LIVE_EVENTS as u64 + 10);
        let kept = log.to_vec();
        assert_eq!(kept.len(), LIVE_EVENTS);
        assert_eq!(kept[0].t_ms, 10);
        assert_eq!(log.last().map(|e| e.t_ms), Some(LIVE_EVENTS as u64 + 9));
    }

    #[test]
    fn a_reader_gets_only_what_is_new() {
        let mut log = EventLog::default();
        let mut transcript = vec![entry("Hello.", "")];
        for n in 0..3 {
            log.push(ev(n));
        }
        let d = log.delta(&transcript, ProgressCursor::default());
        assert_eq!(d.events.len(), 3);
        assert_eq!(d.entries.len(), 1);
        assert!(!d.more);
        // Nothing new: nothing sent.
        let d = log.delta(&transcript, d.cursor);
        assert!(d.events.is_empty() && d.entries.is_empty());
        // One event and one changed entry, then a new one.
        log.push(ev(3));
        transcript[0].heard_text = "Hello.".into();
        transcript.push(entry("Bye.", ""));
        let d = log.delta(&transcript, d.cursor);
        assert_eq!(d.events.iter().map(|e| e.t_ms).collect::<Vec<_>>(), [3]);
        assert_eq!(
            d.entries.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1]
        );
    }

    #[test]
    fn a_reader_far_behind_gets_bounded_deltas_and_is_told_what_it_missed() {
        let mut log = EventLog::default();
        let d = log.delta(&[], ProgressCursor::default());
        for n in 0..(LIVE_EVENTS as u64 + 100) {
            log.push(ev(n));
        }
        let d = log.delta(&[], d.cursor);
        assert_eq!(d.skipped, 100);
        assert_eq!(d.events.len(), DELTA_EVENTS);
        assert_eq!(d.events[0].t_ms, 100);
        assert!(d.more);
    }
}
