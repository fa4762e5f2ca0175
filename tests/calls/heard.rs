//! Word-precise heard history through the Twilio simulator with real speech: the caller cuts
//! the agent's reply in the middle of its second sentence, and the reply's stored heard text,
//! the `heard` event and the next brain request hold the words the simulated carrier had played
//! when the `clear` stopped its playback (±1 word), from the fake ElevenLabs' `with-timestamps`
//! alignment; an ElevenLabs without timestamps (`word_timestamps = false`) still keeps whole
//! sentences; Telnyx and Plivo cut at the `clear` the same way. `test_heard_accuracy` prints the difference in words for each run
//! (`cargo test --test calls -- --nocapture heard::`).

use patterd::call::CallRecord;
use patterd::carrier::FRAME_BYTES;
use patterd_sim::elevenlabs::{FakeElevenLabs, FakeElevenLabsConfig};
use patterd_sim::stream::SimState;

use crate::common::fixtures::clip;
use crate::common::*;
use crate::conversation::{
    LONG, S1, S2, TUESDAY, agent_reply, into_reply, opts, reply, says_tuesday,
};

/// Bytes of leading silence in a caller clip (before its first voiced frame).
fn lead_in(ulaw: &[u8]) -> u64 {
    let frames = ulaw
        .chunks(FRAME_BYTES)
        .take_while(|f| patterd::audio::g711::ulaw_energy(f) < 300)
        .count();
    (frames * FRAME_BYTES) as u64
}

/// What one interrupted call stored, and what the carrier had played.
struct Cut {
    record: CallRecord,
    state: SimState,
    /// The Hermes request after the interruption: its last (user) message.
    next_user: String,
}

/// The reply plays; `into_s2_ms` into its second sentence the caller says "no, I meant
/// Tuesday".
async fn interrupt_in_s2(stack: &Stack, into_s2_ms: u64) -> Cut {
    let (sid, sim) = into_reply(stack).await;
    sim.wait_for("the second sentence playing", LONG, |s| {
        s.utterances.len() >= 2 && s.played_bytes >= s.utterances[1].end_pos + into_s2_ms * 8
    })
    .await
    .expect("the reply plays on");
    let (h, record) = says_tuesday(stack, &sid, &sim, "the interrupting turn").await;
    let state = sim.state();
    let next_user = h.requests[1]
        .messages()
        .last()
        .map(|(_, c)| c.clone())
        .expect("a user message");
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
    Cut {
        record,
        state,
        next_user,
    }
}

/// The words of the reply the caller heard before the carrier's playback stopped (its
/// position when the `clear` arrived): S1 whole and the words of S2 at least half played (the
/// fake aligns characters evenly over each sentence's audio). Returns the text, how far into S2
/// playback stopped and how far into it the caller's speech began (ms).
fn played_before_clear(stack: &Stack, st: &SimState) -> (String, u64, u64) {
    let stop = *st.cleared_at_pos.last().expect("the carrier got a clear");
    let (_, at_start) = *st
        .speech_start_played
        .last()
        .expect("the caller's speech was sent");
    let onset = at_start + lead_in(&clip("no_tuesday"));
    let s2_start = st.utterances[1].end_pos;
    let s2_ms = (stack.el.expected_bytes(S2) / 8) as u32;
    let into = stop.saturating_sub(s2_start) / 8;
    assert!(into < u64::from(s2_ms), "the cut falls inside S2");
    let n = patterd_sim::alignment::words_played(S2, s2_ms, into as u32);
    let words: Vec<&str> = S2.split_whitespace().take(n).collect();
    let text = if words.is_empty() {
        S1.to_string()
    } else {
        format!("{S1} {}", words.join(" "))
    };
    (text, into, onset.saturating_sub(s2_start) / 8)
}

/// The `heard` event's JSON detail.
fn heard_event(r: &CallRecord) -> serde_json::Value {
    let e = r.events_of("heard").last().expect("a heard event");
    serde_json::from_str(&e.detail).expect("heard detail is JSON")
}

