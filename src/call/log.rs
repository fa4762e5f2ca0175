//! What a call reports as it goes, and to whom: the [`CallLog`] port. The actor hands its
//! timeline events, ended turns, answer time, reply latencies and its end to a `CallLog` and
//! never waits on it; the store implements it (`store::StoreTx`), so `call` knows nothing of
//! SQLite and the store depends on `call`'s types, not the other way round.

use serde::{Deserialize, Serialize};

use super::event::{EndReason, EventDetail};
use super::transcript::{CallEvent, TranscriptEntry};

/// Where a call's record is persisted while the call goes. Every method must return at once
/// (queue and go); a sink that cannot keep up drops what it may and counts it.
pub trait CallLog: Send + Sync {
    /// One event of the call's timeline: `event` as stored (its `detail` is `typed`'s text)
    /// and `typed`, the payload for readers that want numbers, not text.
    fn event(&self, call_id: &str, event: &CallEvent, typed: &EventDetail);
    /// Transcript entry `seq`, inserted or updated (a turn is durable once it ends).
    fn turn(&self, call_id: &str, seq: usize, entry: &TranscriptEntry);
    /// The carrier's media stream started now.
    fn answered(&self, call_id: &str);
    /// The agent's first audio for the caller's latest turn went out `latency_us` after it.
    fn reply_latency(&self, call_id: &str, latency_us: u64);
    /// The call ended now, for `reason`.
    fn ended(&self, call_id: &str, reason: &EndReason);
    /// A frame was dropped because the queue ahead of it was full.
    fn frame_dropped(&self, _call_id: &str, _where: Dropped) {}
    /// What the call used of each provider, reported once just before [`CallLog::ended`].
    fn usage(&self, _call_id: &str, _usage: &Usage) {}
    /// The call's recording is complete (`bytes` long), after the call ended; called from the
    /// recording's writer thread.
    fn recording_ready(&self, _call_id: &str, _bytes: u64) {}
}

/// Where a call dropped a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Agent audio, a mark or a clear for the carrier (its queue was full).
    ToCarrier,
    /// Caller audio for speech-to-text (the session's queue was full).
    ToStt,
    /// Audio for the call's recording (the recording writer's queue was full).
    ToRecording,
}

/// What one call used, in the units providers bill (priced by `[pricing]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Caller audio streamed to speech-to-text, in milliseconds (8 kHz μ-law: 8 bytes a ms).
    pub stt_audio_ms: u64,
    /// Characters sent to text-to-speech.
    pub tts_characters: u64,
    /// Brain prompt (input) tokens, summed over the call's turns, from the stream's `usage`.
    pub llm_prompt_tokens: u64,
    /// Brain completion (output) tokens, summed likewise.
    pub llm_completion_tokens: u64,
    /// From the media stream's start to the call's end, in milliseconds (carrier minutes).
    pub carrier_ms: u64,
}
