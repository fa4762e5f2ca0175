//! End-of-turn cases where our detector and the speech-to-text disagree, on the
//! simulated clock of [`super`]: the STT ending a segment while our detector bridges
//! the pause must not make two turns of one, and a detector that never stops (babble) must
//! not keep a turn open for ever.

use super::*;

/// An answered call (greeting played) whose speech-to-text endpoints after 300 ms of silence,
/// like Deepgram as patterd configures it: a `speech_final` proves that much silence.
fn call(extra: &str) -> Call {
    let mut c = Call::ringing(extra);
    c.policy = Policy::new(agent(extra), 300, false, c.now);
    c.mouth = Mouth::new();
    c.synthesised.clear();
    c.requested.clear();
    c.step(Input::Start);
    c.answer();
    c.run(1500);
    assert_eq!(c.policy.phase(), Phase::Idle);
    c.log.clear();
    c
}

fn interim(c: &mut Call, text: &str) {
    c.step(Input::Interim(text.into()));
}

fn fin(c: &mut Call, text: &str, speech_final: bool) {
    c.step(Input::Final {
        text: text.into(),
        speech_final,
        from_finalize: false,
    });
}

#[test]
fn a_segment_the_stt_ends_while_our_detector_bridges_the_pause_is_one_turn() {
    // The measured sequence: Deepgram ends "I would like a table" (speech_final) while our
    // detector still says speech; the caller goes on, the interim of the new words arrives,
    // our detector stops, and the final of those words follows 40 ms later.
    let mut c = call("");
    c.speech_start();
    c.voiced(100);
    c.run(900);
    fin(&mut c, "I would like a table", true);
    c.run(400);
    interim(&mut c, "for two");
    c.run(300);
    c.speech_end();
    assert_eq!(
        c.count(EventKind::TurnEnd),
        0,
        "the old end signal is stale"
    );
    c.run(40);
    fin(&mut c, "for two please", true);
    c.run(3000);
    assert_eq!(c.asked(), vec!["I would like a table for two please"]);
    assert_eq!(
        c.details(EventKind::TurnEnd),
        vec!["speech_final silence_ms=300"]
    );
}

#[test]
fn voice_after_the_stts_end_disarms_it_even_before_any_interim() {
    // Short new words: our detector hears them before the STT sends anything for them.
    let mut c = call("");
    c.speech_start();
    c.voiced(100);
    c.run(900);
    fin(&mut c, "I would like a table", true);
    c.run(250);
    c.speech_end();
    assert_eq!(c.count(EventKind::TurnEnd), 0, "voice after the STT's end");
    c.run(200);
    fin(&mut c, "thanks", true);
    c.run(3000);
    assert_eq!(c.asked(), vec!["I would like a table thanks"]);
}

