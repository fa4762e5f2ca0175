//! A call's progress for a media socket that shows it (the browser phone): watches the call's
//! change counter and, when it moves, asks the actor for what is new since its cursor
//! ([`crate::call::CallHandle::progress`]: timeline events after the last one it had, at most a
//! few hundred at a time, and the transcript entries that are new or changed — a delta, never
//! the whole record), and sends it as carrier-neutral [`CallProgress`] updates on a bounded
//! channel. What it sends depends on who watches ([`ProgressView`]): the caller gets the
//! transcript, the agent's state and the turn latencies ([`caller_event`]); only a watcher with
//! control access gets the whole timeline (tool arguments and results, provider errors). It
//! runs in its own task and only asks the actor for deltas (never blocks it); it ends with the
//! call or the socket.

use tokio::sync::mpsc;

use crate::call::{CallHandle, EventKind, ProgressCursor, Speaker};
use crate::carrier::{CallProgress, ProgressView};

/// Updates waiting for the socket's writer.
pub(crate) const QUEUE: usize = 256;

/// The detail a caller may see of an event of `kind`: `None` hides the event; the agent's
/// state changes are sent without their detail, the turn latencies with it (a number of µs).
/// Everything else — tool calls, tool results and progress, provider errors and switches,
/// transfers, the speech-to-text's and the end-of-turn model's internals — stays with the
/// operator.
pub(crate) fn caller_event(kind: EventKind, detail: &str) -> Option<String> {
    use EventKind as K;
    match kind {
        K::MediaStart
        | K::SpeechStart
        | K::SpeechEnd
        | K::TurnEnd
        | K::LlmRequest
        | K::LlmDone
        | K::LlmError
        | K::TtsError
        | K::Interrupted
        | K::BargeInStop
        | K::BargeInCommit
        | K::BargeInResume
        | K::Filler
        | K::Dtmf
        | K::CallEnd => Some(String::new()),
        K::ReplyFirstFrame
        | K::GreetingFirstFrame
        | K::FirstFrameOfTurn
        | K::LlmFirstToken
        | K::TtsFirstAudio
            if detail.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(detail.to_string())
        }
        _ => None,
    }
}

/// Sends `handle`'s progress, as `view` may see it, on `tx` until the call ends or `tx`
/// closes.
pub async fn watch(handle: CallHandle, view: ProgressView, tx: mpsc::Sender<CallProgress>) {
    let mut changes = handle.changes();
    let mut cursor = ProgressCursor::default();
    loop {
        let Ok(delta) = handle.progress(cursor).await else {
            return;
        };
        cursor = delta.cursor;
        for e in delta.events {
            let detail = match view {
                ProgressView::Full => Some(e.detail),
                ProgressView::Caller => caller_event(e.kind, &e.detail),
            };
            let Some(detail) = detail else { continue };
            let p = CallProgress::Event {
                t_ms: e.t_ms,
                kind: e.kind.as_str().to_string(),
                detail,
            };
            if tx.send(p).await.is_err() {
                return;
            }
        }
        for (index, e) in delta.entries {
            let p = CallProgress::Transcript {
                index,
                agent: e.speaker == Speaker::Agent,
                text: e.text,
                heard: e.heard_text,
                interrupted: e.interrupted,
            };
            if tx.send(p).await.is_err() {
                return;
            }
        }
        if delta.more {
            continue;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_sees_state_and_latencies_but_no_tools_or_errors() {
        assert_eq!(
            caller_event(EventKind::ReplyFirstFrame, "412000").as_deref(),
            Some("412000")
        );
        assert_eq!(
            caller_event(EventKind::TurnEnd, "speech_final silence_ms=300").as_deref(),
            Some("")
        );
        assert_eq!(
            caller_event(
                EventKind::LlmError,
                "http://10.0.0.5:8642/v1/chat/completions: connection refused"
            )
            .as_deref(),
            Some(""),
            "the state change, not the internal URL"
        );
        for kind in [
            EventKind::ToolCall,
            EventKind::ToolResult,
            EventKind::ToolProgress,
            EventKind::ProviderSwitch,
            EventKind::SttError,
            EventKind::TransferStart,
            EventKind::Heard,
        ] {
            assert_eq!(caller_event(kind, "{\"secret\":1}"), None, "{kind}");
        }
        // A latency kind whose detail is not a number is not passed on.
        assert_eq!(
            caller_event(EventKind::TtsFirstAudio, "[tts.internal] 5"),
            None
        );
    }
}
