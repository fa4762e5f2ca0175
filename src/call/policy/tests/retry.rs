//! The brain's outages (`policy/retry.rs`) on the simulated clock of [`super`]: retries within
//! `brain_retry_s` with backoff and `Retry-After`, the filler once per turn, the apology only
//! when the budget is spent, no retry once the reply started, and the polite hang-up after
//! `brain_down_hangup_s`.

use super::*;
use crate::call::policy::retry::{RETRY_FIRST, RETRY_MAX};

/// The brain could not be reached.
fn refused() -> Input {
    Input::Llm(LlmEvent::Unavailable {
        message: "request failed: connection refused".into(),
        retry_after: None,
    })
}

fn busy(after_s: u64) -> Input {
    Input::Llm(LlmEvent::Unavailable {
        message: "HTTP 503: overloaded".into(),
        retry_after: Some(Duration::from_secs(after_s)),
    })
}

impl Call {
    /// Lets time pass in 5 ms steps until the brain is asked again (up to `limit_ms`);
    /// returns how long that took.
    fn until_brain_start(&mut self, limit_ms: u64) -> Option<u64> {
        let before = self.brain_starts().len();
        let from = self.now;
        while self.now.duration_since(from) < Duration::from_millis(limit_ms) {
            self.run(5);
            if self.brain_starts().len() > before {
                return Some(self.now.duration_since(from).as_millis() as u64);
            }
            if self.ended.is_some() {
                return None;
            }
        }
        None
    }

    /// Utterances of this kind queued so far (`Speak` actions).
    fn spoken(&self, kind: fn(&UttKind) -> bool) -> Vec<String> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Speak { kind: k, text } if kind(k) => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    fn apologies(&self) -> usize {
        self.spoken(|k| matches!(k, UttKind::Error { .. }))
            .iter()
            .filter(|t| *t == &agent("").llm_error_message)
            .count()
    }

    fn fillers(&self) -> usize {
        self.spoken(|k| matches!(k, UttKind::Filler { .. })).len()
    }
}

