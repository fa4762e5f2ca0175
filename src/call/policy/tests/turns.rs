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
