//! What a call reports as it goes, and to whom: the [`CallLog`] port. The actor hands its
//! timeline events, ended turns, answer time, reply latencies and its end to a `CallLog` and
//! never waits on it; the store implements it (`store::StoreTx`), so `call` knows nothing of
//! SQLite and the store depends on `call`'s types, not the other way round.

use super::event::EndReason;
use super::transcript::{CallEvent, TranscriptEntry};

/// Where a call's record is persisted while the call goes. Every method must return at once
/// (queue and go); a sink that cannot keep up drops what it may and counts it.
pub trait CallLog: Send + Sync {
    /// One event of the call's timeline.
    fn event(&self, call_id: &str, event: &CallEvent);
    /// Transcript entry `seq`, inserted or updated (a turn is durable once it ends).
    fn turn(&self, call_id: &str, seq: usize, entry: &TranscriptEntry);
    /// The carrier's media stream started now.
    fn answered(&self, call_id: &str);
    /// The agent's first audio for the caller's latest turn went out `latency_us` after it.
    fn reply_latency(&self, call_id: &str, latency_us: u64);
    /// The call ended now, for `reason`.
    fn ended(&self, call_id: &str, reason: &EndReason);
}
