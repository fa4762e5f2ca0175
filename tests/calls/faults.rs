//! Faulty peers during a live Twilio call (docs/ROBUSTNESS.md, "Faults"): the brain rate
//! limited or overloaded (429 / 503 with `Retry-After`), the brain's stream cut mid-sentence,
//! the speech-to-text socket dropped in the middle of the caller's utterance, and one
//! sentence's synthesis failing (500) or stalling. Each time the caller is never left in
//! silence and the call goes on.

use crate::common::*;
use patterd_sim::deepgram::DeepgramFailure;
use patterd_sim::hermes::{HermesReply, HermesStep};

/// The brain answers `reply` to the first turn: the caller hears the greeting and then the
/// agent's `llm_error_message` (never the error), and the next turn is answered normally.
async fn apologised_then_next_turn_works(reply: HermesReply) -> Vec<String> {
    let stack = Stack::start(Opts::default()).await;
    stack.hermes.push(reply);
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    let first = stack.spoken();
    assert!(!sim.state().is_closed(), "the call survived");
    speak(&sim, 600);
    stack
        .hermes
        .wait_until("second turn", |r| r.requests.len() == 2)
        .await;
    sim.wait_for("second reply", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    let spoken = stack.spoken();
    assert!(
        spoken.last().is_some_and(|t| t.starts_with("You said")),
        "{spoken:?}"
    );
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    first
}

#[tokio::test]
async fn brain_429_with_retry_after_is_apologised_for_and_the_call_goes_on() {
    let spoken =
        apologised_then_next_turn_works(HermesReply::http(429, "boom: rate limited, retry later"))
            .await;
    assert_eq!(spoken, vec![GREETING.to_string(), LLM_ERROR.to_string()]);
}

#[tokio::test]
async fn brain_503_with_retry_after_is_apologised_for_and_the_call_goes_on() {
    let spoken = apologised_then_next_turn_works(HermesReply::http(503, "boom: overloaded")).await;
    assert_eq!(spoken, vec![GREETING.to_string(), LLM_ERROR.to_string()]);
}

/// The brain's stream stops after half a sentence, with no finish chunk: what arrived is not
/// lost in silence — the caller hears something (the partial sentence or the apology) and the
/// next turn works.
#[tokio::test]
async fn brain_stream_cut_mid_sentence_is_not_silence() {
    let spoken = apologised_then_next_turn_works(HermesReply::Stream(vec![
        HermesStep::Text("Your appointment is on".into()),
        HermesStep::Cut,
    ]))
    .await;
    assert_eq!(spoken[0], GREETING);
    assert!(spoken.len() >= 2, "{spoken:?}");
    assert!(
        spoken[1..]
            .iter()
            .any(|t| t == LLM_ERROR || t.contains("appointment")),
        "{spoken:?}"
    );
}

/// The speech-to-text socket drops 200 ms into the caller's utterance: patterd reopens it and
/// the same utterance still becomes the turn that reaches the brain.
#[tokio::test]
async fn stt_dropped_mid_utterance_reopens_and_the_turn_reaches_the_brain() {
    let stack = Stack::start(Opts { ..Opts::default() }).await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    let sent = stack.dg.record().connections[0].audio_bytes;
    stack
        .dg
        .set_failure(Some(DeepgramFailure::DropAfterAudioBytes(sent + 1600)));
    speak(&sim, 1000);
    let rec = stack
        .dg
        .wait_until("STT reopened", |r| r.connections.len() >= 2)
        .await;
    assert!(rec.connections.len() >= 2);
    stack.dg.set_failure(None);
    // The utterance the drop cut into still becomes the turn the brain gets.
    let turn = stack
        .hermes
        .wait_until("turn", |r| !r.requests.is_empty())
        .await;
    let messages = turn.requests[0].messages();
    // (The reopened session is a new fake connection, which transcribes with its default.)
    assert!(
        messages
            .last()
            .is_some_and(|(role, text)| role == "user" && !text.trim().is_empty()),
        "{messages:?}"
    );
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(!sim.state().is_closed());
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert!(rec.events_of("stt_reopen").count() >= 1, "reopen recorded");
}

/// A reply whose sentence containing `bad` fails at text-to-speech as `configure` makes it:
/// the caller still hears the next sentence, and the failure is an event of the call.
async fn a_failed_sentence_is_skipped(
    configure: impl FnOnce(&mut patterd_sim::elevenlabs::FakeElevenLabsConfig),
    wait: std::time::Duration,
    marks: usize,
) {
    let stack = Stack::start(Opts::default()).await;
    stack.el.configure(configure);
    stack.hermes.push(HermesReply::text(
        "This first sentence is bad. But this second one is fine.",
    ));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    let rec = stack
        .el
        .wait_until("the good sentence synthesised", |r| {
            r.requests
                .iter()
                .any(|q| q.text.contains("fine") && q.completed)
        })
        .await;
    let bad = rec
        .requests
        .iter()
        .find(|q| q.text.contains("bad"))
        .expect("the bad sentence was asked for");
    assert!(!bad.completed, "{bad:?}");
    sim.wait_for("the good sentence played", wait, |s| {
        s.marks_echoed.len() >= marks
    })
    .await
    .unwrap();
    assert!(!sim.state().is_closed());
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert!(rec.events_of("tts_error").count() >= 1, "failure recorded");
}

#[tokio::test]
async fn tts_500_on_one_sentence_goes_on_with_the_next() {
    // Marks: the greeting, the good sentence.
    a_failed_sentence_is_skipped(|c| c.fail_text_containing = Some("bad".into()), WAIT, 2).await;
}

/// The synthesis of one sentence answers and then sends nothing: after the read deadline
/// (10 s, `DEFAULT_STALL` in `provider::elevenlabs`, not configurable) it is given up on and
/// the next sentence is spoken. The caller is not left in silence meanwhile: the long-turn
/// filler plays after 4 s.
#[tokio::test]
async fn tts_stalled_on_one_sentence_goes_on_with_the_next() {
    a_failed_sentence_is_skipped(
        |c| c.stall_text_containing = Some("bad".into()),
        std::time::Duration::from_secs(30),
        // Marks: the greeting, the filler, the good sentence.
        3,
    )
    .await;
}
