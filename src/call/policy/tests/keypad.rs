//! The caller's keypad (`policy/keypad.rs`): keys collected into one turn until `#`, the
//! inter-digit pause or the maximum, one keypad request in flight, the per-call rate limit;
//! and the history the policy keeps, on the simulated clock of [`super`].

use super::*;

impl Call {
    /// Presses each key of `keys`, `gap_ms` apart.
    fn press(&mut self, keys: &str, gap_ms: u64) {
        for k in keys.chars() {
            self.step(Input::Dtmf(k));
            self.run(gap_ms);
        }
    }

    /// The caller messages of the brain requests so far.
    fn keypad_turns(&self) -> Vec<String> {
        self.brain_starts()
            .iter()
            .filter_map(|h| h.last().map(|m| m.content.clone()))
            .collect()
    }

    /// The brain answers the open request at once.
    fn answer_brain(&mut self, text: &str) {
        self.step(Input::Llm(LlmEvent::Delta(text.into())));
        self.step(Input::Llm(LlmEvent::Done));
    }
}

#[test]
fn keys_until_the_hash_are_one_turn() {
    let mut c = Call::answered("");
    c.press("123", 200);
    assert!(
        c.brain_starts().is_empty(),
        "no request per key: {:?}",
        c.log
    );
    c.press("#", 0);
    assert_eq!(c.keypad_turns(), ["The caller pressed 123#."]);
    assert_eq!(c.details(EventKind::Dtmf), ["1", "2", "3", "#"]);
    // Nothing more comes of the pause after it.
    c.run(3000);
    assert_eq!(c.brain_starts().len(), 1);
}

#[test]
fn the_inter_digit_pause_ends_the_turn() {
    let mut c = Call::answered("dtmf_inter_digit_ms = 800");
    c.press("42", 100);
    c.run(600);
    assert!(c.brain_starts().is_empty(), "still collecting");
    c.run(200);
    assert_eq!(c.keypad_turns(), ["The caller pressed 42."]);
    // The default pause is 1.5 s.
    let mut c = Call::answered("");
    c.press("7", 1400);
    assert!(c.brain_starts().is_empty());
    c.run(100);
    assert_eq!(c.keypad_turns(), ["The caller pressed 7."]);
}

#[test]
fn the_maximum_ends_the_turn_and_the_next_waits_for_the_reply() {
    let mut c = Call::answered("dtmf_max_digits = 4");
    c.press("1234", 100);
    assert_eq!(c.keypad_turns(), ["The caller pressed 1234."]);
    // The brain is still on it: the next four keys wait (and more past the maximum are
    // dropped), never a second request in flight.
    c.press("56789", 100);
    c.run(3000);
    assert_eq!(c.brain_starts().len(), 1, "one keypad request in flight");
    assert_eq!(c.policy.dtmf_dropped(), 1);
    c.answer_brain("Got it.");
    assert_eq!(
        c.keypad_turns(),
        ["The caller pressed 1234.", "The caller pressed 5678."]
    );
}

#[test]
fn fifty_keys_at_ten_a_second_are_a_few_turns() {
    let mut c = Call::answered("");
    for (i, k) in "0123456789".repeat(5).chars().enumerate() {
        c.step(Input::Dtmf(k));
        c.run(100);
        if i % 7 == 0 && c.policy.phase() == Phase::Thinking {
            c.answer_brain("Noted.");
        }
    }
    c.run(2000);
    if c.policy.phase() == Phase::Thinking {
        c.answer_brain("Noted.");
    }
    c.run(2000);
    let turns = c.keypad_turns();
    assert!(turns.len() <= 5, "{turns:?}");
    let keys: usize = turns
        .iter()
        .map(|t| t.chars().filter(char::is_ascii_digit).count())
        .sum();
    assert_eq!(keys, 50, "every key reached the brain once: {turns:?}");
}

#[test]
fn keys_over_the_rate_limit_are_counted_not_acted_on() {
    let mut c = Call::answered("dtmf_max_per_s = 5");
    for _ in 0..50 {
        c.step(Input::Dtmf('1'));
    }
    assert_eq!(c.count(EventKind::Dtmf), 5, "one second's worth");
    assert_eq!(c.policy.dtmf_dropped(), 45);
    // The excess is noted at 1, 10, … not once per key.
    assert_eq!(c.details(EventKind::DtmfDropped), ["1", "10"]);
    c.run(1000);
    c.step(Input::Dtmf('#'));
    assert_eq!(
        c.count(EventKind::Dtmf),
        6,
        "a second later keys count again"
    );
    assert_eq!(c.keypad_turns(), ["The caller pressed 11111#."]);
}

#[test]
fn the_policy_keeps_only_the_newest_turns_of_history() {
    let mut c = Call::answered("max_history_turns = 3");
    for n in 0..6 {
        c.caller_says(&format!("question number {n}"));
        c.answer_brain(&format!("Answer {n}."));
        c.run(3000);
    }
    let history = c.policy.history();
    let users: Vec<&str> = history
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        users,
        [
            "question number 3",
            "question number 4",
            "question number 5"
        ]
    );
    assert_eq!(
        history[0].role,
        Role::User,
        "the history starts with a caller turn"
    );
}