#[test]
fn a_turn_committed_on_an_interim_owns_its_words_when_their_final_comes() {
    // The STT never ends the segment: the maximum commits the interim; its final arrives
    // later and is not a second turn; words after it are.
    let mut c = call("idle_nudge_after_s = 0");
    c.speech_start();
    c.voiced(100);
    c.run(500);
    interim(&mut c, "so I was thinking");
    c.speech_end();
    c.run(3000);
    assert_eq!(c.asked(), vec!["so I was thinking"]);
    assert_eq!(
        c.details(EventKind::TurnEnd),
        vec!["max_endpointing silence_ms=3000"]
    );
    // A late interim and then the final of the same words: no new turn.
    interim(&mut c, "so I was thinking");
    fin(&mut c, "so I was thinking", true);
    c.run(3000);
    assert_eq!(c.asked().len(), 1, "{:?}", c.asked());
    // A final of the same segment that goes on: only the new words are the next turn.
    let mut c = call("idle_nudge_after_s = 0");
    c.speech_start();
    c.voiced(100);
    c.run(500);
    interim(&mut c, "so I was thinking");
    c.speech_end();
    c.run(3000);
    c.step(Input::Llm(LlmEvent::Delta("Go on.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(1500);
    fin(&mut c, "so I was thinking about Friday", true);
    c.run(3000);
    assert_eq!(c.asked()[1..], ["about Friday".to_string()]);
}

#[test]
fn the_stts_end_commits_when_our_detector_says_speech_for_too_long() {
    // Babble: our detector never stops; the STT ended the utterance and heard nothing since.
    let mut c = call("stt_eou_override_ms = 1200");
    c.speech_start();
    c.voiced(100);
    c.run(800);
    fin(&mut c, "what time do you open", true);
    c.run(1199);
    assert_eq!(c.count(EventKind::TurnEnd), 0, "not before the bound");
    c.run(1);
    assert_eq!(c.asked(), vec!["what time do you open"]);
    assert_eq!(
        c.details(EventKind::TurnEnd),
        vec!["stt_eou_override silence_ms=1200"]
    );
    // The same from an UtteranceEnd.
    let mut c = call("stt_eou_override_ms = 1200");
    c.speech_start();
    c.voiced(100);
    c.run(800);
    fin(&mut c, "what time do you open", false);
    c.step(Input::UtteranceEnd);
    c.run(1200);
    assert_eq!(c.asked(), vec!["what time do you open"]);
    // New words after the STT's end restart the bound.
    let mut c = call("stt_eou_override_ms = 1200");
    c.speech_start();
    c.voiced(100);
    c.run(800);
    fin(&mut c, "what time", true);
    c.run(1000);
    interim(&mut c, "do you");
    c.run(1000);
    assert_eq!(c.count(EventKind::TurnEnd), 0);
    fin(&mut c, "do you open", true);
    c.run(1200);
    assert_eq!(c.asked(), vec!["what time do you open"]);
    // 0 turns the bound off: only our detector's silence ends the turn.
    let mut c = call("stt_eou_override_ms = 0");
    c.speech_start();
    c.voiced(100);
    c.run(800);
    fin(&mut c, "what time do you open", true);
    c.run(5000);
    assert!(c.asked().is_empty());
}

/// A speech-to-text that ends turns itself (Deepgram Flux, AssemblyAI): its end on a head
/// that cannot end there is vetoed; the rest, in its next turn, makes one turn with it.
fn stt_ends_turns(extra: &str) -> Call {
    let mut c = Call::answered(extra);
    c.step(Input::SttChanged { ends_turns: true });
    c
}

#[test]
fn the_stts_end_of_turn_on_an_unfinished_head_waits_for_the_rest() {
    let mut c = stt_ends_turns("");
    c.step(Input::Interim("I want to".into()));
    c.step(Input::EndOfTurn("I want to".into()));
    assert_eq!(
        c.details(EventKind::TurnHeld),
        vec!["end_of_turn unfinished"]
    );
    assert!(c.asked().is_empty(), "not sent to the brain");
    c.run(900);
    c.step(Input::Interim("cancel the premium plan".into()));
    c.step(Input::EndOfTurn("cancel the premium plan".into()));
    assert_eq!(c.asked(), vec!["I want to cancel the premium plan"]);
    assert_eq!(c.details(EventKind::TurnEnd), vec!["end_of_turn"]);
}

#[test]
fn a_vetoed_head_with_nothing_after_it_is_the_turn_when_the_hold_ends() {
    let mut c = stt_ends_turns("unfinished_hold_ms = 1500");
    c.step(Input::EndOfTurn("I was wondering if you could".into()));
    c.run(1499);
    assert!(c.asked().is_empty());
    c.run(1);
    assert_eq!(c.asked(), vec!["I was wondering if you could"]);
    assert_eq!(c.details(EventKind::TurnEnd), vec!["end_of_turn held"]);
    assert!(!c.did(&Action::Finalize), "the caller was silent");
}

#[test]
fn a_number_in_groups_holds_the_stts_end_up_to_the_maximum() {
    let mut c = stt_ends_turns("");
    c.step(Input::EndOfTurn("my number is four one five".into()));
    assert_eq!(c.details(EventKind::TurnHeld), vec!["end_of_turn digits"]);
    c.run(2000);
    c.step(Input::EndOfTurn("five five five".into()));
    c.run(2000);
    assert!(c.asked().is_empty(), "{:?}", c.events());
    c.step(Input::EndOfTurn("zero one zero zero".into()));
    assert_eq!(
        c.asked(),
        vec!["my number is four one five five five five zero one zero zero"]
    );
}

#[test]
fn a_hold_that_ends_while_the_caller_talks_asks_the_stt_to_end_its_turn() {
    let mut c = stt_ends_turns("unfinished_hold_ms = 800");
    c.step(Input::EndOfTurn("I need to".into()));
    c.run(300);
    // The caller goes on, and is still talking when the hold ends.
    c.speech_start();
    c.step(Input::Interim("change the booking for".into()));
    c.run(500);
    assert!(c.did(&Action::Finalize), "ForceEndTurn / ForceEndpoint");
    assert_eq!(c.details(EventKind::FinalizeSent), vec!["end_of_turn"]);
    assert!(c.asked().is_empty());
    // What the speech-to-text ends on is taken whole, even though it ends on "for".
    c.step(Input::EndOfTurn("change the booking for".into()));
    assert_eq!(c.asked(), vec!["I need to change the booking for"]);
}

#[test]
fn a_speculation_on_the_rest_of_a_held_head_answers_the_whole_turn() {
    let mut c = Call::answered("");
    c.policy = std::mem::replace(&mut c.policy, Policy::new(agent(""), 0, false, c.now))
        .with_stt_turns(true);
    c.step(Input::EagerEndOfTurn("I want to".into()));
    c.step(Input::EndOfTurn("I want to".into()));
    assert_eq!(
        c.details(EventKind::SpeculationCancelled),
        vec!["turn_held"]
    );
    c.step(Input::EagerEndOfTurn("cancel my plan".into()));
    assert_eq!(
        c.brain_starts()
            .last()
            .and_then(|h| h.last().map(|m| m.content.clone())),
        Some("I want to cancel my plan".into())
    );
    c.step(Input::EndOfTurn("cancel my plan".into()));
    assert_eq!(c.count(EventKind::SpeculationUsed), 1);
}
