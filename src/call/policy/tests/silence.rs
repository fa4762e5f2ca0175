//! No silent stop: whatever holds the agent's audio back (the barge-in hold, a stop that
//! commits no turn) ends within `hold_max_ms` in something the caller hears — the reply
//! resumed, or a turn — even when the voice detector never turns off (babble, 10 dB noise).
//!
//! What went wrong before: the hold always let go within 600 ms, but a stop's resume was
//! followed at once by another stop on the same run's duration (it was already past
//! `barge_in_min_speech_ms`), so with a detector that stays on the agent stopped, resumed for
//! a frame and stopped again every `barge_in_confirm_ms`, re-sending the sentence it had cut
//! from its start each time: the reply never got further. A run's duration is now judged
//! once: after the resume only a real word in it stops the agent again.

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

use super::*;

/// What the speech-to-text says during the run.
#[derive(Debug, Clone)]
enum Stt {
    Interim(&'static str),
    Final(&'static str, bool),
    UtteranceEnd,
}

const TEXTS: &[&str] = &[
    "mm hmm",
    "yeah",
    "okay",
    "uh huh",
    "wait,",
    "evening",
    "open every day",
    "no I meant Tuesday",
    "",
];

/// The agent's audio is held back from the caller: held, or paused by a stop.
fn silenced(c: &Call) -> bool {
    c.mouth.is_held() || c.mouth.is_paused()
}

/// Decisions the caller hears: the reply sent on again, or the agent's turn ended.
fn decisions(c: &Call) -> usize {
    c.count(EventKind::BargeInResume)
        + c.count(EventKind::BargeInHoldReleased)
        + c.count(EventKind::Interrupted)
}

/// The caller's detector turns on over the reply and never turns off (`pitched`: a voice, or
/// noise); the speech-to-text says `stt` at those frames. Returns the longest stretch the
/// agent's audio was held back with no decision, and the call.
fn longest_silence(pitched: bool, stt: &[(usize, Stt)], frames: usize) -> (Duration, Call) {
    let mut c = Call::replying("");
    c.speech_start();
    let mut since: Option<Instant> = None;
    let mut seen = decisions(&c);
    let mut worst = Duration::ZERO;
    let mut run = 64;
    for i in 0..frames {
        c.run(16);
        if pitched {
            c.voiced(run);
        } else {
            c.unpitched(run);
        }
        run += 16;
        for (_, ev) in stt.iter().filter(|(at, _)| *at == i) {
            match ev {
                Stt::Interim(t) => c.step(Input::Interim((*t).into())),
                Stt::Final(t, sf) => c.step(Input::Final {
                    text: (*t).into(),
                    speech_final: *sf,
                    from_finalize: false,
                }),
                Stt::UtteranceEnd => c.step(Input::UtteranceEnd),
            }
        }
        let now_seen = decisions(&c);
        if now_seen > seen {
            // A decision since the last frame: a new stretch starts if the audio is held again.
            since = None;
            seen = now_seen;
        }
        if silenced(&c) {
            let at = *since.get_or_insert(c.now);
            worst = worst.max(c.now - at);
        } else {
            since = None;
        }
    }
    (worst, c)
}

/// The bound: `hold_max_ms` (1200) and one detector frame.
const BOUND: Duration = Duration::from_millis(1200 + 16);

/// Before: stop, resume for a frame, stop again, for as long as the detector stayed on; the
/// reply never played past the sentence it had cut.
#[test]
fn a_voice_that_never_ends_stops_the_agent_once_then_the_reply_plays_on() {
    let (worst, c) = longest_silence(true, &[], 300);
    assert_eq!(
        c.details(EventKind::BargeInStop),
        vec!["speech_ms=208"],
        "{:#?}",
        c.events()
    );
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["no_words after_ms=1000"]
    );
    assert!(worst <= BOUND, "{worst:?}");
    // The sentences the stop withdrew play to their marks while the detector is still on.
    let played = c.details(EventKind::MarkPlayed);
    assert!(played.iter().any(|m| m.starts_with("u4")), "{played:?}");
    assert_eq!(c.policy.phase(), Phase::Idle, "the reply has played out");
    assert_eq!(c.count(EventKind::LlmRequest), 0, "no turn was taken");
}

/// A real word over the agent still stops it after the resume.
#[test]
fn after_the_resume_a_real_word_in_the_same_run_still_stops_the_agent() {
    let stt = [(100, Stt::Interim("no I meant Tuesday"))];
    let (worst, c) = longest_silence(true, &stt, 160);
    assert_eq!(c.count(EventKind::BargeInStop), 2, "{:#?}", c.events());
    assert_eq!(c.count(EventKind::BargeInCommit), 1);
    assert_eq!(c.count(EventKind::Interrupted), 1);
    assert!(worst <= BOUND, "{worst:?}");
}

/// "wait," said while the detector stays on: the stop on duration resumes after the window
/// (no words yet); the word's turn ends on the recogniser's end (`stt_eou_override_ms`) and
/// stops the agent again; the caller never stops "talking", and at `hold_max_ms` after that
/// stop the word is taken as the caller's turn rather than the agent left silent.
#[test]
fn a_real_word_over_a_detector_that_stays_on_becomes_a_turn_at_the_bound() {
    let mut c = Call::replying("");
    c.speech_start();
    let mut run = 64;
    for _ in 0..10 {
        c.run(16);
        c.voiced(run);
        run += 16;
    }
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    c.final_text("wait,");
    c.step(Input::UtteranceEnd);
    let mut worst = Duration::ZERO;
    let mut since = None;
    for _ in 0..220 {
        c.run(16);
        c.voiced(run);
        run += 16;
        if silenced(&c) {
            worst = worst.max(c.now - *since.get_or_insert(c.now));
        } else {
            since = None;
        }
    }
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["no_words after_ms=1000"],
        "{:#?}",
        c.events()
    );
    assert_eq!(
        c.details(EventKind::BargeInStop),
        vec!["speech_ms=208", "words=wait,"]
    );
    let commits = c.details(EventKind::BargeInCommit);
    assert_eq!(commits, vec!["hold_max after_ms=1200"], "{:#?}", c.events());
    assert_eq!(c.asked().last().map(String::as_str), Some("wait,"));
    assert!(worst <= BOUND, "{worst:?}");
}

