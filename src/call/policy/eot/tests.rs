//! The gate with a fake model: the test plays the model's part by answering (or not) the
//! policy's `AskTurnModel` on a simulated clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::TurnModelTiming;
use crate::audio::vad::VadEvent;
use crate::call::eot::{TurnModelAnswer, Unavailable, Verdict};
use crate::call::event::EventKind;
use crate::call::mouth::Mouth;
use crate::call::policy::{Action, Input, Policy};
use crate::config::AgentConfig;

const TIMING: TurnModelTiming = TurnModelTiming {
    answer_wait: Duration::from_millis(200),
    finalize_grace: Duration::from_millis(200),
    incomplete_hold: Duration::from_millis(1500),
};

struct Call {
    policy: Policy,
    mouth: Mouth,
    t0: Instant,
    now: Instant,
    log: Vec<Action>,
}

impl Call {
    /// min_endpointing_ms = 300, max_endpointing_ms = 3000; no greeting.
    fn new(model: bool) -> Self {
        let agent: AgentConfig = toml::from_str(
            "llm = \"b\"\nstt = \"e\"\ntts = \"v\"\nmin_endpointing_ms = 300\n\
             max_endpointing_ms = 3000\nidle_nudge_after_s = 0.0",
        )
        .expect("agent");
        let now = Instant::now();
        let policy =
            Policy::new(Arc::new(agent), 0, false, now).with_turn_model(model.then_some(TIMING));
        let mut c = Self {
            policy,
            mouth: Mouth::new(),
            t0: now,
            now,
            log: Vec::new(),
        };
        c.step(Input::Start);
        c.step(Input::Answered);
        c
    }

    fn step(&mut self, input: Input) {
        self.policy.handle(input, self.now, &mut self.mouth);
        while let Some(a) = self.policy.poll_action() {
            self.log.push(a);
        }
    }

    /// Moves the clock to `ms` after the start, firing the policy's timers on the way.
    fn at(&mut self, ms: u64) {
        let end = self.t0 + Duration::from_millis(ms);
        while let Some(t) = self.policy.deadline(&self.mouth).filter(|t| *t <= end) {
            self.now = t.max(self.now);
            self.step(Input::Timer);
        }
        self.now = end;
    }

    /// The caller speaks from now for 400 ms and says `text` (the STT's final arrives with
    /// the end of speech, `speech_final` as given).
    fn says(&mut self, text: &str, speech_final: bool) {
        self.step(Input::Vad {
            event: VadEvent::SpeechStart { onset_ms: 0 },
            audio_ms: 0,
        });
        let ms = (self.now - self.t0).as_millis() as u64 + 400;
        self.at(ms);
        self.step(Input::Vad {
            event: VadEvent::SpeechEnd {
                onset_ms: 0,
                last_voiced_ms: 400,
            },
            audio_ms: 400,
        });
        self.step(Input::Final {
            text: text.into(),
            speech_final,
            from_finalize: false,
        });
    }

    fn asked(&self) -> Vec<u64> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::AskTurnModel { pause } => Some(*pause),
                _ => None,
            })
            .collect()
    }

    fn answer(&mut self, pause: u64, verdict: Verdict) {
        self.step(Input::TurnModel(TurnModelAnswer {
            pause,
            verdict,
            micros: 27_000,
        }));
    }

    fn details(&self, kind: EventKind) -> Vec<String> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Event(k, d) if *k == kind => Some(d.to_text()),
                _ => None,
            })
            .collect()
    }

    /// When (ms after the start) the turn was committed, and how.
    fn committed(&self) -> Option<String> {
        self.details(EventKind::TurnEnd).first().cloned()
    }
}

#[test]
fn without_a_model_nothing_is_asked_and_silence_decides() {
    let mut c = Call::new(false);
    c.says("book a table", true);
    c.at(1000);
    assert!(c.asked().is_empty());
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=300")
    );
}

#[test]
fn incomplete_holds_the_turn_for_the_incomplete_hold_then_silence_decides() {
    let mut c = Call::new(true);
    c.says("book a table", true); // speech ends at 400 ms
    assert_eq!(c.asked(), vec![1]);
    c.at(430);
    c.answer(1, Verdict::Incomplete(0.1));
    c.at(1899);
    assert_eq!(c.committed(), None, "held while the model says incomplete");
    c.at(2000);
    // 1500 ms of silence, not the 3000 of max_endpointing_ms.
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=1500")
    );
    assert_eq!(
        c.details(EventKind::TurnModel),
        vec!["incomplete p=0.100 pause=1 infer_us=27000"]
    );
}

