//! The barge-in hold on the simulated clock of [`super`]: a short burst over the
//! agent stops new audio going out but sends no `clear` and lets the agent go on; sustained
//! speech is stopped at `barge_in_min_speech_ms`; a backchannel final releases the hold.

use super::*;

/// One 16 ms detector frame later, with `run_ms` voiced so far in the run.
fn frame(c: &mut Call, run_ms: u64) {
    c.run(16);
    c.voiced(run_ms);
}

/// Voiced frames from the detector's start (64 ms) to `to_ms`, one per 16 ms.
fn speak(c: &mut Call, to_ms: u64) {
    c.speech_start();
    let mut run = 64;
    while run <= to_ms {
        frame(c, run);
        run += 16;
    }
}

#[test]
fn a_short_burst_holds_without_a_clear_and_the_agent_goes_on() {
    let mut c = Call::replying("");
    speak(&mut c, 160);
    assert_eq!(c.details(EventKind::BargeInHold), vec!["speech_ms=112"]);
    assert!(c.mouth.is_held(), "no new agent audio during the hold");
    assert!(
        c.mouth.is_playing(c.now),
        "the carrier plays on what it has"
    );
    assert!(c.mouth.next_deadline(c.now).is_none());
    c.speech_end();
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert_eq!(
        c.details(EventKind::BargeInHoldReleased),
        vec!["burst_ended after_ms=48"]
    );
    assert!(!c.mouth.is_held());
    assert_eq!(c.policy.phase(), Phase::Speaking);
    // The reply plays to its end with no cut.
    c.run(3000);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::MarkWithdrawn), 0);
    assert_eq!(
        c.details(EventKind::MarkPlayed),
        vec!["u3".to_string(), "u4".to_string()],
        "every sentence under its first mark"
    );
    assert_eq!(c.policy.phase(), Phase::Idle);
}

#[test]
fn sustained_speech_is_stopped_at_the_threshold() {
    let mut c = Call::replying("");
    speak(&mut c, 320);
    assert_eq!(c.count(EventKind::BargeInHold), 1);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=208"]);
    assert!(c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInHoldReleased), 0);
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    assert!(!c.mouth.is_playing(c.now), "paused");
    // The hold came first.
    let stop = c
        .log
        .iter()
        .position(|a| *a == Action::Clear)
        .expect("clear");
    let hold = c
        .log
        .iter()
        .position(|a| matches!(a, Action::Event(EventKind::BargeInHold, _)))
        .expect("hold");
    assert!(hold < stop);
}

#[test]
fn a_backchannel_final_during_the_hold_releases_it_for_the_burst() {
    let mut c = Call::replying("");
    speak(&mut c, 128);
    assert!(c.mouth.is_held());
    c.step(Input::Final {
        text: "mm-hmm".into(),
        speech_final: false,
        from_finalize: false,
    });
    assert_eq!(
        c.details(EventKind::BargeInHoldReleased),
        vec!["backchannel after_ms=16"]
    );
    assert!(!c.mouth.is_held());
    // The voiced run goes past the stop threshold: still no clear in this burst.
    for run in [144, 160, 176, 192, 208, 224, 240, 256] {
        frame(&mut c, run);
    }
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert_eq!(c.count(EventKind::BargeInHold), 1);
}

