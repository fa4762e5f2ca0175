//! An interruption split by a pause (the suite's "missed interruptions" in street
//! and hiss at 20 dB): "wait, stop" said with a pause after "wait," long enough for the
//! endpointer to end a turn. Each half alone is one word, under `barge_in_min_words`; before
//! the fix each was dropped as a backchannel and the agent resumed twice.

use super::*;

/// The agent is stopped by 200 ms of voiced caller audio, then the caller's words `text` end
/// a turn (speech end, final, endpointing).
fn stop_then_turn(c: &mut Call, text: &str) {
    c.speech_start();
    c.voiced(200);
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    c.run(60);
    c.speech_end();
    c.final_text(text);
    c.run(300);
}

#[test]
fn one_word_then_a_pause_then_another_is_an_interruption() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "wait,");
    assert_eq!(c.count(EventKind::BackchannelIgnored), 0);
    assert_eq!(c.count(EventKind::BargeInResume), 0, "{:?}", c.events());
    assert_eq!(c.details(EventKind::TurnHeld), vec!["barge_in wait,"]);
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    // "stop" after the pause: with "wait," that is two words.
    c.speech_start();
    c.voiced(100);
    c.step(Input::Interim("stop".into()));
    assert_eq!(c.count(EventKind::BargeInCommit), 1, "{:?}", c.events());
    assert_eq!(c.count(EventKind::Interrupted), 1);
    c.run(100);
    c.speech_end();
    c.final_text("stop");
    c.run(300);
    assert_eq!(c.count(EventKind::BargeInResume), 0);
    let starts = c.brain_starts();
    assert_eq!(starts.len(), 1, "one turn: {:?}", c.events());
    assert_eq!(
        starts[0].last().map(|m| m.content.as_str()),
        Some("wait, stop")
    );
    assert_eq!(c.policy.phase(), Phase::Thinking);
}

#[test]
fn one_word_and_nothing_more_resumes_at_the_barge_in_deadline() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "wait,");
    assert_eq!(c.count(EventKind::BargeInResume), 0);
    c.run(700);
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["no_words after_ms=1000"]
    );
    assert_eq!(c.policy.phase(), Phase::Speaking);
    assert!(c.brain_starts().is_empty());
    c.run(3000);
    assert!(!c.agent_entry("We are open").interrupted);
    // The forgotten word does not start the caller's next turn.
    c.caller_says("thanks");
    assert_eq!(c.asked().last().map(String::as_str), Some("thanks"));
}

#[test]
fn a_backchannel_while_stopped_still_resumes_at_once() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "okay");
    assert_eq!(c.details(EventKind::BackchannelIgnored), vec!["okay"]);
    assert_eq!(c.count(EventKind::BargeInResume), 1);
    assert_eq!(c.count(EventKind::TurnHeld), 0);
}

#[test]
fn the_rest_still_being_said_at_the_deadline_is_waited_for_once() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "wait,");
    // The caller is saying "stop" when the barge-in window ends (a slow recogniser).
    c.run(400);
    c.speech_start();
    c.voiced(100);
    c.run(400);
    assert_eq!(c.count(EventKind::BargeInResume), 0, "{:?}", c.events());
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    c.speech_end();
    c.final_text("stop");
    c.run(300);
    assert_eq!(c.count(EventKind::BargeInResume), 0, "{:?}", c.events());
    assert_eq!(c.asked().last().map(String::as_str), Some("wait, stop"));
}

/// Before issue 34 the agent waited up to twice the window (2 s) in silence; now
/// `hold_max_ms` (1.2 s from the stop) bounds it, and the caller's real word is their turn.
#[test]
fn held_words_with_a_caller_who_never_stops_take_the_turn_at_hold_max() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "wait,");
    c.speech_start();
    c.voiced(100);
    c.run(839);
    assert_eq!(c.count(EventKind::BargeInCommit), 0, "{:?}", c.events());
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    c.run(1);
    assert_eq!(
        c.details(EventKind::BargeInCommit),
        vec!["hold_max after_ms=1200"]
    );
    assert_eq!(c.count(EventKind::BargeInResume), 0);
    assert_eq!(c.asked().last().map(String::as_str), Some("wait,"));
    assert_eq!(c.policy.phase(), Phase::Thinking);
}

#[test]
fn the_rest_said_before_the_deadline_but_transcribed_after_it_still_counts() {
    let mut c = Call::replying("");
    stop_then_turn(&mut c, "wait,");
    // "stop" is said and over before the window ends; its words come late.
    c.run(200);
    c.speech_start();
    c.voiced(100);
    c.run(200);
    c.speech_end();
    c.run(300);
    assert_eq!(c.count(EventKind::BargeInResume), 0, "{:?}", c.events());
    c.final_text("stop");
    c.run(300);
    assert_eq!(c.count(EventKind::BargeInResume), 0, "{:?}", c.events());
    assert_eq!(c.asked().last().map(String::as_str), Some("wait, stop"));
}

