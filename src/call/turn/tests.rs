//! The endpointer's and the word checks' unit tests.

use super::*;

/// The caller speaks from `t0` until `end_ms`, then the STT's final `text`
/// (`speech_final` as given) arrives at `final_ms`.
fn spoke(
    e: &mut Endpointer,
    t0: Instant,
    end_ms: u64,
    text: &str,
    speech_final: bool,
    final_ms: u64,
) {
    e.on_speech_start(t0);
    e.on_speech_end(t0 + Duration::from_millis(end_ms));
    e.on_final(
        text,
        speech_final,
        false,
        t0 + Duration::from_millis(final_ms),
    );
}

fn bc() -> Words {
    Words::new(&crate::config::schema::default_backchannel_words())
}

#[test]
fn backchannels_are_not_content() {
    let w = bc();
    assert_eq!(w.content_words("Mm-hmm."), 0);
    assert_eq!(w.content_words("mm hmm, yeah okay"), 0);
    assert_eq!(w.content_words("uh-huh"), 0);
    assert_eq!(w.content_words("wait, stop"), 2);
    assert_eq!(w.content_words("No, I meant Tuesday."), 4);
}

#[test]
fn echo_matches_the_agents_current_words() {
    let w = bc();
    let agent = "We are open every day from noon until ten in the evening.";
    assert!(w.is_echo("open every day from noon", agent));
    assert!(!w.is_echo("no I meant Tuesday", agent));
    assert!(!w.is_echo("noon", agent), "one word is not enough");
}

#[test]
fn unfinished_sentences_are_spotted() {
    assert!(looks_unfinished("I need to"));
    assert!(looks_unfinished("I was wondering if"));
    assert!(looks_unfinished("Could you check whether"));
    assert!(!looks_unfinished("move it to the afternoon."));
    assert!(!looks_unfinished("I haven't been there since."));
}

#[test]
fn commits_on_speech_final_after_min_silence() {
    let t0 = Instant::now();
    let mut e = Endpointer::new(300, 3000);
    spoke(&mut e, t0, 1000, "book a table", true, 1100);
    assert_eq!(
        e.decide(t0 + Duration::from_millis(1100)),
        Decision::Wait(Some(t0 + Duration::from_millis(1300)))
    );
    match e.decide(t0 + Duration::from_millis(1300)) {
        Decision::Commit { text, reason, .. } => {
            assert_eq!(text, "book a table");
            assert_eq!(reason, TurnEnd::SpeechFinal);
        }
        d => panic!("{d:?}"),
    }
    assert!(!e.has_text());
}

#[test]
fn speech_final_counts_the_stts_own_endpointing_silence() {
    let t0 = Instant::now();
    // Deepgram waited 300 ms of silence; our detector saw the speech end later.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    spoke(&mut e, t0, 1150, "book a table", true, 1300);
    match e.decide(t0 + Duration::from_millis(1300)) {
        Decision::Commit { reason, .. } => assert_eq!(reason, TurnEnd::SpeechFinal),
        d => panic!("{d:?}"),
    }
    // It survives the reset that follows a commit.
    e.on_speech_start(t0 + Duration::from_millis(2000));
    e.on_speech_end(t0 + Duration::from_millis(2150));
    e.on_final("again", true, false, t0 + Duration::from_millis(2300));
    assert!(matches!(
        e.decide(t0 + Duration::from_millis(2300)),
        Decision::Commit { .. }
    ));
    // A short provider endpointing does not lift the floor.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(10);
    spoke(&mut e, t0, 1000, "book a table", true, 1020);
    assert!(matches!(
        e.decide(t0 + Duration::from_millis(1020)),
        Decision::Wait(Some(_))
    ));
    // Nor does it count for an utterance end, which proves no particular silence.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    spoke(&mut e, t0, 1000, "book a table", false, 1010);
    e.on_utterance_end(t0 + Duration::from_millis(1010));
    assert!(matches!(
        e.decide(t0 + Duration::from_millis(1050)),
        Decision::Wait(Some(_))
    ));
}

#[test]
fn finalizes_when_our_detector_is_sure_then_commits_on_the_answer() {
    let t0 = Instant::now();
    let mut e = Endpointer::new(300, 3000);
    e.on_speech_start(t0);
    e.on_interim("change the booking", t0 + Duration::from_millis(500));
    e.on_speech_end(t0 + Duration::from_millis(900));
    assert_eq!(
        e.decide(t0 + Duration::from_millis(1200)),
        Decision::Finalize
    );
    e.on_final(
        "change my booking",
        false,
        true,
        t0 + Duration::from_millis(1250),
    );
    assert!(matches!(
        e.decide(t0 + Duration::from_millis(1250)),
        Decision::Commit {
            reason: TurnEnd::Finalize,
            ..
        }
    ));
}