#[test]
fn a_brain_that_comes_back_answers_the_turn_with_the_filler_once_and_no_apology() {
    let mut c = Call::answered("");
    c.caller_says("what are your opening hours");
    assert_eq!(c.brain_starts().len(), 1);
    let asked = c.brain_starts()[0].clone();
    // Three refusals (a restart), then the answer.
    let mut waits = Vec::new();
    for _ in 0..3 {
        c.step(refused());
        assert!(c.did(&Action::CancelBrain));
        assert!(
            c.policy.brain,
            "still the brain's turn (thinking, or the filler playing)"
        );
        waits.push(c.until_brain_start(5000).expect("asked again"));
    }
    // 250 ms doubling, each a random half to all of it (5 ms steps of the harness).
    for (i, w) in waits.iter().enumerate() {
        let base = (RETRY_FIRST * (1 << i)).min(RETRY_MAX).as_millis() as u64;
        assert!(
            *w >= base / 2 && *w <= base + 5,
            "retry {i}: {w} ms of {base}"
        );
    }
    let starts = c.brain_starts();
    assert_eq!(starts.len(), 4);
    assert!(
        starts.iter().all(|h| *h == asked),
        "the same turn each time"
    );
    assert_eq!(c.count(EventKind::LlmRetry), 3);
    c.step(Input::Llm(LlmEvent::Delta(REPLY.into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(8000);
    assert_eq!(c.fillers(), 1, "the hold line once per turn, not per retry");
    assert_eq!(c.apologies(), 0);
    assert_eq!(c.count(EventKind::LlmError), 0);
    assert!(c.agent_entry("We are open").heard_text.contains("midnight"));
    assert_eq!(c.policy.phase(), Phase::Idle);
}

#[test]
fn retry_after_is_honoured_and_capped_by_the_budget() {
    let mut c = Call::answered("brain_retry_s = 8");
    c.caller_says("what are your opening hours");
    c.step(busy(3));
    let w = c.until_brain_start(10_000).expect("asked again");
    assert!(
        (3000..=3005).contains(&w),
        "waited {w} ms for a Retry-After of 3 s"
    );
    // A hint longer than what is left of the budget: the last try is at the budget's end
    // (8 s after the first failure, 3 s of it gone).
    c.step(busy(120));
    let w = c.until_brain_start(10_000).expect("asked again");
    assert!(
        (4995..=5005).contains(&w),
        "waited {w} ms, the rest of the budget"
    );
    assert_eq!(c.apologies(), 0, "no apology while the budget lasts");
    // That try fails too: now the caller hears the apology, and no more tries.
    c.step(busy(1));
    assert_eq!(c.apologies(), 1);
    assert_eq!(c.count(EventKind::LlmError), 1);
    assert_eq!(c.until_brain_start(10_000), None);
}

#[test]
fn the_apology_comes_only_when_the_budget_is_spent_and_the_next_turn_tries_again() {
    let mut c = Call::answered("brain_retry_s = 4");
    c.caller_says("what are your opening hours");
    let first_failure = c.now;
    loop {
        c.step(refused());
        if c.apologies() > 0 {
            break;
        }
        assert!(c.until_brain_start(5000).is_some());
    }
    let spent = c.now.duration_since(first_failure);
    assert!(
        spent >= Duration::from_secs(4) && spent < Duration::from_millis(4100),
        "apologised after {spent:?}"
    );
    assert_eq!(c.fillers(), 1);
    assert_eq!(c.count(EventKind::LlmError), 1);
    c.run(6000);
    assert_eq!(c.policy.phase(), Phase::Idle);
    // The next turn asks the brain again, which answers now.
    let before = c.brain_starts().len();
    c.caller_says("are you open on Sunday");
    assert_eq!(c.brain_starts().len(), before + 1);
    c.step(Input::Llm(LlmEvent::Delta("Yes, from noon.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(3000);
    assert_eq!(c.apologies(), 1);
    assert!(c.agent_entry("Yes, from noon").heard_text.contains("noon"));
}

#[test]
fn a_reply_that_had_started_is_not_asked_again() {
    let mut c = Call::answered("");
    c.caller_says("where is my order");
    c.step(Input::Llm(LlmEvent::Delta(
        "Your order left the depot. It should".into(),
    )));
    c.step(refused());
    assert_eq!(c.until_brain_start(10_000), None, "never asked twice");
    assert_eq!(c.count(EventKind::LlmRetry), 0);
    let texts = c.spoken(|k| matches!(k, UttKind::Reply { .. } | UttKind::Error { .. }));
    assert_eq!(
        texts,
        vec![
            "Your order left the depot.".to_string(),
            "It should".to_string(),
            agent("").llm_error_message.clone()
        ]
    );
}

#[test]
fn a_tool_call_is_never_repeated_by_a_retry() {
    let mut c = Call::answered("");
    c.caller_says("book a table");
    c.step(Input::Llm(LlmEvent::ToolCall(crate::provider::ToolCall {
        id: "call_1".into(),
        name: "book".into(),
        arguments: "{}".into(),
        trace: None,
    })));
    c.step(refused());
    assert_eq!(c.until_brain_start(10_000), None);
    assert_eq!(c.apologies(), 1);
}

#[test]
fn with_no_budget_the_apology_comes_at_once() {
    let mut c = Call::answered("brain_retry_s = 0");
    c.caller_says("what time is it");
    c.step(refused());
    assert_eq!(c.apologies(), 1);
    assert_eq!(c.fillers(), 0);
    assert_eq!(c.until_brain_start(5000), None);
}

#[test]
fn a_brain_down_for_brain_down_hangup_s_ends_the_call_once_politely() {
    let mut c = Call::answered("");
    let goodbye = agent("").brain_down_message.clone();
    let start = c.now;
    // The caller keeps trying for 40 s; the brain never answers.
    let mut turns = 0;
    while c.ended.is_none() && c.now.duration_since(start) < Duration::from_secs(40) {
        turns += 1;
        c.caller_says(&format!("hello, are you there, attempt {turns}"));
        loop {
            c.step(refused());
            if c.policy.closing.is_some() || c.until_brain_start(10_000).is_none() {
                break;
            }
        }
        c.run(6000);
    }
    assert_eq!(c.ended, Some(EndReason::BrainDown));
    let down = c.details(EventKind::BrainDown);
    assert_eq!(down.len(), 1, "{down:?}");
    let ms: u64 = down[0]
        .strip_prefix("down_ms=")
        .and_then(|m| m.parse().ok())
        .expect("down_ms");
    assert!((30_000..31_000).contains(&ms), "ended after {ms} ms down");
    assert_eq!(
        c.spoken(|k| matches!(k, UttKind::Error { .. })).last(),
        Some(&goodbye)
    );
    assert_eq!(
        c.log
            .iter()
            .filter(|a| matches!(a, Action::HangUp(_)))
            .count(),
        1
    );
    // Before the end, each turn got one apology after its own budget: not one per retry.
    assert!(
        c.apologies() >= 1 && c.apologies() < turns,
        "{} of {turns}",
        c.apologies()
    );
    assert_eq!(c.count(EventKind::LlmError), c.apologies() + 1);
}

#[test]
fn a_brain_that_answers_in_between_is_not_down() {
    let mut c = Call::answered("brain_retry_s = 1\nbrain_down_hangup_s = 5");
    for i in 0..4 {
        c.caller_says(&format!("question number {i}"));
        // Each turn: one failure, then the answer on the retry; 4 turns take over 5 s.
        c.step(refused());
        assert!(c.until_brain_start(2000).is_some());
        c.step(Input::Llm(LlmEvent::Delta("Here you are.".into())));
        c.step(Input::Llm(LlmEvent::Done));
        c.run(3000);
    }
    assert_eq!(c.ended, None);
    assert_eq!(c.count(EventKind::BrainDown), 0);
    assert_eq!(c.apologies(), 0);
}

#[test]
fn a_transfer_while_a_retry_waits_stops_the_retries() {
    let mut c = Call::answered("transfer_allowed = [\"+1415555\"]");
    c.caller_says("put me through to sales");
    c.step(busy(3));
    c.step(Input::Act {
        id: 7,
        action: CallAction::Transfer {
            to: "+14155550100".into(),
        },
    });
    // The carrier takes its time: the turn is no longer the brain's, nothing asks it again.
    assert_eq!(
        c.until_brain_start(10_000),
        None,
        "no retry after the transfer"
    );
    assert!(c.log.iter().any(|a| matches!(a, Action::Transfer { .. })));
}