#[test]
fn complete_does_not_override_words_that_usually_continue() {
    // The audio model says complete, the words say "I need to…": the unfinished-word hold
    // (unfinished_hold_ms, 2000 by default) decides, as without a model.
    let mut c = Call::new(true);
    c.says("I need to", true);
    c.at(430);
    c.answer(1, Verdict::Complete(0.9));
    c.at(2399);
    assert_eq!(c.committed(), None, "held for the unfinished phrase");
    c.at(2500);
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=2000")
    );
}

#[test]
fn incomplete_then_the_caller_goes_on_and_the_next_pause_is_judged_anew() {
    let mut c = Call::new(true);
    c.says("I want to book", true);
    c.at(430);
    c.answer(1, Verdict::Incomplete(0.2));
    c.at(1500);
    c.says("a table for two", true); // speech 1500–1900
    assert_eq!(
        c.asked(),
        vec![1, 2],
        "a new pause number after speech resumed"
    );
    c.at(1930);
    c.answer(2, Verdict::Complete(0.9));
    c.at(2300);
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=300")
    );
    let turn = c.log.iter().find_map(|a| match a {
        Action::StartBrain { history } => history.last().map(|m| m.content.clone()),
        _ => None,
    });
    assert_eq!(turn.as_deref(), Some("I want to book a table for two"));
}

#[test]
fn complete_commits_at_min_endpointing() {
    // A question ending on "that" (not a word that usually continues).
    let mut c = Call::new(true);
    c.says("can you repeat that", true);
    c.at(430);
    c.answer(1, Verdict::Complete(0.93));
    c.at(699);
    assert_eq!(c.committed(), None, "not before min_endpointing_ms");
    c.at(800);
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=300")
    );
}

#[test]
fn complete_without_the_stts_end_finalizes_and_commits_after_the_grace() {
    let mut c = Call::new(true);
    c.says("I'd like the salmon", false);
    c.at(430);
    c.answer(1, Verdict::Complete(0.8));
    c.at(750);
    assert!(
        c.log.contains(&Action::Finalize),
        "asked the STT to finalize"
    );
    c.at(899);
    assert_eq!(c.committed(), None, "the grace is not over");
    c.at(1000);
    assert_eq!(c.committed().as_deref(), Some("turn_model silence_ms=500"));
}

#[test]
fn no_answer_falls_back_to_silence_timing() {
    let mut c = Call::new(true);
    c.says("book a table", true);
    c.at(1000);
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=300")
    );
    assert_eq!(c.details(EventKind::TurnModel), vec!["timeout pause=1"]);
    // An answer after the timeout changes nothing.
    c.answer(1, Verdict::Incomplete(0.1));
    assert_eq!(c.details(EventKind::TurnModel).len(), 2);
    assert!(c.details(EventKind::TurnModel)[1].ends_with(" ignored"));
}

#[test]
fn a_full_queue_falls_back_to_silence_timing_at_once() {
    let mut c = Call::new(true);
    c.says("book a table", true);
    // The actor could not queue the request: it answers at once.
    c.answer(1, Verdict::Unavailable(Unavailable::QueueFull));
    c.at(700);
    assert_eq!(
        c.committed().as_deref(),
        Some("speech_final silence_ms=300")
    );
    assert_eq!(
        c.details(EventKind::TurnModel),
        vec!["unavailable queue_full pause=1 infer_us=27000"]
    );
}

#[test]
fn a_late_answer_after_the_caller_resumed_is_ignored() {
    let mut c = Call::new(true);
    c.says("so I was thinking", true);
    c.at(450);
    // The caller goes on before the model answers; then the answer about that pause comes.
    c.step(Input::Vad {
        event: VadEvent::SpeechStart { onset_ms: 0 },
        audio_ms: 0,
    });
    c.answer(1, Verdict::Complete(0.99));
    c.at(3000);
    assert_eq!(c.committed(), None, "the caller is still speaking");
    assert!(c.details(EventKind::TurnModel)[0].ends_with(" ignored"));
}