#[test]
fn real_words_during_the_hold_stop_the_agent_before_the_threshold() {
    let mut c = Call::replying("");
    speak(&mut c, 128);
    assert!(!c.did(&Action::Clear));
    c.step(Input::Interim("wait, stop".into()));
    assert!(c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    assert_eq!(c.count(EventKind::BargeInCommit), 1);
}

#[test]
fn a_laugh_with_gaps_is_not_stopped_and_the_hold_ends() {
    let mut c = Call::replying("");
    c.speech_start();
    // 16 ms voiced in every 48 ms: the run reaches 200 ms voiced at a third voiced.
    let mut run = 64;
    for _ in 0..30 {
        c.run(32);
        frame(&mut c, run);
        run += 16;
    }
    assert!(run > 400);
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert_eq!(c.count(EventKind::BargeInHold), 1);
    let released = c.details(EventKind::BargeInHoldReleased);
    assert_eq!(released.len(), 1);
    assert!(released[0].starts_with("too_long"), "{released:?}");
    assert!(!c.mouth.is_held());
}

#[test]
fn hold_off_stops_as_before() {
    let mut c = Call::replying("barge_in_hold_ms = 0");
    speak(&mut c, 192);
    assert_eq!(c.count(EventKind::BargeInHold), 0);
    assert!(!c.mouth.is_held());
    frame(&mut c, 208);
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=208"]);
}

/// Unpitched detector frames (a cough's noise) from the detector's start to `to_ms`.
fn cough(c: &mut Call, to_ms: u64) {
    c.speech_start();
    let mut run = 64;
    while run <= to_ms {
        c.run(16);
        c.unpitched(run);
        run += 16;
    }
}

#[test]
fn a_cough_without_a_pitch_holds_but_never_stops_on_its_duration() {
    let mut c = Call::replying("");
    cough(&mut c, 400);
    assert_eq!(c.count(EventKind::BargeInHold), 1);
    assert_eq!(
        c.count(EventKind::BargeInStop),
        0,
        "400 ms of noise is no voice"
    );
    assert!(!c.did(&Action::Clear));
    c.speech_end();
    assert_eq!(
        c.details(EventKind::BargeInHoldReleased),
        vec!["burst_ended after_ms=288"]
    );
    assert_eq!(c.policy.phase(), Phase::Speaking);
}

#[test]
fn a_noisy_onset_then_a_voice_stops_once_the_pitch_is_there() {
    let mut c = Call::replying("");
    cough(&mut c, 240);
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    // The vowel comes: pitched frames from here on; the stop needs 40 ms of them.
    c.run(16);
    c.step(Input::CallerAudio {
        speech_run_ms: 256,
        span_ms: 256,
        pitched_ms: 20,
        echo_ms: 0,
    });
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    c.run(16);
    c.step(Input::CallerAudio {
        speech_run_ms: 272,
        span_ms: 272,
        pitched_ms: 40,
        echo_ms: 0,
    });
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=272"]);
    assert!(c.did(&Action::Clear));
}

/// Caller audio that reaches the actor late (a busy machine: notes 48 ms apart for 16 ms of
/// audio each) is still one solid run in audio time: it is stopped at the threshold, not
/// mistaken for a laugh's gaps.
#[test]
fn late_notes_of_solid_speech_are_judged_in_audio_time() {
    let mut c = Call::replying("");
    c.speech_start();
    let mut run = 64;
    while run <= 320 && c.count(EventKind::BargeInStop) == 0 {
        c.run(48);
        c.step(Input::CallerAudio {
            speech_run_ms: run,
            span_ms: run,
            pitched_ms: run,
            echo_ms: 0,
        });
        run += 16;
    }
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=208"]);
    assert!(c.did(&Action::Clear));
}

/// Speech the agent's own echo explains never stops the agent on its duration; the caller's
/// own voice over it does, once there is enough of it.
#[test]
fn echo_does_not_count_towards_the_stop() {
    let mut c = Call::replying("");
    c.speech_start();
    for ms in (16..=800).step_by(16) {
        c.run(16);
        c.echoed(ms, ms);
    }
    assert_eq!(c.count(EventKind::BargeInStop), 0, "all echo");
    assert!(!c.did(&Action::Clear));
    c.speech_end();
    // The caller talks over the echo: a third of the run still explained by it.
    c.speech_start();
    let mut ms = 16;
    while ms <= 800 && c.count(EventKind::BargeInStop) == 0 {
        c.run(16);
        c.echoed(ms, ms / 3);
        ms += 16;
    }
    // 200 ms of the caller's own voice: 304 ms of run, 101 of it echo.
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=304"]);
    assert!(c.did(&Action::Clear));
}
