//! Unit tests of the conversation policy on a simulated clock (pure `Instant` arithmetic: the
//! policy and the mouth are handed the time, so nothing here sleeps or reads the clock). A small
//! harness plays the actor's part: it lends the policy a real [`Mouth`], "synthesises" one second of audio per
//! utterance, pumps the pacer, plays marks back when their audio has played at a simulated
//! carrier and fires the policy's timers, following the driving rule as the actor does.

use std::collections::HashSet;

use super::*;
use crate::call::action::{ActionOutcome, CallAction};
use crate::call::event::EndReason;
use crate::carrier::{ActionResult, FRAME_MS, MediaCommand};
use crate::provider::TtsEvent;
use crate::security::mask_number;
use bytes::Bytes;

/// Audio per synthesised utterance: one second of μ-law.
const UTTERANCE_BYTES: usize = 8000;
const REPLY: &str = "We are open every day from noon. We close at ten in the evening. \
                     On Fridays we stay open until midnight.";

fn agent(extra: &str) -> Arc<AgentConfig> {
    let text = format!(
        "llm = \"brain\"\nstt = \"ears\"\ntts = \"voice\"\n\
         first_message = \"Hello, how can I help?\"\n{extra}"
    );
    Arc::new(toml::from_str(&text).expect("agent config"))
}

struct Call {
    policy: Policy,
    mouth: Mouth,
    synthesised: HashSet<u64>,
    /// Synthesis asked for and not yet given its audio (`Action::Synthesize`).
    requested: Vec<(u64, String)>,
    answered: bool,
    /// Every action the policy returned, in order.
    log: Vec<Action>,
    /// Marks at the simulated carrier and when their audio will have played.
    marks: Vec<(String, Instant)>,
    /// When the carrier will have played all audio sent so far.
    carrier_until: Option<Instant>,
    ended: Option<EndReason>,
    /// The simulated clock: time is passed in, never read.
    now: Instant,
    /// Synthesis is slow: queued utterances get no audio until this is cleared.
    tts_stalled: bool,
    /// Where the current speech run began (audio time runs with the simulated clock).
    run_onset: Option<Instant>,
}

impl Call {
    /// A call whose greeting has played out, with nothing else going on.
    fn answered(extra: &str) -> Call {
        let mut c = Call::ringing(extra);
        c.answer();
        c.run(1500);
        assert_eq!(c.policy.phase(), Phase::Idle);
        c.log.clear();
        c
    }

    /// A call created (greeting queued) but not yet answered.
    fn ringing(extra: &str) -> Call {
        let now = Instant::now();
        let mut c = Call {
            now,
            tts_stalled: false,
            run_onset: None,
            policy: Policy::new(agent(extra), 0, false, now),
            mouth: Mouth::new(),
            synthesised: HashSet::new(),
            requested: Vec::new(),
            answered: false,
            log: Vec::new(),
            marks: Vec::new(),
            carrier_until: None,
            ended: None,
        };
        c.step(Input::Start);
        c
    }

    fn answer(&mut self) {
        self.answered = true;
        self.step(Input::Answered);
        self.pump();
    }

    /// Feeds one input and carries out the actions like the actor.
    fn step(&mut self, input: Input) {
        self.handle(input);
    }

    /// The driving rule: `handle`, then every action polled and carried out in order.
    fn handle(&mut self, input: Input) {
        self.policy.handle(input, self.now, &mut self.mouth);
        while let Some(a) = self.policy.poll_action() {
            self.log.push(a.clone());
            match &a {
                Action::Synthesize { id, text } => self.requested.push((*id, text.clone())),
                Action::Speak { .. } => {
                    self.synthesise();
                    self.pump();
                }
                Action::Resume => self.pump(),
                Action::Clear => {
                    self.marks.clear();
                    self.carrier_until = None;
                }
                Action::HangUp(r) => self.ended = Some(r.clone()),
                _ => {}
            }
        }
    }

    /// Every synthesis asked for gets its second of audio at once.
    fn synthesise(&mut self) {
        if self.tts_stalled {
            return;
        }
        for (id, _) in std::mem::take(&mut self.requested) {
            if self.synthesised.insert(id) {
                let audio = Bytes::from(vec![0x55u8; UTTERANCE_BYTES]);
                let event = Some(TtsEvent::Audio(audio));
                self.handle(Input::Synthesis { id, event });
                let event = Some(TtsEvent::Done);
                self.handle(Input::Synthesis { id, event });
            }
        }
    }

