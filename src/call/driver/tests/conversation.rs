//! Conversation behaviour that needs the caller's audio to overlap the agent's: an
//! uninterruptible greeting, the agent's own voice echoed back loud enough to be transcribed,
//! and a quiet stretch the recogniser ends a segment on while our detector hears speech.

use super::*;

const BOOKING: &str = "I would like to book a table for four people on Tuesday evening.";

/// The first `ms` of the agent's voice at `gain` (0–1): its own speech coming back down the
/// line.
fn echo_of_agent(ms: usize, gain: f32) -> Vec<u8> {
    use crate::audio::g711::{decode_ulaw, encode_ulaw};
    let voice = clip("agent_voice");
    let pcm: Vec<i16> = decode_ulaw(&voice[..(ms * 8).min(voice.len())])
        .into_iter()
        .map(|s| (f32::from(s) * gain) as i16)
        .collect();
    encode_ulaw(&pcm)
}

/// Index of the `n`th (0-based) event of `kind` in the record.
fn nth_event(r: &CallRecord, kind: EventKind, n: usize) -> Option<usize> {
    r.events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == kind)
        .nth(n)
        .map(|(i, _)| i)
}

/// The caller talks over a greeting that may not be interrupted: it plays to its end and is
/// heard whole, the caller's turn is taken while it still plays, and the reply after it can
/// be cut (only the reply is cleared).
#[tokio::test(start_paused = true)]
async fn an_uninterruptible_greeting_plays_through_but_a_later_reply_is_cut() {
    let greeting = "Hello, thanks for calling the Harbour Kitchen. We are a small family \
                    restaurant by the water, and I can help you with opening hours, \
                    bookings and the menu.";
    let kit = call_greeting(
        greeting,
        &[BOOKING, "no, I meant Tuesday", "", ""],
        vec![Answer::text(&reply()), Answer::text("Tuesday it is.")],
        "greeting_interruptible = false\nidle_nudge_after_s = 0",
    );
    let leg = &kit.call.leg;
    leg.wait_for("greeting audio", LIMIT, |s| s.agent_bytes > 0)
        .await;
    // The caller talks over the greeting.
    leg.say(&clip("book_table"));
    kit.brain.wait_turns(1).await;
    assert_eq!(kit.brain.last_messages(), vec![BOOKING]);
    // The reply starts playing after the whole greeting; then the caller cuts it.
    leg.wait_for("first reply sentence heard", LIMIT, |s| s.marks.len() >= 2)
        .await;
    leg.say(&clip("no_tuesday"));
    kit.brain.wait_turns(2).await;
    let r = kit
        .call
        .wait_record("the second turn", LIMIT, |r| {
            r.events_of(EventKind::LlmRequest).count() >= 2
        })
        .await;
    let g = r
        .transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text == greeting)
        .expect("greeting entry");
    assert!(!g.interrupted, "{g:?}");
    assert_eq!(g.heard_text, greeting, "the greeting was heard whole");
    // The caller started speaking before the greeting was over, and the first turn was taken
    // while it still played (queued, not cut).
    let speech = nth_event(&r, EventKind::SpeechStart, 0).expect("speech_start");
    let first_mark = nth_event(&r, EventKind::MarkPlayed, 0).expect("greeting mark");
    let first_request = nth_event(&r, EventKind::LlmRequest, 0).expect("first llm_request");
    assert!(speech < first_mark, "{:#?}", r.events);
    assert!(first_request < first_mark, "{:#?}", r.events);
    let reply_entry = agent_reply(&r).expect("reply entry");
    assert!(reply_entry.interrupted, "{reply_entry:?}");
    let s = leg.state();
    let greeting_back = s.marks.first().map(|(t, _)| *t).expect("mark");
    assert!(!s.clears.is_empty(), "the reply was cut");
    assert!(
        s.clears.iter().all(|c| *c > greeting_back),
        "only the reply was cleared: {:?} (greeting back at {greeting_back})",
        s.clears
    );
    leg.hang_up();
    let _ = kit.call.finished().await;
}

/// The agent's voice comes back at -6 dB, loud enough for the recogniser to "transcribe" it
/// as the sentence the agent is saying: the echo check ignores it, no turn is taken and the
/// reply is heard to its end.
#[tokio::test(start_paused = true)]
async fn a_loud_echo_the_stt_transcribes_is_ignored_and_the_reply_goes_on() {
    let kit = call(
        &[BOOKING, S2, S2, S2],
        vec![Answer::text(&reply())],
        "idle_nudge_after_s = 0",
    );
    kit.reach_reply().await;
    kit.call.leg.say(&echo_of_agent(1440, 0.5));
    let r = kit
        .call
        .wait_record("the whole reply heard", LIMIT, |r| {
            agent_reply(r).is_some_and(|e| e.heard_text == reply())
        })
        .await;
    let ignored: Vec<_> = r.events_of(EventKind::EchoIgnored).collect();
    assert!(!ignored.is_empty(), "{:#?}", r.events);
    assert!(ignored.iter().all(|e| e.detail == S2), "{ignored:?}");
    assert_eq!(r.events_of(EventKind::BargeInCommit).count(), 0);
    assert_eq!(r.events_of(EventKind::Interrupted).count(), 0);
    assert_eq!(
        r.events_of(EventKind::LlmRequest).count(),
        1,
        "no caller turn taken"
    );
    let entry = agent_reply(&r).expect("reply entry");
    assert!(!entry.interrupted, "{entry:?}");
    assert!(
        !r.transcript
            .iter()
            .any(|e| e.speaker == Speaker::Caller && e.text == S2),
        "the echo is not a caller turn"
    );
    assert_eq!(kit.brain.turns().len(), 1);
    kit.call.leg.hang_up();
    let _ = kit.call.finished().await;
}

/// "I would like to book…", then a quiet stretch (the agent's voice at -20 dB: below the
/// recogniser's speech level, voiced to our detector) the recogniser ends a segment on while
/// our detector goes on hearing speech, then "move it to the afternoon.": one turn with both
/// segments, asked once, its reply heard whole.
#[tokio::test(start_paused = true)]
async fn a_pause_our_detector_bridges_but_the_stt_ends_is_still_one_turn() {
    let first = "I would like to book a table";
    let second = "move it to the afternoon.";
    let kit = call(
        &[first, second, "", ""],
        vec![Answer::text("Done.")],
        "idle_nudge_after_s = 0",
    );
    kit.greeted().await;
    let mut audio = clip("book_table");
    audio.extend(echo_of_agent(700, 0.1));
    audio.extend(clip("move_it"));
    kit.call.leg.say(&audio);
    let r = kit
        .call
        .wait_record("a reply heard", LIMIT, |r| {
            r.transcript.iter().any(|e| {
                e.speaker == Speaker::Agent
                    && e.text != GREETING
                    && !e.interrupted
                    && e.heard_text == e.text
            })
        })
        .await;
    let finals = kit.stt.finals();
    assert!(finals >= 2, "the recogniser ended two segments ({finals})");
    assert_eq!(
        kit.brain.last_messages(),
        vec![format!("{first} {second}")],
        "{:#?}",
        r.events
    );
    assert_eq!(r.events_of(EventKind::LlmRequest).count(), 1);
    assert_eq!(r.events_of(EventKind::Interrupted).count(), 0);
    kit.call.leg.hang_up();
    let _ = kit.call.finished().await;
}