/// A voiced run without words (a cough, the agent's echo) long before the caller's first
/// words: those words do not find the turn already silent for a second and finalize at
/// once; the pause is counted from them.
#[test]
fn the_first_words_long_after_a_wordless_run_are_not_cut() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000);
    e.on_speech_start(ms(0));
    e.on_speech_end(ms(300));
    assert_eq!(
        e.decide(ms(1000)),
        Decision::Wait(None),
        "no words: no turn"
    );
    // The caller's first words arrive 1.4 s after that run, before our detector's start.
    e.on_interim("I would", ms(1700));
    assert_eq!(e.decide(ms(1700)), Decision::Wait(Some(ms(2000))));
    e.on_speech_start(ms(1650));
    e.on_interim("I would like to book", ms(2100));
    assert_eq!(e.decide(ms(2100)), Decision::Wait(None));
    // Within the STT's latency, words after a recent run still count from that run.
    let mut e = Endpointer::new(300, 3000);
    e.on_speech_start(ms(0));
    e.on_speech_end(ms(300));
    e.on_interim("yes", ms(500));
    assert_eq!(e.decide(ms(600)), Decision::Finalize);
}

#[test]
fn a_pause_after_an_unfinished_phrase_waits_and_speech_resumes_the_turn() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000);
    e.on_speech_start(t0);
    e.on_speech_end(ms(600));
    e.on_final("I need to", true, false, ms(700));
    assert_eq!(e.decide(ms(1000)), Decision::Wait(Some(ms(3600))));
    e.on_speech_start(ms(1800));
    e.on_speech_end(ms(3000));
    e.on_final("move it to the afternoon", true, false, ms(3100));
    match e.decide(ms(3300)) {
        Decision::Commit { text, .. } => {
            assert_eq!(text, "I need to move it to the afternoon")
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn max_endpointing_commits_whatever_there_is() {
    let t0 = Instant::now();
    let mut e = Endpointer::new(300, 3000);
    e.on_interim("so I was", t0);
    assert!(matches!(
        e.decide(t0 + Duration::from_millis(3000)),
        Decision::Commit {
            reason: TurnEnd::MaxEndpointing,
            ..
        }
    ));
}

#[test]
fn only_words_that_really_continue_hold_the_turn() {
    for held in [
        "I need to",
        "a table for",
        "it is",
        "my name is",
        "salmon and",
        "the one with the",
        "I was thinking um",
    ] {
        assert!(looks_unfinished(held), "{held}");
    }
    for done in [
        "can you repeat that",
        "turn it on",
        "I think so",
        "what are you looking at",
        "come in",
        "move it to the afternoon.",
        "yes",
    ] {
        assert!(!looks_unfinished(done), "{done}");
    }
}

#[test]
fn an_unfinished_phrase_waits_for_the_hold_not_the_maximum() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000).with_unfinished_hold(1500);
    spoke(&mut e, t0, 600, "I need to", true, 900);
    assert_eq!(e.decide(ms(900)), Decision::Wait(Some(ms(2100))));
    match e.decide(ms(2100)) {
        Decision::Commit { text, reason, .. } => {
            assert_eq!(text, "I need to");
            assert_eq!(reason, TurnEnd::SpeechFinal);
        }
        d => panic!("{d:?}"),
    }
    // Without an end from the speech-to-text, the hold asks it to finalize.
    let mut e = Endpointer::new(300, 3000).with_unfinished_hold(1500);
    e.on_speech_start(t0);
    e.on_interim("a table for", ms(400));
    e.on_speech_end(ms(600));
    assert_eq!(e.decide(ms(900)), Decision::Wait(Some(ms(2100))));
    assert_eq!(e.decide(ms(2100)), Decision::Finalize);
    // A complete sentence ending in "that" commits at the minimum.
    let mut e = Endpointer::new(300, 3000).with_unfinished_hold(1500);
    spoke(&mut e, t0, 600, "can you repeat that", true, 900);
    assert!(matches!(e.decide(ms(900)), Decision::Commit { .. }));
    // The hold stays within min..=max.
    let e = Endpointer::new(300, 1000).with_unfinished_hold(5000);
    assert_eq!(e.unfinished_hold, Duration::from_millis(1000));
}

#[test]
fn a_stale_end_of_utterance_is_disarmed_by_new_words_or_voice() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    e.on_speech_start(t0);
    e.on_final("book a table", true, false, ms(900));
    e.on_interim("for two", ms(1300));
    e.on_speech_end(ms(1600));
    assert_eq!(e.decide(ms(1600)), Decision::Wait(Some(ms(1900))));
    // An is_final without speech_final does not end the utterance either.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    e.on_speech_start(t0);
    e.on_final("book a table", false, false, ms(900));
    e.on_utterance_end(ms(950));
    e.on_final("for two", false, false, ms(1300));
    e.on_speech_end(ms(1250));
    assert_eq!(e.decide(ms(1550)), Decision::Finalize, "not a commit");
    // Voice after the end, no words yet.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    e.on_speech_start(t0);
    e.on_final("book a table", true, false, ms(900));
    e.on_speech_end(ms(1100));
    assert_eq!(e.decide(ms(1100)), Decision::Wait(Some(ms(1400))));
    // Voice that ended before the end arrived leaves it armed.
    let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
    e.on_speech_start(t0);
    e.on_speech_end(ms(800));
    e.on_final("book a table", true, false, ms(900));
    assert!(matches!(e.decide(ms(900)), Decision::Commit { .. }));
}

