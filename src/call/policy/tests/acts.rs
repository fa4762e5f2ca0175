//! Agent actions (`policy/acts.rs`), tool calls, Flux speculation and end-of-call cases of the
//! policy, on the simulated clock of [`super`].

use super::*;

impl Call {
    fn replies(&self) -> Vec<(u64, ActionOutcome)> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Reply { id, outcome } => Some((*id, outcome.clone())),
                _ => None,
            })
            .collect()
    }

    fn act(&mut self, id: u64, action: CallAction) {
        self.step(Input::Act { id, action });
    }
}

const TRANSFERS: &str = "transfer_allowed = [\"+1415555\", \"+442071234567\"]\n\
                         transfer_message = \"Transferring you now.\"";

#[test]
fn end_call_mid_reply_finishes_the_sentence_then_hangs_up() {
    let mut c = Call::replying("");
    // The second sentence is playing; the third waits.
    c.act(
        1,
        CallAction::EndCall {
            reason: "done".into(),
        },
    );
    assert!(matches!(c.replies()[..], [(1, ActionOutcome::Done { .. })]));
    assert_eq!(c.ended, None, "the sentence being spoken finishes first");
    c.run(3000);
    assert_eq!(c.ended, Some(EndReason::HungUp("done".into())));
    let heard = c.agent_entry("We are open").heard_text;
    assert!(heard.contains("We close at ten"), "{heard}");
    assert!(
        !heard.contains("midnight"),
        "the next sentence never started: {heard}"
    );
}

#[test]
fn transfers_are_checked_against_the_allow_list_before_anything_happens() {
    for (extra, to, why) in [
        ("", "+14155550100", "transfer_allowed list is empty"),
        (
            TRANSFERS,
            "+19005550100",
            "not one this agent may transfer to",
        ),
        (TRANSFERS, "+1415", "not a phone number"),
        (TRANSFERS, "call my boss", "not a phone number"),
    ] {
        let mut c = Call::answered(extra);
        c.act(7, CallAction::Transfer { to: to.into() });
        match &c.replies()[..] {
            [(7, ActionOutcome::Refused { reason })] => assert!(reason.contains(why), "{reason}"),
            other => panic!("{to}: {other:?}"),
        }
        assert!(!c.log.iter().any(|a| matches!(a, Action::Transfer { .. })));
        assert_eq!(c.count(EventKind::ActionRefused), 1);
        assert_eq!(c.policy.phase(), Phase::Idle);
    }
}

#[test]
fn an_allowed_transfer_speaks_the_handoff_then_asks_the_carrier() {
    let mut c = Call::answered(TRANSFERS);
    // Any spelling that normalises to an allowed number.
    c.act(
        3,
        CallAction::Transfer {
            to: "+1 (415) 555-0100".into(),
        },
    );
    assert!(c.replies().is_empty(), "answered when the carrier has");
    assert!(!c.log.iter().any(|a| matches!(a, Action::Transfer { .. })));
    c.run(1200);
    assert_eq!(
        c.agent_entry("Transferring").heard_text,
        "Transferring you now."
    );
    assert!(c.did(&Action::Transfer {
        id: 3,
        to: "+14155550100".into()
    }));
    // A second action while the transfer is in flight is refused.
    c.act(4, CallAction::Say { text: "hi".into() });
    c.step(Input::ActionDone {
        id: 3,
        result: ActionResult::Done,
    });
    let replies = c.replies();
    assert!(matches!(replies[0], (4, ActionOutcome::Refused { .. })));
    assert!(
        matches!(replies[1], (3, ActionOutcome::Done { .. })),
        "{replies:?} {:?}",
        c.log
    );
    assert!(c.did(&Action::End(EndReason::Transferred("+14155550100".into()))));
    // The timeline names the number masked; the end reason carries it.
    assert_eq!(
        c.details(EventKind::Transferred),
        vec![mask_number("+14155550100")]
    );
    assert_ne!(mask_number("+14155550100"), "+14155550100");
}

#[test]
fn a_failed_transfer_tells_why_and_the_call_goes_on() {
    let mut c = Call::answered(TRANSFERS);
    c.act(
        1,
        CallAction::Transfer {
            to: "+442071234567".into(),
        },
    );
    c.run(1200);
    c.step(Input::ActionDone {
        id: 1,
        result: ActionResult::Failed("carrier said no".into()),
    });
    match &c.replies()[..] {
        [(1, ActionOutcome::Failed { reason })] => assert!(reason.contains("carrier said no")),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.policy.phase(), Phase::Idle);
    c.caller_says("are you still there");
    assert_eq!(c.count(EventKind::LlmRequest), 1, "turns are taken again");
}

