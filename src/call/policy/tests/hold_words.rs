//! The speech-to-text's words during the barge-in hold: a word that is neither a
//! backchannel nor the agent's own words stops the agent at once, before the duration
//! threshold; backchannels or echo so far keep the hold past it (no `clear`) until the burst
//! ends or lasts too long; words that come between runs do not carry into the next run.

use super::super::hold::Heard;
use super::*;
use crate::call::turn::Words;
use crate::config::schema::default_backchannel_words;

/// One 16 ms detector frame later, with `run_ms` voiced so far in the run.
fn frame(c: &mut Call, run_ms: u64) {
    c.run(16);
    c.voiced(run_ms);
}

/// Voiced frames from `from_ms` to `to_ms` of the run, one per 16 ms.
fn voiced(c: &mut Call, from_ms: u64, to_ms: u64) {
    let mut run = from_ms;
    while run <= to_ms {
        frame(c, run);
        run += 16;
    }
}

fn interim(c: &mut Call, text: &str) {
    c.step(Input::Interim(text.into()));
}

#[test]
fn words_are_classed_as_backchannel_echo_or_real() {
    let w = Words::new(&default_backchannel_words());
    let agent = "We close at ten in the evening.";
    assert_eq!(Heard::of(&w, "", agent), Heard::Nothing);
    assert_eq!(Heard::of(&w, "mm-hmm", agent), Heard::Backchannel);
    assert_eq!(Heard::of(&w, "uh huh yeah", agent), Heard::Backchannel);
    assert_eq!(
        Heard::of(&w, "we", agent),
        Heard::Nothing,
        "one word the agent says"
    );
    assert_eq!(
        Heard::of(&w, "hello", "Hello, how can I help?"),
        Heard::Nothing
    );
    assert_eq!(Heard::of(&w, "we close at", agent), Heard::Echo);
    assert_eq!(Heard::of(&w, "wait", agent), Heard::Words);
    assert_eq!(Heard::of(&w, "okay wait", agent), Heard::Words);
    assert_eq!(Heard::of(&w, "no I meant Tuesday", agent), Heard::Words);
}

#[test]
fn one_real_word_during_the_hold_stops_the_agent_before_the_threshold() {
    let mut c = Call::replying("");
    c.speech_start();
    voiced(&mut c, 64, 144);
    assert!(c.mouth.is_held());
    interim(&mut c, "wait");
    assert!(c.did(&Action::Clear), "stopped on the first real word");
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=144"]);
    // One word stops; committing the interruption still takes `barge_in_min_words` (2).
    assert_eq!(c.count(EventKind::BargeInCommit), 0);
    interim(&mut c, "wait stop");
    assert_eq!(c.count(EventKind::BargeInCommit), 1);
}

#[test]
fn a_backchannel_interim_keeps_the_hold_past_the_threshold_without_a_clear() {
    let mut c = Call::replying("");
    c.speech_start();
    voiced(&mut c, 64, 144);
    interim(&mut c, "mm");
    // Voiced well past `barge_in_min_speech_ms` (200): held, not stopped.
    voiced(&mut c, 160, 400);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert!(c.mouth.is_held(), "still holding");
    c.speech_end();
    assert!(!c.mouth.is_held());
    assert_eq!(
        c.details(EventKind::BargeInHoldReleased),
        vec!["burst_ended after_ms=288"]
    );
    c.step(Input::Final {
        text: "mm".into(),
        speech_final: true,
        from_finalize: false,
    });
    // The reply plays to its end: nothing was cut.
    c.run(3000);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::MarkWithdrawn), 0);
    assert_eq!(c.policy.phase(), Phase::Idle);
}

#[test]
fn a_real_word_after_a_backchannel_stops_the_agent() {
    let mut c = Call::replying("");
    c.speech_start();
    voiced(&mut c, 64, 144);
    interim(&mut c, "okay");
    voiced(&mut c, 160, 320);
    assert!(!c.did(&Action::Clear));
    interim(&mut c, "okay hold");
    assert!(c.did(&Action::Clear));
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=320"]);
}

#[test]
fn the_agents_own_words_keep_the_hold_until_it_lasts_too_long() {
    let mut c = Call::replying("");
    c.speech_start();
    voiced(&mut c, 64, 144);
    // The reply's second sentence ("We close at ten in the evening.") coming back.
    interim(&mut c, "we close");
    voiced(&mut c, 160, 1000);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    let released = c.details(EventKind::BargeInHoldReleased);
    assert_eq!(released.len(), 1);
    assert!(released[0].starts_with("too_long"), "{released:?}");
    assert!(!c.mouth.is_held(), "sending went on");
}

#[test]
fn words_after_a_run_ended_do_not_carry_into_the_next_one() {
    let mut c = Call::replying("");
    c.speech_start();
    voiced(&mut c, 64, 144);
    c.speech_end();
    // The backchannel's words arrive once its run is over.
    c.step(Input::Final {
        text: "yeah".into(),
        speech_final: false,
        from_finalize: false,
    });
    c.run(200);
    // A new run with no words yet: the duration decides, as without words.
    c.speech_start();
    voiced(&mut c, 64, 224);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=208"]);
    assert!(c.did(&Action::Clear));
}

#[test]
fn a_real_word_after_a_hold_released_as_too_long_still_stops_the_agent() {
    // Words decide alone (the duration never stops): a slow recogniser's first word comes
    // after the hold gave up; it must still stop the agent, in the same run.
    let mut c = Call::replying("barge_in_min_speech_ms = 3000");
    c.speech_start();
    voiced(&mut c, 64, 900);
    let released = c.details(EventKind::BargeInHoldReleased);
    assert_eq!(released.len(), 1, "{:?}", c.events());
    assert!(released[0].starts_with("too_long"), "{released:?}");
    assert!(!c.did(&Action::Clear), "no stop on duration");
    interim(&mut c, "could you");
    assert!(
        c.did(&Action::Clear),
        "stopped by the words: {:?}",
        c.events()
    );
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    assert_eq!(
        c.count(EventKind::BargeInCommit),
        1,
        "two real words commit it"
    );
}

#[test]
fn backchannels_after_a_hold_released_as_too_long_do_not_stop_the_agent() {
    let mut c = Call::replying("barge_in_min_speech_ms = 3000");
    c.speech_start();
    voiced(&mut c, 64, 900);
    interim(&mut c, "uh huh yeah");
    voiced(&mut c, 912, 1200);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
}