fn words(s: &str) -> i64 {
    s.split_whitespace().count() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_heard_accuracy() {
    // Three cuts at different points of the second sentence (about 2.5 s long).
    let offsets = [600u64, 1200, 1800];
    let runs: Vec<_> = offsets
        .iter()
        .map(|off| {
            let off = *off;
            tokio::spawn(async move {
                let stack = Stack::start(opts(&TUESDAY, "idle_nudge_after_s = 0")).await;
                let cut = interrupt_in_s2(&stack, off).await;
                let (expected, into, onset) = played_before_clear(&stack, &cut.state);
                let timestamps = stack.el.record().requests.iter().all(|r| r.with_timestamps);
                (off, cut, expected, into, onset, timestamps)
            })
        })
        .collect();
    for run in runs {
        let (off, cut, expected, into, onset, timestamps) = run.await.expect("run");
        assert!(
            onset < into,
            "the clear comes after the caller began ({onset} / {into} ms)"
        );
        assert!(timestamps, "every sentence was asked with timestamps");
        let entry = agent_reply(&cut.record).expect("reply entry");
        assert!(entry.interrupted, "{entry:?}");
        let heard = entry.heard_text.clone();
        let diff = words(&heard) - words(&expected);
        println!(
            "heard accuracy: playback stopped {into} ms into S2 (caller began at {onset}, asked \
             {off}): heard {} words, stored {} (difference {diff}): {heard:?}",
            words(&expected),
            words(&heard)
        );
        assert!(
            reply().starts_with(&heard),
            "a prefix of the reply: {heard:?}"
        );
        assert!(
            diff.abs() <= 1,
            "stored {heard:?}, played before the clear {expected:?}"
        );
        assert!(
            heard.len() > S1.len(),
            "words of the cut sentence: {heard:?}"
        );
        let ev = heard_event(&cut.record);
        assert_eq!(ev["precision"], "word", "{ev}");
        assert_eq!(ev["text"], heard.as_str(), "{ev}");
        assert_eq!(ev["words"], words(&heard), "{ev}");
        assert_eq!(ev["of"], words(&reply()), "{ev}");
        // Hermes keeps its own copy of the reply: it is told exactly what got through.
        assert_eq!(
            cut.next_user,
            format!(
                "[The caller interrupted you; of your last reply they heard only: \"{heard}\"] \
                 no, I meant Tuesday"
            )
        );
        assert!(
            cut.state.protocol_errors.is_empty(),
            "{:?}",
            cut.state.protocol_errors
        );
    }
}

#[tokio::test]
async fn without_timestamps_history_keeps_whole_sentences() {
    let plain = FakeElevenLabs::start_with(FakeElevenLabsConfig {
        api_key: EL_KEY.into(),
        voice: Some(std::sync::Arc::new(clip("agent_voice"))),
        ms_per_char: 60,
        ..Default::default()
    })
    .await
    .expect("fake elevenlabs");
    let stack = Stack::start(Opts {
        tts: "\"plain\"".into(),
        extra_sections: format!(
            "[tts.plain]\nkind = \"elevenlabs\"\napi_key = \"{EL_KEY}\"\nvoice_id = \"v1\"\n\
             base_url = \"{}\"\nword_timestamps = false\n",
            plain.base_url()
        ),
        ..opts(&TUESDAY, "idle_nudge_after_s = 0")
    })
    .await;
    // `into_reply` pushes the reply and waits on the stack's brain; the audio comes from `plain`.
    let cut = interrupt_in_s2(&stack, 1200).await;
    let rec = plain.record();
    assert!(!rec.requests.is_empty());
    assert!(rec.requests.iter().all(|r| !r.with_timestamps));
    let entry = agent_reply(&cut.record).expect("reply entry");
    assert!(entry.interrupted, "{entry:?}");
    // S1's mark came back; S2 was cut and had no timings: sentence precision.
    assert_eq!(entry.heard_text, S1);
    let ev = heard_event(&cut.record);
    assert_eq!(ev["precision"], "sentence", "{ev}");
    assert_eq!(ev["words"], words(S1), "{ev}");
    assert!(cut.next_user.contains(&format!("heard only: \"{S1}\"")));
}

/// Telnyx (marks echoed, pending ones also on `clear`) and Plivo (checkpoints acknowledged
/// with `playedStream` only when played, never once cleared): the same cut at the `clear`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telnyx_and_plivo_cut_at_the_clear_too() {
    use crate::common::carrier::{Carrier, Carriers};
    let runs: Vec<_> = [Carrier::Telnyx, Carrier::Plivo]
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                let stack = Stack::start(opts(&TUESDAY, "idle_nudge_after_s = 0")).await;
                stack
                    .hermes
                    .push(patterd_sim::hermes::HermesReply::text(&reply()));
                let (sid, sim) = stack.call_via(c).await;
                sim.wait_for("greeting mark", LONG, |s| !s.marks_echoed.is_empty())
                    .await
                    .expect("greeting");
                sim.push_audio(&clip("book_table"));
                sim.wait_for("the second sentence playing", LONG, |s| {
                    s.marks_echoed.len() >= 2
                        && s.utterances.len() >= 2
                        && s.played_bytes >= s.utterances[1].end_pos + 1000 * 8
                })
                .await
                .expect("the reply plays on");
                let (_, record) = says_tuesday(&stack, &sid, &sim, "the interrupting turn").await;
                let state = sim.state();
                let (expected, into, _) = played_before_clear(&stack, &state);
                sim.hang_up().await;
                let _ = stack.finished(&sid).await;
                (c, record, state, expected, into)
            })
        })
        .collect();
    for run in runs {
        let (c, record, state, expected, into) = run.await.expect("run");
        let entry = agent_reply(&record).expect("reply entry");
        assert!(entry.interrupted, "{c:?}: {entry:?}");
        let diff = words(&entry.heard_text) - words(&expected);
        println!("{c:?}: playback stopped {into} ms into S2, difference {diff}");
        assert!(
            diff.abs() <= 1,
            "{c:?}: stored {:?}, played before the clear {expected:?}",
            entry.heard_text
        );
        assert_eq!(heard_event(&record)["precision"], "word");
        assert!(
            state.protocol_errors.is_empty(),
            "{c:?}: {:?}",
            state.protocol_errors
        );
    }
}