    fn pump(&mut self) {
        if !self.answered {
            return;
        }
        let now = self.now;
        let out = self.mouth.pump(now);
        if !out.started.is_empty() {
            self.handle(Input::Started(out.started));
        }
        for cmd in out.commands {
            match cmd {
                MediaCommand::Audio(_) => {
                    let from = self.carrier_until.filter(|t| *t > now).unwrap_or(now);
                    self.carrier_until = Some(from + Duration::from_millis(FRAME_MS));
                }
                MediaCommand::Mark(name) => {
                    let at = self.carrier_until.unwrap_or(now);
                    self.marks.push((name, at));
                }
                _ => {}
            }
        }
    }

    /// Lets `ms` of time pass: the pacer runs, marks come back, timers fire.
    fn run(&mut self, ms: u64) {
        let end = self.now + Duration::from_millis(ms);
        for _ in 0..100_000 {
            let now = self.now;
            self.pump();
            let due: Vec<String> = self
                .marks
                .iter()
                .filter(|(_, at)| *at <= now)
                .map(|(m, _)| m.clone())
                .collect();
            self.marks.retain(|(_, at)| *at > now);
            for m in due {
                self.step(Input::Mark(m));
            }
            if self.policy.deadline(&self.mouth).is_some_and(|t| t <= now) {
                self.step(Input::Timer);
            }
            if self.ended.is_some() {
                return;
            }
            if now >= end {
                return;
            }
            let next = [
                self.policy.deadline(&self.mouth),
                self.mouth.next_deadline(now),
                self.marks.iter().map(|(_, at)| *at).min(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end)
            .min(end);
            let wait = if next > now {
                next - now
            } else {
                Duration::from_millis(1).min(end - now)
            };
            self.now += wait;
        }
        panic!("the harness did not settle");
    }

    /// Our detector heard the caller start speaking now.
    fn speech_start(&mut self) {
        // The detector starts after 64 ms of voiced audio.
        self.run_onset = self.now.checked_sub(Duration::from_millis(64));
        self.step(Input::Vad {
            event: VadEvent::SpeechStart { onset_ms: 0 },
            audio_ms: 0,
        });
    }

    /// The caller has been speaking `ms` (voiced, with a pitch) so far.
    fn voiced(&mut self, ms: u64) {
        let span_ms = self.span_ms(ms);
        self.step(Input::CallerAudio {
            speech_run_ms: ms,
            span_ms,
            pitched_ms: ms,
            echo_ms: 0,
        });
    }

    /// The detector has heard `ms` of speech so far, `echo` of it the agent's own echo (the
    /// rest the caller's voice, pitched).
    fn echoed(&mut self, ms: u64, echo: u64) {
        let span_ms = self.span_ms(ms);
        self.step(Input::CallerAudio {
            speech_run_ms: ms,
            span_ms,
            pitched_ms: ms - echo,
            echo_ms: echo,
        });
    }

    /// A noise-like burst (a cough: the detector's speech, no pitch) of `ms` so far.
    fn unpitched(&mut self, ms: u64) {
        let span_ms = self.span_ms(ms);
        self.step(Input::CallerAudio {
            speech_run_ms: ms,
            span_ms,
            pitched_ms: 0,
            echo_ms: 0,
        });
    }

    /// Audio time since the run's onset, at least its `voiced` part.
    fn span_ms(&self, voiced: u64) -> u64 {
        let since = self
            .run_onset
            .map(|t| self.now.saturating_duration_since(t).as_millis() as u64)
            .unwrap_or(0);
        since.max(voiced)
    }

    fn speech_end(&mut self) {
        self.step(Input::Vad {
            event: VadEvent::SpeechEnd {
                onset_ms: 0,
                last_voiced_ms: 500,
            },
            audio_ms: 500,
        });
        self.run_onset = None;
        self.step(Input::CallerAudio {
            speech_run_ms: 0,
            span_ms: 0,
            pitched_ms: 0,
            echo_ms: 0,
        });
    }

    fn final_text(&mut self, text: &str) {
        self.step(Input::Final {
            text: text.into(),
            speech_final: true,
            from_finalize: false,
        });
    }

    /// A whole caller turn while nothing else happens: speech, its final, the endpointing.
    fn caller_says(&mut self, text: &str) {
        self.speech_start();
        self.voiced(100);
        self.run(500);
        self.speech_end();
        self.final_text(text);
        self.run(300);
    }

    /// The caller asked something and the agent's three-sentence reply is playing, its first
    /// sentence heard.
    fn replying(extra: &str) -> Call {
        let mut c = Call::answered(extra);
        c.caller_says("what are your opening hours");
        assert_eq!(c.count(EventKind::LlmRequest), 1);
        c.step(Input::Llm(LlmEvent::Delta(REPLY.into())));
        c.step(Input::Llm(LlmEvent::Done));
        c.run(1100);
        assert_eq!(c.details(EventKind::MarkPlayed).len(), 1, "{:?}", c.log);
        assert_eq!(c.policy.phase(), Phase::Speaking);
        c.log.clear();
        c
    }

    fn events(&self) -> Vec<(EventKind, String)> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Event(k, d) => Some((*k, d.to_text())),
                _ => None,
            })
            .collect()
    }

    fn details(&self, kind: EventKind) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, d)| d)
            .collect()
    }

    fn count(&self, kind: EventKind) -> usize {
        self.details(kind).len()
    }

    fn did(&self, action: &Action) -> bool {
        self.log.contains(action)
    }

    /// The user messages the brain was asked about, in order.
    fn asked(&self) -> Vec<String> {
        self.brain_starts()
            .iter()
            .filter_map(|h| h.last().map(|m| m.content.clone()))
            .collect()
    }

    fn brain_starts(&self) -> Vec<Vec<ChatMessage>> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::StartBrain { history } => Some(history.clone()),
                _ => None,
            })
            .collect()
    }

    fn agent_entry(&self, starts_with: &str) -> TranscriptEntry {
        self.policy
            .transcript()
            .iter()
            .find(|e| e.speaker == Speaker::Agent && e.text.starts_with(starts_with))
            .cloned()
            .expect("transcript entry")
    }
}

