//! Conversation scenarios through the Twilio simulator with real (espeak-ng) speech from
//! tests/fixtures/speech: an interrupted reply as each brain's wire format carries it, and the
//! helpers the heard-history tests share. The conversation's timing and behaviour —
//! interruptions, backchannels, noises and echo (the figures of docs/conversation.md), an
//! unfinished phrase's pause, fillers, idle nudges, an uninterruptible greeting, turns without
//! barge-in — is tested on the paused clock with the call in memory: `src/call/driver/tests.rs`
//! and `src/call/driver/tests/`.

use std::time::Duration;

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::call::{CallRecord, Speaker};
use patterd_sim::hermes::{HermesRecord, HermesReply};
use patterd_sim::twilio::call::SimCall;

pub(crate) const S1: &str = "We are open every day from noon until ten.";
pub(crate) const S2: &str = "We can seat groups of up to twelve people.";
pub(crate) const S3: &str = "The kitchen closes an hour before we do.";
pub(crate) const S4: &str = "Would you like me to book a table for you?";
pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) fn reply() -> String {
    format!("{S1} {S2} {S3} {S4}")
}

pub(crate) fn opts(transcripts: &[&str], agent_extra: &str) -> Opts {
    Opts {
        transcripts: transcripts.iter().map(|t| t.to_string()).collect(),
        agent_extra: agent_extra.to_string(),
        // The agent speaks with a real voice at about 16 characters a second.
        voice: Some((clip("agent_voice"), 60)),
        long_turn_after_s: 20.0,
        ..Default::default()
    }
}

/// The caller's first turn, the booking the reply answers.
const BOOKING: &str = "I would like to book a table for four people on Tuesday evening.";

/// The caller's turns of the interruption scenarios: the booking, then "no, I meant Tuesday"
/// over the reply, then silence.
pub(crate) const TUESDAY: [&str; 4] = [BOOKING, "no, I meant Tuesday", "", ""];

/// Waits until the call's record satisfies `pred` (up to `LONG`): checks a snapshot each time
/// the call records an event, and the final record once it has ended. No polling.
pub(crate) async fn wait_record(
    stack: &Stack,
    sid: &str,
    what: &str,
    pred: impl Fn(&CallRecord) -> bool,
) -> CallRecord {
    let calls = &stack.server.app.calls;
    let wait = async {
        let Some(h) = calls.get(sid) else {
            return calls.finished(sid);
        };
        // Subscribed before the first snapshot, so no event between the two is missed.
        let mut changes = h.changes();
        loop {
            match h.snapshot().await {
                Ok(r) if pred(&r) => return Some(r),
                Ok(_) => {}
                Err(_) => return calls.wait_finished(sid).await,
            }
            if changes.changed().await.is_err() {
                return calls.wait_finished(sid).await;
            }
        }
    };
    let r = tokio::time::timeout(LONG, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("no record of call {sid} while waiting for {what}"));
    assert!(pred(&r), "call ended before {what}: {r:#?}");
    r
}

pub(crate) fn agent_reply(r: &CallRecord) -> Option<&patterd::call::TranscriptEntry> {
    r.transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text.starts_with("We are open"))
}

/// The caller says "no, I meant Tuesday" (the brain will answer "Tuesday it is."); returns the
/// brain's record once that turn reached it (`what`) and the call's once the turn is stored.
pub(crate) async fn says_tuesday(
    stack: &Stack,
    sid: &str,
    sim: &SimCall,
    what: &str,
) -> (HermesRecord, CallRecord) {
    stack.hermes.push(HermesReply::text("Tuesday it is."));
    sim.push_audio(&clip("no_tuesday"));
    let h = stack
        .hermes
        .wait_until(what, |r| r.requests.len() >= 2)
        .await;
    let r = wait_record(stack, sid, "the second turn", |r| {
        r.events_of("llm_request").count() >= 2
    })
    .await;
    (h, r)
}

/// Greeting, a caller turn, and the long reply playing; returns once its first sentence was
/// heard.
pub(crate) async fn into_reply(stack: &Stack) -> (String, SimCall) {
    stack.hermes.push(HermesReply::text(&reply()));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    sim.push_audio(&clip("book_table"));
    sim.wait_for("first reply sentence heard", LONG, |s| {
        s.marks_echoed.len() >= 2
    })
    .await
    .expect("reply plays");
    (sid, sim)
}

/// Interrupts the long reply with "no, I meant Tuesday" on an agent using brain `llm`; returns
/// the second request's messages and what the caller heard of the reply.
async fn interrupted_history(llm: &str) -> (Vec<(String, String)>, String) {
    let stack = Stack::start(Opts {
        llm: llm.into(),
        ..opts(&TUESDAY, "idle_nudge_after_s = 0")
    })
    .await;
    let (sid, sim) = into_reply(&stack).await;
    let (h, r) = says_tuesday(&stack, &sid, &sim, "the interrupting turn").await;
    let entry = agent_reply(&r).expect("reply entry");
    assert!(entry.interrupted, "{entry:?}");
    assert!(!entry.heard_text.is_empty(), "a sentence was heard first");
    assert!(entry.heard_text != reply(), "the reply was cut: {entry:?}");
    assert!(reply().starts_with(&entry.heard_text), "{entry:?}");
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
    (h.requests[1].messages(), entry.heard_text.clone())
}

#[tokio::test]
async fn an_interrupted_reply_reaches_each_brain_as_what_was_heard() {
    let (compat, hermes) =
        tokio::join!(interrupted_history("compat"), interrupted_history("hermes"));
    let first = "I would like to book a table for four people on Tuesday evening.";
    // openai_compatible: the whole history, the reply truncated to what was heard and marked.
    let (messages, heard) = compat;
    let pair = |r: &str, c: &str| (r.to_string(), c.to_string());
    assert_eq!(
        messages,
        vec![
            pair("system", SYSTEM_PROMPT),
            pair("user", first),
            pair("assistant", &format!("{heard} [interrupted by the caller]")),
            pair("user", "no, I meant Tuesday"),
        ]
    );
    // Hermes keeps its own (whole) copy: the next user message starts with a bracketed note.
    let (messages, heard) = hermes;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0], pair("system", SYSTEM_PROMPT));
    assert_eq!(
        messages[1],
        pair(
            "user",
            &format!(
                "[The caller interrupted you; of your last reply they heard only: \"{heard}\"] \
                 no, I meant Tuesday"
            )
        )
    );
}
