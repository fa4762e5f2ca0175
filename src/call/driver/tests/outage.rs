//! The brain's outages in whole calls on the paused clock (the real actor and policy,
//! `provider::memory`'s brain going down as a restarting Hermes does: every request refused
//! until it is back): the caller's turn is answered after the restart with the filler once and
//! no apology; a brain that stays down ends the call once, politely, after
//! `brain_down_hangup_s`. The figures go into docs/ROBUSTNESS.md ("Hardening round 2").

use super::*;
use crate::call::EndReason;

/// The agent's lines these calls use (the defaults).
fn defaults() -> AgentConfig {
    toml::from_str("llm = \"brain\"\nstt = \"ears\"\ntts = \"voice\"").expect("agent")
}

const ANSWER: &str = "Yes, the terrace is open until ten tonight.";

/// Hermes restarts (down 6 s) just as the caller starts speaking: the turn is retried until
/// it is back and answered, with the filler once meanwhile and no apology.
#[tokio::test(start_paused = true)]
async fn a_turn_is_answered_after_the_brain_restarts_with_no_apology() {
    let created = tokio::time::Instant::now();
    let kit = call(
        &["is the terrace open tonight"],
        vec![Answer::text(ANSWER)],
        "idle_nudge_after_s = 0",
    );
    kit.greeted().await;
    let down = Duration::from_secs(6);
    kit.brain.down_for(down);
    let back_ms = (tokio::time::Instant::now() + down - created).as_millis() as u64;
    kit.call.leg.say(&clip("book_table"));
    let r = kit
        .call
        .wait_record("the answer heard", LIMIT, |r| {
            r.transcript
                .iter()
                .any(|e| e.text.starts_with("Yes, the terrace") && e.heard_text.contains("ten"))
        })
        .await;
    let agent = defaults();
    assert_eq!(
        kit.tts.spoken(),
        vec![GREETING, agent.long_turn_message.as_str(), ANSWER],
        "the caller heard the greeting, the hold line once and the answer"
    );
    assert!(kit.brain.refused() >= 2, "refused {}", kit.brain.refused());
    assert_eq!(kit.brain.turns().len(), 1, "one request reached the brain");
    assert_eq!(r.events_of(EventKind::LlmError).count(), 0);
    assert_eq!(
        r.events_of(EventKind::LlmRetry).count() as u64,
        kit.brain.refused()
    );
    assert_eq!(r.events_of(EventKind::LlmRequest).count(), 1);
    // The reply's first audio: the first synthesis after the brain's first token (the filler
    // had played by then, so it went out at once).
    let first_token = r
        .events_of(EventKind::LlmFirstToken)
        .next()
        .map(|e| e.t_ms)
        .expect("the brain answered");
    let first_audio = r
        .events
        .iter()
        .find(|e| e.kind == EventKind::TtsFirstAudio && e.t_ms >= first_token)
        .map(|e| e.t_ms)
        .expect("the reply's first audio");
    assert!(
        first_token >= back_ms,
        "answered only once the brain was back"
    );
    let after_restart = first_audio - back_ms;
    // The last backoff before the brain came back was at most 2 s; then its first token
    // (100 ms) and the synthesis' first audio (100 ms).
    assert!(
        after_restart <= 2_300,
        "the reply began {after_restart} ms after the restart"
    );
    println!(
        "FIGURE restart: brain down {} ms; the reply's first audio {after_restart} ms after it \
         was back; {} requests refused; heard: {:?}",
        down.as_millis(),
        kit.brain.refused(),
        kit.tts.spoken()
    );
}

/// The brain goes down for 40 s and the caller keeps asking: each turn is retried for
/// `brain_retry_s` (8 s) and apologised for, until the brain has been down for
/// `brain_down_hangup_s` (30 s): then the last line, one hang-up, `BrainDown`.
#[tokio::test(start_paused = true)]
async fn a_brain_down_for_40_s_ends_the_call_once_politely() {
    let created = tokio::time::Instant::now();
    let kit = call(
        &[
            "hello",
            "hello, are you there",
            "can you hear me",
            "hello?",
            "anyone?",
        ],
        vec![],
        "idle_nudge_after_s = 0",
    );
    let agent = defaults();
    kit.greeted().await;
    kit.brain.down_for(Duration::from_secs(40));
    let down_ms = (tokio::time::Instant::now() - created).as_millis() as u64;
    let mut turns = 0;
    let r = loop {
        turns += 1;
        assert!(turns <= 5, "the call did not end");
        kit.call.leg.say(&clip("book_table"));
        let r = kit
            .call
            .wait_record("the turn given up on", LIMIT, |r| {
                r.events_of(EventKind::LlmError).count() >= turns
                    || r.ended_reason != EndReason::InProgress
            })
            .await;
        if r.ended_reason != EndReason::InProgress || r.events_of(EventKind::BrainDown).count() > 0
        {
            break kit.call.finished().await;
        }
        // Let the apology play before the caller tries again.
        let marks = kit.call.leg.state().marks.len();
        kit.call
            .leg
            .wait_for("the apology heard", LIMIT, |s| s.marks.len() > marks)
            .await;
    };
    assert_eq!(r.ended_reason, EndReason::BrainDown);
    assert_eq!(kit.call.leg.state().hang_ups, 1, "hung up once");
    let spoken = kit.tts.spoken();
    assert_eq!(spoken.last(), Some(&agent.brain_down_message), "{spoken:?}");
    let apologies = spoken
        .iter()
        .filter(|s| **s == agent.llm_error_message)
        .count();
    assert_eq!(
        apologies,
        turns - 1,
        "one apology per earlier turn: {spoken:?}"
    );
    let ended_at = r
        .events_of(EventKind::BrainDown)
        .next()
        .map(|e| e.t_ms)
        .expect("brain_down recorded");
    let first_failure = r
        .events_of(EventKind::LlmRetry)
        .next()
        .map(|e| e.t_ms)
        .expect("a retry");
    assert!(first_failure >= down_ms);
    let down_for = ended_at - first_failure;
    // At the first failure once the brain has been down 30 s (a retry is never scheduled past
    // that point; a caller's new turn after it ends the call at its first failure).
    assert!(
        (30_000..40_000).contains(&down_for),
        "ended {down_for} ms after the first failure"
    );
    let limit = first_failure + 30_000;
    let late: Vec<u64> = r
        .events_of(EventKind::LlmError)
        .map(|e| e.t_ms)
        .filter(|t| *t >= limit && *t != ended_at)
        .collect();
    assert!(late.is_empty(), "apologies after 30 s down: {late:?}");
    println!(
        "FIGURE down 40 s: {turns} caller turns, {apologies} apologies, {} refused requests, \
         brain_down {down_for} ms after the first failure; heard: {spoken:?}",
        kit.brain.refused()
    );
}