#[test]
fn the_greeting_plays_when_answered_and_a_turn_asks_the_brain() {
    let mut c = Call::ringing("");
    assert_eq!(c.policy.phase(), Phase::Speaking, "greeting queued");
    c.answer();
    assert_eq!(c.count(EventKind::GreetingFirstFrame), 1);
    c.run(1500);
    assert_eq!(c.details(EventKind::MarkPlayed), vec!["u1".to_string()]);
    assert_eq!(c.policy.phase(), Phase::Idle);
    c.caller_says("I would like a table");
    assert_eq!(
        c.details(EventKind::TurnEnd),
        vec!["speech_final silence_ms=300".to_string()]
    );
    let starts = c.brain_starts();
    assert_eq!(starts.len(), 1);
    assert_eq!(
        starts[0].last().map(|m| m.content.as_str()),
        Some("I would like a table")
    );
    assert_eq!(c.policy.phase(), Phase::Thinking);
}

#[test]
fn barge_in_stops_fast_then_commits_on_real_words() {
    let mut c = Call::replying("");
    c.speech_start();
    c.voiced(180);
    assert!(!c.did(&Action::Clear), "below barge_in_min_speech_ms");
    c.voiced(200);
    assert!(c.did(&Action::Clear));
    assert_eq!(c.details(EventKind::BargeInStop), vec!["speech_ms=200"]);
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    assert!(!c.mouth.is_playing(c.now), "paused");

    c.now += Duration::from_millis(300);
    c.step(Input::Interim("wait, stop".into()));
    assert_eq!(
        c.details(EventKind::BargeInCommit),
        vec!["words=2 after_ms=300"]
    );
    assert!(c.did(&Action::CancelBrain));
    assert_eq!(c.count(EventKind::Interrupted), 1);
    assert_eq!(
        c.details(EventKind::Heard),
        vec![
            r#"{"of":21,"precision":"sentence","text":"We are open every day from noon.","words":7}"#
        ]
    );
    assert_eq!(c.count(EventKind::BargeInResume), 0);
    let reply = c.agent_entry("We are open");
    assert!(reply.interrupted);
    assert_eq!(reply.heard_text, "We are open every day from noon.");
    assert_eq!(
        c.policy.history().last().map(|m| m.content.as_str()),
        Some("We are open every day from noon. [interrupted by the caller]")
    );
    // The caller's words become the next turn.
    c.speech_end();
    c.final_text("wait, stop");
    c.run(300);
    assert_eq!(c.brain_starts().len(), 1);
    assert_eq!(c.policy.phase(), Phase::Thinking);
}