/// A short burst over the agent that never reaches the stop (held, then released when it
/// ends), whose words come as a turn once it is over: the recogniser reports a word when it
/// has been said, which is when the burst ends, so the hold cannot hear it.
fn short_burst_then_turn(c: &mut Call, text: &str) {
    short_burst(c);
    c.final_text(text);
    c.run(300);
}

/// 144 ms of voice over the agent: held, then released when it ends, with no stop.
fn short_burst(c: &mut Call) {
    c.speech_start();
    c.voiced(144);
    assert!(c.mouth.is_held(), "held");
    c.speech_end();
    assert!(!c.mouth.is_held(), "released");
    assert!(!c.did(&Action::Clear));
}

#[test]
fn one_real_word_after_a_short_burst_stops_the_agent_and_waits_for_the_rest() {
    // The suite's "wait, stop" with words-only stops: "wait," is over before any stop.
    let mut c = Call::replying("");
    short_burst_then_turn(&mut c, "wait,");
    assert_eq!(
        c.count(EventKind::BackchannelIgnored),
        0,
        "{:?}",
        c.events()
    );
    assert_eq!(c.details(EventKind::TurnHeld), vec!["barge_in wait,"]);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["words=wait,"]);
    assert!(c.did(&Action::Clear), "the agent is stopped");
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    // "stop" after the pause: with "wait," that is two words, an interruption.
    c.speech_start();
    c.voiced(100);
    c.step(Input::Interim("stop".into()));
    assert_eq!(c.count(EventKind::BargeInCommit), 1, "{:?}", c.events());
    c.run(100);
    c.speech_end();
    c.final_text("stop");
    c.run(300);
    assert_eq!(c.asked().last().map(String::as_str), Some("wait, stop"));
    assert_eq!(c.policy.phase(), Phase::Thinking);
}

#[test]
fn one_real_word_alone_after_a_short_burst_resumes_at_the_deadline() {
    let mut c = Call::replying("");
    short_burst_then_turn(&mut c, "sorry");
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    c.run(1000);
    assert_eq!(c.count(EventKind::BargeInResume), 1, "{:?}", c.events());
    assert_eq!(c.policy.phase(), Phase::Speaking);
    assert!(c.brain_starts().is_empty());
}

#[test]
fn a_short_burst_of_backchannel_or_the_agents_own_word_does_not_stop_the_agent() {
    for text in ["yeah", "mm hmm", "evening", "noon."] {
        // "evening": one word of what the agent is saying ("We close at ten in the
        // evening."), "noon.": of the sentence that has just played (its echo, transcribed
        // late): the echo or the caller's, no evidence either way.
        let mut c = Call::replying("");
        short_burst_then_turn(&mut c, text);
        assert_eq!(
            c.count(EventKind::BargeInStop),
            0,
            "{text}: {:?}",
            c.events()
        );
        assert!(!c.did(&Action::Clear), "{text}");
        assert_eq!(
            c.details(EventKind::BackchannelIgnored),
            vec![text.to_string()]
        );
        assert_eq!(c.policy.phase(), Phase::Speaking, "{text}");
    }
}

#[test]
fn the_echo_of_a_sentence_that_has_finished_playing_is_still_echo() {
    // A recogniser with a lag: the words of the first sentence's echo come as a turn while
    // the second sentence plays (the first was confirmed played before they came).
    let mut c = Call::replying("");
    short_burst_then_turn(&mut c, "every day from noon.");
    assert_eq!(
        c.details(EventKind::EchoIgnored),
        vec!["every day from noon."],
        "{:?}",
        c.events()
    );
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert!(c.brain_starts().is_empty());
    assert_eq!(c.policy.phase(), Phase::Speaking);
}

#[test]
fn a_real_word_that_comes_as_its_burst_ends_stops_the_agent_at_once() {
    let mut c = Call::replying("");
    short_burst(&mut c);
    // The recogniser's interim for the word comes as the burst ends, long before the turn.
    c.step(Input::Interim("wait".into()));
    assert_eq!(c.details(EventKind::BargeInStop), vec!["words=wait"]);
    assert!(c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::TurnEnd), 0, "before the end of the turn");
    // A backchannel in the same place does not.
    let mut c = Call::replying("");
    short_burst(&mut c);
    c.step(Input::Interim("uh huh".into()));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert!(!c.did(&Action::Clear));
}
