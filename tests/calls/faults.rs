//! Faulty peers during a live Twilio call (docs/ROBUSTNESS.md, "Faults"): the brain rate
//! limited or overloaded (429 / 503 with `Retry-After`: retried after the hint), restarted
//! mid-call or down for good (`brain_retry_s`, `brain_down_hangup_s`), the brain's stream cut
//! mid-sentence,
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

/// The brain answers `status` (with the fake's `Retry-After: 2`) to the caller's first turn:
/// the turn is asked again after the hint, within `brain_retry_s`, and answered; the caller
/// hears the hold line once and the answer, never the apology.
async fn busy_brain_is_retried_after_its_hint(status: u16) {
    let stack = Stack::start(Opts::default()).await;
    stack
        .hermes
        .push(HermesReply::http(status, "boom: busy, retry later"));
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    let rec = stack
        .hermes
        .wait_until("the retry", |r| r.requests.len() == 2)
        .await;
    assert_eq!(rec.requests[0].status, status);
    assert_eq!(rec.requests[1].status, 200);
    assert_eq!(
        rec.requests[0].messages(),
        rec.requests[1].messages(),
        "the same turn"
    );
    sim.wait_for("the answer heard", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    let spoken = stack.spoken();
    assert_eq!(spoken[..2], [GREETING.to_string(), FILLER.to_string()]);
    assert!(spoken[2].starts_with("You said"), "{spoken:?}");
    assert!(!spoken.iter().any(|t| t == LLM_ERROR), "{spoken:?}");
    sim.hang_up().await;
    let r = stack.finished(&call_sid).await;
    let retries: Vec<&str> = r
        .events_of("llm_retry")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(
        retries[0].starts_with("attempt=1 in_ms=2000:"),
        "Retry-After honoured: {retries:?}"
    );
    assert_eq!(r.events_of("llm_error").count(), 0);
}

#[tokio::test]
async fn brain_429_with_retry_after_is_retried_after_the_hint_and_answered() {
    busy_brain_is_retried_after_its_hint(429).await;
}

#[tokio::test]
async fn brain_503_with_retry_after_is_retried_after_the_hint_and_answered() {
    busy_brain_is_retried_after_its_hint(503).await;
}

/// Waits until the live call's record satisfies `pred`.
async fn live_record_until(
    stack: &Stack,
    call_sid: &str,
    what: &str,
    pred: impl Fn(&patterd::call::CallRecord) -> bool,
) {
    let handle = stack.server.app.calls.get(call_sid).expect("a live call");
    let mut changes = handle.changes();
    let wait = async {
        loop {
            if handle.snapshot().await.is_ok_and(|r| pred(&r)) {
                return;
            }
            if changes.changed().await.is_err() {
                panic!("the call ended before {what}");
            }
        }
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Hermes restarts (the process goes away: connections refused) while the caller is asking
/// something: the turn is retried, the caller hears the hold line once, and once Hermes is
/// back on its port the turn is answered — no apology.
#[tokio::test]
async fn brain_restarted_mid_call_answers_the_turn_after_the_restart_with_no_apology() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    stack.hermes.stop();
    speak(&sim, 600);
    // The turn found Hermes down: the hold line is being said, and the turn is retried.
    let down = std::time::Instant::now();
    stack
        .el
        .wait_until("the hold line", |r| r.texts().iter().any(|t| t == FILLER))
        .await;
    live_record_until(&stack, &call_sid, "three retries", |r| {
        r.events_of("llm_retry").count() >= 3
    })
    .await;
    stack.hermes.start_again().await.expect("Hermes restarts");
    let back = std::time::Instant::now();
    let rec = stack
        .hermes
        .wait_until("the turn after the restart", |r| r.requests.len() == 2)
        .await;
    let asked_after = back.elapsed();
    assert_eq!(rec.requests[1].status, 200);
    sim.wait_for("the answer heard", WAIT, |s| s.marks_echoed.len() >= 4)
        .await
        .unwrap();
    let answered_after = back.elapsed();
    let spoken = stack.spoken();
    assert_eq!(spoken.len(), 4, "{spoken:?}");
    assert_eq!(spoken[0], GREETING);
    assert!(spoken[1].starts_with("You said"), "{spoken:?}");
    assert_eq!(spoken[2], FILLER);
    assert!(spoken[3].starts_with("You said"), "{spoken:?}");
    assert!(!sim.state().is_closed(), "the call goes on");
    sim.hang_up().await;
    let r = stack.finished(&call_sid).await;
    assert_eq!(r.events_of("llm_error").count(), 0);
    let retries = r.events_of("llm_retry").count();
    assert!(retries >= 1);
    println!(
        "FIGURE socket restart: Hermes down {:?} (from the caller's speech), asked again {asked_after:?} \
         and the answer's mark {answered_after:?} after it was back, {retries} retries; heard: \
         {spoken:?}",
        back - down
    );
}

/// Hermes goes away for good (40 s and more): each turn is retried for `brain_retry_s` (1 s
/// here) and apologised for, and once it has been down `brain_down_hangup_s` (2 s here) the
/// next failure ends the call once, politely, with a clear end reason.
#[tokio::test]
async fn brain_down_for_good_ends_the_call_once_politely() {
    let stack = Stack::start(Opts {
        agent_extra: "brain_retry_s = 1\nbrain_down_hangup_s = 2\n\
                      brain_down_message = \"Sorry, I cannot help right now. Goodbye.\""
            .into(),
        ..Opts::default()
    })
    .await;
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    stack.hermes.stop();
    speak(&sim, 600);
    // One second of retries, then the apology.
    sim.wait_for("the apology", WAIT, |s| s.marks_echoed.len() >= 4)
        .await
        .unwrap();
    assert_eq!(
        stack.spoken()[2..],
        [FILLER.to_string(), LLM_ERROR.to_string()]
    );
    // The caller tries again, the brain down for 2 s by the time the turn ends.
    speak(&sim, 600);
    let reqs = stack
        .ended_and_hung_up(&call_sid, "the brain was unavailable")
        .await;
    assert_eq!(reqs.len(), 1, "hung up once: {reqs:?}");
    let spoken = stack.spoken();
    assert_eq!(
        spoken.last().map(String::as_str),
        Some("Sorry, I cannot help right now. Goodbye."),
        "{spoken:?}"
    );
    assert_eq!(
        spoken.iter().filter(|t| *t == LLM_ERROR).count(),
        1,
        "{spoken:?}"
    );
    let r = stack.finished(&call_sid).await;
    assert_eq!(r.events_of("brain_down").count(), 1);
    assert_eq!(r.events_of("call_end").count(), 1);
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