/// The property's second find: a backchannel keeps the hold past the stop threshold, then a
/// real word stops the agent 240 ms into the hold; the resume is due `hold_max_ms` after the
/// hold began, not a whole window after the stop.
#[test]
fn a_stop_after_a_long_hold_resumes_within_the_bound_of_the_hold() {
    let stt = [(0, Stt::Interim("mm hmm")), (17, Stt::Interim("evening"))];
    let (worst, c) = longest_silence(true, &stt, 200);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=352"]);
    let resumed = c.details(EventKind::BargeInResume);
    assert_eq!(resumed.len(), 1, "{:#?}", c.events());
    assert!(resumed[0].starts_with("no_words after_ms=9"), "{resumed:?}");
    assert!(worst <= BOUND, "{worst:?}");
}

/// The hold lets go on its own deadline when no caller audio comes to judge it (the media
/// stalled with the detector's run open).
#[test]
fn a_hold_is_released_when_caller_audio_stops_coming() {
    let mut c = Call::replying("");
    c.speech_start();
    let mut run = 64;
    while !c.mouth.is_held() {
        c.run(16);
        c.voiced(run);
        run += 16;
    }
    c.step(Input::Interim("mm hmm".into()));
    // No more notes from the caller-audio stage.
    c.run(800);
    assert_eq!(
        c.details(EventKind::BargeInHoldReleased),
        vec!["too_long after_ms=600"]
    );
    assert!(!c.mouth.is_held());
}

fn stt_event() -> impl Strategy<Value = (usize, Stt)> {
    let text = proptest::sample::select(TEXTS);
    (
        0usize..200,
        prop_oneof![
            text.clone().prop_map(Stt::Interim),
            (text, any::<bool>()).prop_map(|(t, sf)| Stt::Final(t, sf)),
            Just(Stt::UtteranceEnd),
        ],
    )
}

/// 96 cases on a fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise.
fn config() -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: env("PROPTEST_CASES").map_or(96, |c| c as u32),
        rng_seed: match env("PROPTEST_RNG_SEED") {
            Some(s) => RngSeed::Fixed(s),
            None if env("PROPTEST_CASES").is_some() => RngSeed::Random,
            None => RngSeed::Fixed(0x6e6f_7369_6c65_6e74),
        },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The invariant: over a detector that never turns off, with any words at any time,
    /// the agent's audio is never held back longer than `hold_max_ms` without a decision.
    #[test]
    fn the_agent_is_never_silenced_past_hold_max(
        pitched in any::<bool>(),
        stt in proptest::collection::vec(stt_event(), 0..6),
    ) {
        let (worst, c) = longest_silence(pitched, &stt, 220);
        prop_assert!(worst <= BOUND, "{worst:?} {:#?}", c.events());
    }
}