#[test]
fn dtmf_is_checked_then_sent_by_command_or_as_tones() {
    let mut c = Call::answered("");
    c.act(
        1,
        CallAction::SendDtmf {
            digits: "12x".into(),
        },
    );
    assert!(
        matches!(&c.replies()[..], [(1, ActionOutcome::Refused { reason })] if reason.contains("'X'"))
    );
    c.act(
        2,
        CallAction::SendDtmf {
            digits: "1#".into(),
        },
    );
    assert!(c.did(&Action::SendDtmf {
        id: 2,
        digits: "1#".into()
    }));
    c.act(3, CallAction::SendDtmf { digits: "2".into() });
    c.step(Input::ActionDone {
        id: 2,
        result: ActionResult::InBand,
    });
    let replies = c.replies();
    assert!(
        matches!(replies[1], (3, ActionOutcome::Refused { .. })),
        "one at a time"
    );
    assert!(matches!(replies[2], (2, ActionOutcome::Done { .. })));
    c.run(1000);
    assert_eq!(c.agent_entry("[DTMF").heard_text, "[DTMF 1#]");
    c.act(4, CallAction::SendDtmf { digits: "9".into() });
    c.step(Input::ActionDone {
        id: 4,
        result: ActionResult::Done,
    });
    assert!(matches!(
        c.replies().last(),
        Some((4, ActionOutcome::Done { .. }))
    ));
    assert_eq!(
        c.details(EventKind::DtmfOut),
        vec!["1# in_band".to_string(), "9 command".to_string()]
    );
}

fn tool_call(name: &str) -> LlmEvent {
    LlmEvent::ToolCall(crate::provider::ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: "{}".into(),
        trace: None,
    })
}