#[test]
fn words_owed_to_a_committed_turn_are_not_a_new_one() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000);
    e.on_interim("so I was", ms(0));
    assert!(matches!(e.decide(ms(3000)), Decision::Commit { .. }));
    e.on_interim("so I was", ms(3100));
    assert!(!e.has_text(), "an interim of the committed words");
    e.on_final("so I was", true, false, ms(3200));
    assert!(!e.has_text(), "their final");
    assert_eq!(e.decide(ms(3200)), Decision::Wait(None));
    // The next segment is a turn again.
    e.on_final("thinking", true, false, ms(4000));
    assert_eq!(e.text(), "thinking");
    // After OWED_FOR the words are no longer owed.
    let mut e = Endpointer::new(300, 3000);
    e.on_interim("so I was", ms(0));
    assert!(matches!(e.decide(ms(3000)), Decision::Commit { .. }));
    e.on_final("hello there", true, false, ms(9000));
    assert_eq!(e.text(), "hello there");
}

#[test]
fn the_stts_end_wins_after_the_override_bound() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000).with_stt_eou_override(1500);
    e.on_speech_start(t0);
    e.on_final("what time do you open", true, false, ms(1000));
    assert_eq!(e.decide(ms(1000)), Decision::Wait(Some(ms(2500))));
    match e.decide(ms(2500)) {
        Decision::Commit {
            text,
            reason,
            silence_ms,
        } => {
            assert_eq!(text, "what time do you open");
            assert_eq!(reason, TurnEnd::SttEouOverride);
            assert_eq!(silence_ms, 1500);
        }
        d => panic!("{d:?}"),
    }
    // Our detector still says speech; the next utterance needs its own end.
    e.on_interim("and", ms(3000));
    assert_eq!(e.decide(ms(5000)), Decision::Wait(None));
    // Off by default.
    let mut e = Endpointer::new(300, 3000);
    e.on_speech_start(t0);
    e.on_final("what time do you open", true, false, ms(1000));
    assert_eq!(e.decide(ms(9000)), Decision::Wait(None));
}

#[test]
fn a_number_read_in_groups_is_one_turn_and_a_whole_one_ends_at_the_minimum() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000).with_unfinished_hold(2000);
    spoke(&mut e, t0, 1000, "my number is four one five", true, 1100);
    // Three digits of a ten-digit number: the pause may last up to the maximum.
    assert_eq!(e.decide(ms(1100)), Decision::Wait(Some(ms(4000))));
    assert_eq!(e.decide(ms(2400)), Decision::Wait(Some(ms(4000))));
    // The next group after a 1.4 s pause, then the last one after 1.2 s.
    spoke(&mut e, ms(2400), 600, "five five five", true, 700);
    assert_eq!(e.decide(ms(3100)), Decision::Wait(Some(ms(6000))));
    spoke(&mut e, ms(4200), 900, "zero one zero zero", true, 1000);
    // Whole: the normal silence ends it (300 ms after the speech ended at 5100).
    match e.decide(ms(5400)) {
        Decision::Commit { text, reason, .. } => {
            assert_eq!(
                text,
                "my number is four one five five five five zero one zero zero"
            );
            assert_eq!(reason, TurnEnd::SpeechFinal);
        }
        d => panic!("{d:?}"),
    }
    // A group nobody finishes is committed at the maximum, with what there is.
    let mut e = Endpointer::new(300, 3000);
    spoke(&mut e, t0, 1000, "my card number is 4111 1111", true, 1100);
    assert!(matches!(
        e.decide(ms(4000)),
        Decision::Commit {
            reason: TurnEnd::MaxEndpointing,
            ..
        }
    ));
    // A complete sentence still ends at the minimum.
    let mut e = Endpointer::new(300, 3000);
    spoke(
        &mut e,
        t0,
        1000,
        "I would like a table for two at seven.",
        true,
        1100,
    );
    assert!(matches!(e.decide(ms(1300)), Decision::Commit { .. }));
}

#[test]
fn a_spelled_address_waits_for_its_domain() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut e = Endpointer::new(300, 3000);
    spoke(
        &mut e,
        t0,
        1500,
        "my email is j o h n at example",
        true,
        1600,
    );
    assert_eq!(e.decide(ms(1800)), Decision::Wait(Some(ms(4500))));
    spoke(&mut e, ms(2500), 500, "dot com", true, 600);
    assert!(matches!(e.decide(ms(3300)), Decision::Commit { .. }));
}
