//! Word-precise heard history on the simulated clock of [`super`], with word timings
//! from the TTS: the cut is placed where playback stopped (when the `clear` goes out), not at
//! the caller's onset, so the words that played while the caller's speech was building up to
//! the stop (the hold included) count; after a stop the agent resumed from, the re-sent sentence
//! is cut where its replay stopped.

use super::*;
use crate::call::heard::{even, words_heard};

const S1: &str = "We are open every day from noon.";
const S2: &str = "We close at ten in the evening.";

/// The reply's sentences get their second of audio each, with word timings, and start playing.
/// Returns when the first sentence started.
fn replying_aligned() -> (Call, Instant) {
    let mut c = Call::answered("");
    c.caller_says("what are your opening hours");
    c.tts_stalled = true;
    c.step(Input::Llm(LlmEvent::Delta(REPLY.into())));
    c.step(Input::Llm(LlmEvent::Done));
    for (id, text) in std::mem::take(&mut c.requested) {
        assert!(c.synthesised.insert(id));
        let audio = Bytes::from(vec![0x55u8; UTTERANCE_BYTES]);
        c.mouth.on_tts(id, Some(TtsEvent::Audio(audio)));
        c.mouth.on_tts(id, Some(TtsEvent::Words(even(&text, 1000))));
        c.mouth.on_tts(id, Some(TtsEvent::Done));
    }
    let t = c.now;
    c.pump();
    c.log.clear();
    (c, t)
}

/// Voiced detector frames (one per 16 ms) from 64 ms up to the stop at 208 ms (the hold
/// starts at 112 ms); returns the time of the stop.
fn speak_until_stopped(c: &mut Call) -> Instant {
    c.speech_start();
    let mut run = 64;
    while !c.did(&Action::Clear) {
        assert!(run <= 400, "never stopped");
        c.run(16);
        c.voiced(run);
        run += 16;
    }
    c.now
}

/// The words of S2 heard once `ms` of it had played.
fn s2_heard(ms: Duration) -> String {
    let n = words_heard(&even(S2, 1000), ms.as_millis() as u32);
    S2.split_whitespace().take(n).collect::<Vec<_>>().join(" ")
}

fn heard_event(c: &Call) -> serde_json::Value {
    let d = c.details(EventKind::Heard);
    serde_json::from_str(d.last().expect("a heard event")).expect("JSON")
}

#[test]
fn a_stop_keeps_the_words_played_until_the_clear() {
    let (mut c, t) = replying_aligned();
    // S1 heard (its mark is back), S2 300 ms in.
    c.run(1300);
    assert_eq!(c.details(EventKind::MarkPlayed).len(), 1);
    let stop = speak_until_stopped(&mut c);
    assert_eq!(c.count(EventKind::BargeInHold), 1);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=208"]);
    c.now += Duration::from_millis(200);
    c.step(Input::Interim("no, I meant Tuesday".into()));
    assert_eq!(c.count(EventKind::Interrupted), 1);
    let s2_start = t + Duration::from_secs(1);
    let at_stop = s2_heard(stop - s2_start);
    let at_onset = s2_heard(stop - Duration::from_millis(208) - s2_start);
    assert!(
        at_stop.len() > at_onset.len(),
        "words played between the onset and the clear: {at_onset:?} / {at_stop:?}"
    );
    let expected = format!("{S1} {at_stop}");
    let reply = c.agent_entry("We are open");
    assert!(reply.interrupted);
    assert_eq!(reply.heard_text, expected);
    let ev = heard_event(&c);
    assert_eq!(ev["precision"], "word", "{ev}");
    assert_eq!(ev["text"], expected.as_str(), "{ev}");
    assert_eq!(
        c.policy.history().last().map(|m| m.content.clone()),
        Some(format!("{expected} [interrupted by the caller]"))
    );
}

#[test]
fn a_resumed_sentence_is_cut_where_its_replay_stopped() {
    let (mut c, _) = replying_aligned();
    c.run(1300);
    let first = speak_until_stopped(&mut c);
    // A cough: no words; the agent resumes from S2's start when the confirm window ends.
    c.speech_end();
    c.run(1000);
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["no_words after_ms=1000"]
    );
    assert_eq!(c.count(EventKind::Heard), 0, "nothing is cut on a resume");
    let resumed = first + Duration::from_millis(1000);
    c.log.clear();
    // 400 ms into the replay the caller interrupts for real.
    c.run(400);
    let stop = speak_until_stopped(&mut c);
    c.step(Input::Interim("no, I meant Tuesday".into()));
    let expected = format!("{S1} {}", s2_heard(stop - resumed));
    let reply = c.agent_entry("We are open");
    assert!(reply.interrupted);
    assert_eq!(
        reply.heard_text, expected,
        "S2 counted once, from its replay"
    );
    assert_eq!(
        heard_event(&c)["words"],
        expected.split_whitespace().count()
    );
}