#[test]
fn text_before_a_tool_call_is_spoken_and_stands_in_for_the_filler() {
    let mut c = Call::answered("");
    c.caller_says("is my order ready");
    c.step(Input::Llm(LlmEvent::Delta("Let me look that up".into())));
    c.step(Input::Llm(tool_call("lookup_order")));
    assert_eq!(c.count(EventKind::ToolCall), 1);
    assert_eq!(
        c.count(EventKind::Filler),
        0,
        "the model's own words cover the wait"
    );
    c.step(Input::Llm(LlmEvent::ToolResult {
        id: "call_1".into(),
        name: "lookup_order".into(),
        ok: true,
        content: "{\"ready\":true}".into(),
    }));
    c.step(Input::Llm(LlmEvent::Delta("Yes, it is ready.".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(5000);
    assert_eq!(c.count(EventKind::Filler), 0);
    assert_eq!(c.count(EventKind::ToolReplyFirstFrame), 1);
}

#[test]
fn a_tool_announcement_is_spoken_instead_of_the_filler() {
    let mut c = Call::answered("");
    c.caller_says("when does my order ship");
    c.step(Input::Llm(LlmEvent::Say(
        "Let me check with a colleague.".into(),
    )));
    c.step(Input::Llm(tool_call("consult_agent")));
    c.run(10_000);
    assert_eq!(c.count(EventKind::Filler), 0);
    assert_eq!(
        c.count(EventKind::FirstFrameOfTurn) + c.count(EventKind::ReplyFirstFrame),
        1
    );
}

#[test]
fn a_tool_call_before_any_words_speaks_the_filler_once() {
    let mut c = Call::answered("");
    c.caller_says("is my order ready");
    c.step(Input::Llm(tool_call("lookup_order")));
    c.step(Input::Llm(tool_call("lookup_order")));
    assert_eq!(c.details(EventKind::Filler), vec!["tool"]);
}

/// The texts the policy asked the mouth to speak.
fn speaks(c: &Call) -> Vec<String> {
    c.log
        .iter()
        .filter_map(|a| match a {
            Action::Speak { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn eager_end_of_turn_speculates_and_a_resumed_turn_speaks_none_of_it() {
    let mut c = Call::answered("");
    c.policy = std::mem::replace(&mut c.policy, Policy::new(agent(""), 0, false, c.now))
        .with_stt_turns(true);
    c.step(Input::Interim("I need a table".into()));
    c.step(Input::EagerEndOfTurn("I need a table".into()));
    assert_eq!(c.brain_starts().len(), 1, "speculative request");
    assert_eq!(
        c.brain_starts()[0].last().map(|m| m.content.as_str()),
        Some("I need a table")
    );
    c.step(Input::Llm(LlmEvent::Delta("SPECULATIVE reply. ".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(500);
    assert!(speaks(&c).is_empty(), "held back: {:?}", c.log);
    c.step(Input::TurnResumed);
    assert!(c.did(&Action::CancelBrain));
    assert_eq!(c.details(EventKind::SpeculationCancelled), ["turn_resumed"]);
    // The caller goes on; the turn ends on longer words: a new request, its reply spoken.
    c.step(Input::EagerEndOfTurn("I need a table for four".into()));
    c.step(Input::EndOfTurn("I need a table for four".into()));
    assert_eq!(c.count(EventKind::SpeculationUsed), 1);
    assert_eq!(
        c.brain_starts().len(),
        2,
        "no third request: the speculation is the answer"
    );
    c.step(Input::Llm(LlmEvent::Delta("For four, sure. ".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(2000);
    let spoken = speaks(&c);
    assert!(spoken.iter().any(|t| t.contains("For four")), "{spoken:?}");
    assert!(
        !spoken.iter().any(|t| t.contains("SPECULATIVE")),
        "{spoken:?}"
    );
    assert_eq!(c.policy.turns(), 1);
}

#[test]
fn end_of_turn_on_other_words_replaces_the_speculation() {
    let mut c = Call::answered("");
    c.policy = std::mem::replace(&mut c.policy, Policy::new(agent(""), 0, false, c.now))
        .with_stt_turns(true);
    c.step(Input::EagerEndOfTurn("book".into()));
    c.step(Input::Llm(LlmEvent::Delta("SPECULATIVE. ".into())));
    c.step(Input::EndOfTurn("book a table".into()));
    assert_eq!(c.details(EventKind::SpeculationCancelled), ["text_changed"]);
    assert_eq!(c.brain_starts().len(), 2);
    c.step(Input::Llm(LlmEvent::Delta("Booked. ".into())));
    c.step(Input::Llm(LlmEvent::Done));
    c.run(2000);
    let spoken = speaks(&c);
    assert!(
        !spoken.iter().any(|t| t.contains("SPECULATIVE")),
        "{spoken:?}"
    );
    assert!(spoken.iter().any(|t| t.contains("Booked")), "{spoken:?}");
}

#[test]
fn a_brain_that_keeps_history_is_never_asked_speculatively() {
    let mut c = Call::answered("");
    c.policy = Policy::new(agent(""), 0, true, c.now).with_stt_turns(true);
    c.step(Input::EagerEndOfTurn("hello".into()));
    assert!(c.brain_starts().is_empty());
    c.step(Input::EndOfTurn("hello".into()));
    assert_eq!(c.brain_starts().len(), 1);
}

#[test]
fn a_stream_stopped_by_the_carriers_transfer_counts_as_transferred() {
    // Twilio and Plivo end the media stream for the transfer, maybe before the REST answer.
    let mut c = Call::answered(TRANSFERS);
    c.act(
        5,
        CallAction::Transfer {
            to: "+14155550123".into(),
        },
    );
    c.run(1200);
    assert!(
        c.log
            .iter()
            .any(|a| matches!(a, Action::Transfer { id: 5, .. }))
    );
    c.step(Input::StreamStopped);
    assert!(matches!(c.replies()[..], [(5, ActionOutcome::Done { .. })]));
    assert!(c.did(&Action::End(EndReason::Transferred("+14155550123".into()))));
    // Without a transfer in flight a stop is just the caller hanging up: nothing to do here.
    let mut c = Call::answered(TRANSFERS);
    c.step(Input::StreamStopped);
    assert!(c.replies().is_empty());
    assert!(!c.log.iter().any(|a| matches!(a, Action::End(_))));
}

#[test]
fn end_call_during_a_barge_in_still_finishes_the_sentence() {
    let mut c = Call::replying("");
    c.speech_start();
    c.voiced(300);
    assert!(matches!(c.policy.phase(), Phase::BargeIn { .. }));
    c.act(
        2,
        CallAction::EndCall {
            reason: "bye".into(),
        },
    );
    c.run(5000);
    assert_eq!(c.ended, Some(EndReason::HungUp("bye".into())));
}