#[test]
fn barge_in_without_words_resumes_from_the_last_heard_sentence() {
    let mut c = Call::replying("");
    c.speech_start();
    c.voiced(200);
    assert!(c.did(&Action::Clear));
    // A cough: speech ends, no words come.
    c.run(100);
    c.speech_end();
    c.run(899);
    assert_eq!(
        c.count(EventKind::BargeInResume),
        0,
        "not before confirm_ms"
    );
    c.run(1);
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["no_words after_ms=1000"]
    );
    assert!(c.did(&Action::Resume));
    assert_eq!(c.policy.phase(), Phase::Speaking);
    c.run(3000);
    assert_eq!(c.count(EventKind::Interrupted), 0);
    let reply = c.agent_entry("We are open");
    assert!(!reply.interrupted);
    assert_eq!(reply.heard_text, reply.text, "heard to the end");
    // The withdrawn mark came back under a new name.
    assert!(
        c.details(EventKind::MarkPlayed)
            .contains(&"u3.1".to_string())
    );
    assert_eq!(c.policy.phase(), Phase::Idle);
}

#[test]
fn a_backchannel_resumes_the_agent_when_its_turn_ends() {
    let mut c = Call::replying("");
    c.speech_start();
    c.voiced(200);
    c.run(200);
    c.step(Input::Interim("mm-hmm".into()));
    assert_eq!(c.count(EventKind::BargeInCommit), 0);
    c.speech_end();
    c.final_text("Mm-hmm.");
    c.run(300);
    assert_eq!(c.details(EventKind::BackchannelIgnored), vec!["Mm-hmm."]);
    assert_eq!(
        c.details(EventKind::BargeInResume),
        vec!["backchannel_ignored after_ms=500"]
    );
    assert!(c.brain_starts().is_empty(), "no caller turn");
    assert_eq!(c.count(EventKind::Interrupted), 0);
    assert_eq!(c.policy.phase(), Phase::Speaking);
}

#[test]
fn the_agents_own_voice_is_echo_not_an_interruption() {
    let mut c = Call::replying("");
    c.speech_start();
    c.voiced(200);
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    c.step(Input::Interim("we close at ten in the".into()));
    assert_eq!(c.count(EventKind::BargeInCommit), 0, "echo never commits");
    c.speech_end();
    c.final_text("We close at ten in the evening.");
    c.run(300);
    assert_eq!(
        c.details(EventKind::EchoIgnored),
        vec!["We close at ten in the evening."]
    );
    assert_eq!(c.count(EventKind::BargeInResume), 1);
    assert!(c.brain_starts().is_empty());
    c.run(3000);
    let reply = c.agent_entry("We are open");
    assert!(!reply.interrupted);
    assert_eq!(reply.heard_text, reply.text);
}

#[test]
fn without_barge_in_a_turn_is_held_until_the_agent_finishes() {
    let mut c = Call::replying("barge_in = false");
    c.speech_start();
    c.voiced(600);
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    c.speech_end();
    c.final_text("Can I bring my dog?");
    c.run(300);
    assert_eq!(c.count(EventKind::TurnHeld), 1);
    assert!(c.brain_starts().is_empty(), "held, not taken");
    assert_eq!(c.policy.phase(), Phase::Speaking);
    c.run(3000);
    let starts = c.brain_starts();
    assert_eq!(starts.len(), 1, "taken once the reply played out");
    assert_eq!(
        starts[0].last().map(|m| m.content.as_str()),
        Some("Can I bring my dog?")
    );
    assert!(!c.did(&Action::Clear));
    assert_eq!(c.count(EventKind::Interrupted), 0);
    let reply = c.agent_entry("We are open");
    assert_eq!(reply.heard_text, reply.text, "heard whole");
    // The whole reply joined the history before the held turn.
    assert_eq!(
        starts[0][starts[0].len() - 2].content,
        REPLY,
        "{:?}",
        starts[0]
    );
}

#[test]
fn an_uninterruptible_greeting_plays_through_and_the_turn_is_answered_after_it() {
    let mut c = Call::ringing("greeting_interruptible = false");
    c.answer();
    c.run(100);
    c.speech_start();
    c.voiced(400);
    assert_eq!(c.count(EventKind::BargeInStop), 0);
    assert!(!c.did(&Action::Clear));
    c.speech_end();
    c.final_text("I want to book a table");
    c.run(300);
    assert_eq!(c.brain_starts().len(), 1, "the turn is taken at once");
    assert_eq!(c.count(EventKind::Interrupted), 0);
    c.run(1000);
    let greeting = c.agent_entry("Hello");
    assert!(!greeting.interrupted);
    assert_eq!(greeting.heard_text, "Hello, how can I help?");
    // The reply itself can still be cut.
    c.step(Input::Llm(LlmEvent::Delta(REPLY.into())));
    c.run(500);
    c.speech_start();
    c.voiced(200);
    assert_eq!(c.count(EventKind::BargeInStop), 1);
    assert!(c.did(&Action::Clear));
}

#[test]
fn a_slow_brain_gets_one_filler() {
    let mut c = Call::answered("long_turn_message_after_s = 2.0");
    c.caller_says("what is on the menu");
    c.run(1999);
    assert_eq!(c.count(EventKind::Filler), 0);
    c.run(1);
    assert_eq!(c.details(EventKind::Filler), vec!["slow"]);
    assert!(c.log.iter().any(|a| matches!(
        a,
        Action::Speak { kind: UttKind::Filler { turn: 1 }, text } if text == "One moment, let me check that."
    )));
    assert_eq!(c.details(EventKind::FirstFrameOfTurn), vec!["2000000"]);
    c.run(10_000);
    assert_eq!(c.count(EventKind::Filler), 1, "once per turn");
    c.step(Input::Llm(LlmEvent::Delta("Pasta and salads.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(2000);
    assert_eq!(
        c.count(EventKind::ReplyFirstFrame),
        0,
        "the filler was first"
    );
    assert_eq!(c.count(EventKind::Filler), 1);
}

#[test]
fn tool_progress_speaks_the_filler_early_and_only_once() {
    let mut c = Call::answered("");
    c.caller_says("is my order ready");
    c.run(500);
    c.step(Input::Llm(LlmEvent::ToolProgress(
        "looking up the order".into(),
    )));
    assert_eq!(
        c.details(EventKind::ToolProgress),
        vec!["looking up the order"]
    );
    assert_eq!(c.details(EventKind::Filler), vec!["tool"]);
    c.run(10_000);
    assert_eq!(c.count(EventKind::Filler), 1, "no slow filler after it");
}

#[test]
fn repeated_tool_progress_before_the_filler_is_heard_speaks_it_once() {
    let mut c = Call::answered("");
    c.caller_says("is my order ready");
    c.tts_stalled = true;
    c.step(Input::Llm(LlmEvent::ToolProgress("orders".into())));
    c.step(Input::Llm(LlmEvent::ToolProgress("kitchen".into())));
    assert_eq!(c.count(EventKind::ToolProgress), 2);
    assert_eq!(c.details(EventKind::Filler), vec!["tool"]);
    c.tts_stalled = false;
    c.step(Input::Llm(LlmEvent::Delta("Yes, it is ready.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(5000);
    assert_eq!(c.count(EventKind::Filler), 1);
    assert_eq!(
        c.count(EventKind::FirstFrameOfTurn),
        1,
        "the filler went first"
    );
    assert_eq!(c.count(EventKind::ReplyFirstFrame), 0);
}

#[test]
fn a_fast_reply_needs_no_filler() {
    let mut c = Call::answered("");
    c.caller_says("hello");
    c.run(200);
    c.step(Input::Llm(LlmEvent::Delta("Hi there.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    assert_eq!(c.details(EventKind::ReplyFirstFrame), vec!["200000"]);
    c.run(10_000);
    assert_eq!(c.count(EventKind::Filler), 0);
}

#[test]
fn a_silent_caller_is_nudged_then_said_goodbye_to_then_hung_up_on() {
    let mut c = Call::answered("idle_goodbye_message = \"Goodbye for now.\"");
    // The greeting's mark came back 1 s after the answer, 500 ms ago: the first nudge is
    // 6 s after it.
    c.run(5499);
    assert_eq!(c.count(EventKind::IdleNudge), 0);
    c.run(1);
    assert_eq!(c.details(EventKind::IdleNudge), vec!["1"]);
    c.run(1000);
    assert_eq!(c.policy.phase(), Phase::Idle, "the nudge played");
    c.run(6000);
    assert_eq!(c.details(EventKind::IdleNudge), vec!["1", "2"]);
    assert_eq!(c.count(EventKind::IdleGoodbye), 0);
    c.run(7000);
    assert_eq!(c.count(EventKind::IdleGoodbye), 1);
    assert!(matches!(c.policy.phase(), Phase::Goodbye { .. }));
    assert!(c.ended.is_none(), "waits for the goodbye to play");
    c.run(1000);
    assert_eq!(c.count(EventKind::IdleHangUp), 1);
    assert_eq!(c.ended, Some(EndReason::CallerSilent));
    let goodbye = c.agent_entry("Goodbye for now.");
    assert_eq!(goodbye.heard_text, "Goodbye for now.");
}

#[test]
fn a_caller_who_answers_a_nudge_resets_the_count() {
    let mut c = Call::answered("");
    c.run(5500);
    assert_eq!(c.count(EventKind::IdleNudge), 1);
    c.run(1000);
    c.caller_says("sorry, I am here");
    assert_eq!(c.brain_starts().len(), 1);
    c.step(Input::Llm(LlmEvent::Delta("No problem.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(1000);
    c.log.clear();
    c.run(7000);
    assert_eq!(c.details(EventKind::IdleNudge), vec!["1"], "counting again");
}

#[test]
fn dtmf_is_a_turn_that_cuts_even_a_reply_that_cannot_be_interrupted() {
    let mut c = Call::replying("barge_in = false");
    c.step(Input::Dtmf('5'));
    c.step(Input::Dtmf('#'));
    assert_eq!(c.details(EventKind::Dtmf), vec!["5", "#"]);
    assert_eq!(c.count(EventKind::TurnEnd), 0);
    assert_eq!(c.count(EventKind::TurnHeld), 0, "keys are never held");
    assert_eq!(c.count(EventKind::Interrupted), 1);
    assert!(c.did(&Action::Clear));
    let starts = c.brain_starts();
    assert_eq!(starts.len(), 1);
    assert_eq!(
        starts[0].last().map(|m| m.content.as_str()),
        Some("The caller pressed 5#.")
    );
}

#[test]
fn a_brain_that_fails_before_any_reply_is_apologised_for() {
    let mut c = Call::answered("");
    c.caller_says("what time is it");
    c.step(Input::Llm(LlmEvent::Error("upstream 500".into())));
    assert!(c.did(&Action::CancelBrain));
    assert_eq!(c.details(EventKind::LlmError), vec!["upstream 500"]);
    assert!(c.log.iter().any(|a| matches!(
        a,
        Action::Speak {
            kind: UttKind::Error { turn: 1 },
            ..
        }
    )));
    assert_eq!(c.count(EventKind::FirstFrameOfTurn), 1);
}

#[test]
fn a_brain_that_fails_mid_reply_is_apologised_for_after_what_it_said() {
    let mut c = Call::answered("");
    c.caller_says("where is my order");
    c.step(Input::Llm(LlmEvent::Delta(
        "Your order left the depot. It should".into(),
    )));
    c.step(Input::Llm(LlmEvent::Error(
        "the brain finished with an error".into(),
    )));
    let spoken: Vec<(UttKind, String)> = c
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Speak { kind, text } => Some((*kind, text.clone())),
            _ => None,
        })
        .collect();
    let texts: Vec<&str> = spoken.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        vec![
            "Your order left the depot.",
            "It should",
            agent("").llm_error_message.as_str()
        ],
        "{spoken:?}"
    );
    assert!(matches!(spoken[2].0, UttKind::Error { turn: 1 }));
    // The apology is heard after the partial reply, and the call goes on.
    c.run(4000);
    assert_eq!(c.policy.phase(), Phase::Idle);
}

#[test]
fn a_brain_that_keeps_history_is_told_what_was_heard() {
    let mut c = Call::replying("");
    c.policy.brain_keeps_history = true;
    c.speech_start();
    c.voiced(200);
    c.step(Input::Interim("no, I meant Tuesday".into()));
    assert_eq!(c.count(EventKind::BargeInCommit), 1);
    c.speech_end();
    c.final_text("No, I meant Tuesday.");
    c.run(300);
    let starts = c.brain_starts();
    assert_eq!(
        starts[0].last().map(|m| m.content.as_str()),
        Some(
            "[The caller interrupted you; of your last reply they heard only: \
             \"We are open every day from noon.\"] No, I meant Tuesday."
        )
    );
}

mod acts;

/// End-of-turn cases where our detector and the speech-to-text disagree.
mod turns;

/// The barge-in hold before the stop.
mod hold;

/// Word-precise heard history: the cut at the `clear`.
mod heard;

/// An interruption whose words the endpointer splits at a pause ("wait," … "stop").
mod split;

/// The speech-to-text's words during the barge-in hold.
mod hold_words;

/// The caller's keypad and the history kept.
mod keypad;
/// The brain's outages: retries, the budget, the polite hang-up.
mod retry;
/// No silent stop: whatever holds the agent's audio ends in a resume or a turn.
mod silence;
