//! Conversation scenarios through the Twilio simulator with real (espeak-ng) speech from
//! tests/fixtures/speech: interruptions, backchannels, coughs and clicks, the agent's own voice
//! echoed back at -20 dB and an idle caller. (The timing of backchannels, an unfinished
//! phrase's pause, interruptions, fillers and turns without barge-in is tested on the paused
//! clock with the call in memory: `src/call/driver/tests.rs`.) Each test asserts behaviour;
//! `conversation_figures` also prints the figures of docs/conversation.md
//! (`cargo test --release --test calls -- --nocapture conversation_figures`).

use std::time::Duration;

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::call::{CallRecord, Speaker};
use patterd_sim::hermes::{HermesRecord, HermesReply};
use patterd_sim::twilio::call::{SimCall, TimelineEvent};

pub(crate) const S1: &str = "We are open every day from noon until ten.";
pub(crate) const S2: &str = "We can seat groups of up to twelve people.";
pub(crate) const S3: &str = "The kitchen closes an hour before we do.";
pub(crate) const S4: &str = "Would you like me to book a table for you?";
pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) fn reply() -> String {
    format!("{S1} {S2} {S3} {S4}")
}

pub(crate) fn opts(transcripts: &[&str], agent_extra: &str) -> Opts {
    Opts {
        transcripts: transcripts.iter().map(|t| t.to_string()).collect(),
        agent_extra: agent_extra.to_string(),
        // The agent speaks with a real voice at about 16 characters a second.
        voice: Some((clip("agent_voice"), 60)),
        long_turn_after_s: 20.0,
        ..Default::default()
    }
}

async fn stack(transcripts: &[&str], agent_extra: &str) -> Stack {
    Stack::start(opts(transcripts, agent_extra)).await
}

/// The caller's first turn in every scenario, and the booking the reply answers.
const BOOKING: &str = "I would like to book a table for four people on Tuesday evening.";

/// The caller's turns of the interruption scenarios: the booking, then "no, I meant Tuesday"
/// over the reply, then silence.
pub(crate) const TUESDAY: [&str; 4] = [BOOKING, "no, I meant Tuesday", "", ""];

/// Waits until the call's record satisfies `pred` (up to `LONG`): checks a snapshot each time
/// the call records an event, and the final record once it has ended. No polling.
pub(crate) async fn wait_record(
    stack: &Stack,
    sid: &str,
    what: &str,
    pred: impl Fn(&CallRecord) -> bool,
) -> CallRecord {
    let calls = &stack.server.app.calls;
    let wait = async {
        let Some(h) = calls.get(sid) else {
            return calls.finished(sid);
        };
        // Subscribed before the first snapshot, so no event between the two is missed.
        let mut changes = h.changes();
        loop {
            match h.snapshot().await {
                Ok(r) if pred(&r) => return Some(r),
                Ok(_) => {}
                Err(_) => return calls.wait_finished(sid).await,
            }
            if changes.changed().await.is_err() {
                return calls.wait_finished(sid).await;
            }
        }
    };
    let r = tokio::time::timeout(LONG, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("no record of call {sid} while waiting for {what}"));
    assert!(pred(&r), "call ended before {what}: {r:#?}");
    r
}

pub(crate) fn agent_reply(r: &CallRecord) -> Option<&patterd::call::TranscriptEntry> {
    r.transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text.starts_with("We are open"))
}

/// The caller says "no, I meant Tuesday" (the brain will answer "Tuesday it is."); returns the
/// brain's record once that turn reached it (`what`) and the call's once the turn is stored.
pub(crate) async fn says_tuesday(
    stack: &Stack,
    sid: &str,
    sim: &SimCall,
    what: &str,
) -> (HermesRecord, CallRecord) {
    stack.hermes.push(HermesReply::text("Tuesday it is."));
    sim.push_audio(&clip("no_tuesday"));
    let h = stack
        .hermes
        .wait_until(what, |r| r.requests.len() >= 2)
        .await;
    let r = wait_record(stack, sid, "the second turn", |r| {
        r.events_of("llm_request").count() >= 2
    })
    .await;
    (h, r)
}

/// Greeting, a caller turn, and the long reply playing; returns once its first sentence was
/// heard.
pub(crate) async fn into_reply(stack: &Stack) -> (String, SimCall) {
    stack.hermes.push(HermesReply::text(&reply()));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    sim.push_audio(&clip("book_table"));
    sim.wait_for("first reply sentence heard", LONG, |s| {
        s.marks_echoed.len() >= 2
    })
    .await
    .expect("reply plays");
    (sid, sim)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Interruption,
    Backchannel,
    Noise,
    Echo,
}

#[derive(Debug, Default)]
struct Outcome {
    onset_to_clear_ms: Option<u64>,
    committed: bool,
    resumed_and_finished: bool,
    heard_exact: Option<bool>,
    eot_ms: Vec<u64>,
}

/// Plays `overlay` over the agent's reply and reports what happened.
async fn scenario(kind: Kind, overlay: &str, transcript: &str) -> Outcome {
    let stack = stack(
        // The fake hands out one transcript per burst of speech it hears; a clip it hears
        // as two bursts gets nothing for the second.
        &[BOOKING, transcript, "", ""],
        "idle_nudge_after_s = 0",
    )
    .await;
    let (sid, sim) = into_reply(&stack).await;
    stack.hermes.push(HermesReply::text("Sure, no problem."));
    let pushed_at = sim.state().timeline.last().map_or(0, |e| e.at_ms);
    sim.push_audio(&clip(overlay));
    let mut out = Outcome::default();
    let record = if kind == Kind::Interruption {
        stack
            .hermes
            .wait_until("the caller's new turn", |r| r.requests.len() >= 2)
            .await;
        out.committed = true;
        wait_record(&stack, &sid, "the second reply", |r| {
            r.events_of("llm_request").count() >= 2
        })
        .await
    } else {
        // A false alarm: the reply must still be heard to its end.
        let r = wait_record(&stack, &sid, "the whole reply heard", |r| {
            agent_reply(r).is_some_and(|e| e.heard_text == reply())
        })
        .await;
        out.resumed_and_finished = true;
        out.committed = stack.hermes.record().requests.len() >= 2;
        r
    };
    let state = sim.state();
    if std::env::var_os("CONVERSATION_DEBUG").is_some() {
        eprintln!("--- {kind:?} {overlay}");
        for e in &record.events {
            eprintln!("{:6} {} {}", e.t_ms, e.kind, e.detail);
        }
        for e in &record.transcript {
            eprintln!(
                "{:?} {:?} heard={:?} int={}",
                e.speaker, e.text, e.heard_text, e.interrupted
            );
        }
    }
    let onset = state
        .timeline
        .iter()
        .find(|e| e.at_ms >= pushed_at && e.event == TimelineEvent::SentSpeechStart)
        .map(|e| e.at_ms);
    let clear = state.clears.iter().copied().find(|c| *c >= pushed_at);
    if let (Some(o), Some(c)) = (onset, clear) {
        out.onset_to_clear_ms = Some(c.saturating_sub(o));
    }
    if kind == Kind::Interruption {
        let entry = agent_reply(&record).expect("reply entry");
        assert!(entry.interrupted, "{entry:?}");
        // Sentences whose marks came back before the clear were heard whole; with the fake's
        // word timings, words of the cut sentence may follow (heard::test_heard_accuracy
        // checks those words against the carrier's play position).
        let clear = clear.expect("an interruption sends clear");
        let k = state
            .marks_echoed
            .iter()
            .filter(|(t, n)| *t < clear && n != "u1")
            .count();
        let expected = [S1, S2, S3, S4][..k.min(4)].join(" ");
        assert!(
            reply().starts_with(&entry.heard_text),
            "heard text is a prefix"
        );
        out.heard_exact = Some(
            entry.heard_text.starts_with(&expected)
                && entry.heard_text[expected.len()..]
                    .matches(['.', '?'])
                    .count()
                    <= 1,
        );
        // Hermes is told what was heard, before the caller's words.
        let h = stack.hermes.record();
        let (role, content) = h.requests[1]
            .messages()
            .last()
            .cloned()
            .expect("a user message");
        assert_eq!(role, "user");
        assert!(
            content.starts_with("[The caller interrupted you"),
            "{content}"
        );
        assert!(content.contains(&entry.heard_text), "{content}");
        assert!(content.ends_with(transcript.trim()), "{content}");
    }
    out.eot_ms = record
        .events_of("turn_end")
        .filter_map(|e| e.detail.split("silence_ms=").nth(1)?.parse().ok())
        .collect();
    assert!(
        state.protocol_errors.is_empty(),
        "{:?}",
        state.protocol_errors
    );
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
    out
}

fn pct(v: &mut [u64], p: f64) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    format!("{} ms", v[i])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_figures() {
    use Kind::*;
    let set: Vec<(Kind, &str, &str)> = vec![
        (Interruption, "wait_stop", "wait, stop"),
        (Interruption, "no_tuesday", "no, I meant Tuesday"),
        (
            Interruption,
            "change_booking",
            "Could you change my booking to Friday instead?",
        ),
        (Backchannel, "mm_hmm", "mm-hmm"),
        (Backchannel, "yeah", "yeah"),
        (Backchannel, "uh_huh", "uh-huh"),
        (Noise, "cough", ""),
        (Noise, "click", ""),
        (Echo, "agent_echo", S2),
    ];
    let runs: Vec<_> = set
        .iter()
        .map(|(k, o, t)| tokio::spawn(scenario(*k, o, t)))
        .collect();
    let mut results = Vec::new();
    for ((kind, overlay, _), run) in set.iter().zip(runs) {
        let out = run.await.expect("scenario ran");
        println!("{kind:?} {overlay}: {out:?}");
        results.push((*kind, out));
    }
    let real = |k: &Kind| *k == Interruption;
    let mut clear_ms: Vec<u64> = results
        .iter()
        .filter(|(k, _)| real(k))
        .filter_map(|(_, o)| o.onset_to_clear_ms)
        .collect();
    let false_set: Vec<&Outcome> = results
        .iter()
        .filter(|(k, _)| !real(k))
        .map(|(_, o)| o)
        .collect();
    let false_stops = false_set
        .iter()
        .filter(|o| o.onset_to_clear_ms.is_some())
        .count();
    let false_commits = false_set.iter().filter(|o| o.committed).count();
    let resumed = false_set.iter().filter(|o| o.resumed_and_finished).count();
    let real_n = results.iter().filter(|(k, _)| real(k)).count();
    let missed = results
        .iter()
        .filter(|(k, o)| real(k) && (!o.committed || o.onset_to_clear_ms.is_none()))
        .count();
    let heard = results
        .iter()
        .filter_map(|(_, o)| o.heard_exact)
        .collect::<Vec<_>>();
    let mut eot: Vec<u64> = results.iter().flat_map(|(_, o)| o.eot_ms.clone()).collect();
    println!("== conversation figures ==");
    println!(
        "barge-in onset -> clear: p50 {} / p90 {} (n={})",
        pct(&mut clear_ms, 0.5),
        pct(&mut clear_ms, 0.9),
        clear_ms.len()
    );
    println!(
        "false set (backchannel/noise/echo): {} runs, {false_stops} stopped, {false_commits} committed, {resumed} resumed and finished",
        false_set.len()
    );
    println!("missed real interruptions: {missed} of {real_n}");
    println!(
        "heard text = confirmed sentences + words of the cut one: {} of {}",
        heard.iter().filter(|h| **h).count(),
        heard.len()
    );
    println!(
        "end of speech -> turn committed: p50 {} / p90 {} (n={})",
        pct(&mut eot, 0.5),
        pct(&mut eot, 0.9),
        eot.len()
    );
    // Behaviour, not timing: real interruptions stop and take the turn; false alarms never
    // take the turn and the agent always finishes.
    assert_eq!(missed, 0);
    assert_eq!(false_commits, 0);
    assert_eq!(resumed, false_set.len());
}

#[tokio::test]
async fn an_idle_caller_is_nudged_then_told_goodbye_and_hung_up_on() {
    let stack = Stack::start(Opts {
        agent_extra: "idle_nudge_after_s = 1\nidle_max_nudges = 2\n\
                      idle_nudge_message = \"Still there?\"\n\
                      idle_goodbye_message = \"Goodbye for now.\""
            .into(),
        ..Default::default()
    })
    .await;
    let (sid, sim) = stack.call().await;
    let record = stack.finished(&sid).await;
    assert_eq!(record.ended_reason, "caller silent");
    assert_eq!(record.events_of("idle_nudge").count(), 2);
    assert_eq!(record.events_of("idle_goodbye").count(), 1);
    assert_eq!(
        stack.spoken(),
        vec![GREETING, "Still there?", "Still there?", "Goodbye for now."]
    );
    // The goodbye was played to its end before the hang-up.
    let s = sim.state();
    assert!(s.marks_echoed.len() >= 4, "{:?}", s.marks_echoed);
    stack
        .rest
        .wait_for_requests(1, WAIT)
        .await
        .expect("REST hang-up");
    assert_eq!(stack.rest.hung_up().len(), 1);
}

/// Index of the `n`th (0-based) event of `kind` in the record.
fn nth_event(r: &CallRecord, kind: &str, n: usize) -> Option<usize> {
    r.events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == kind)
        .nth(n)
        .map(|(i, _)| i)
}

#[tokio::test]
async fn an_uninterruptible_greeting_plays_through_but_a_later_reply_is_cut() {
    let greeting = "Hello, thanks for calling the Harbour Kitchen. We are a small family \
                    restaurant by the water, and I can help you with opening hours, \
                    bookings and the menu.";
    let stack = Stack::start(Opts {
        first_message: greeting.into(),
        ..opts(
            &TUESDAY,
            "greeting_interruptible = false\nidle_nudge_after_s = 0",
        )
    })
    .await;
    stack.hermes.push(HermesReply::text(&reply()));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting audio", WAIT, |s| s.first_agent_audio_ms.is_some())
        .await
        .expect("greeting plays");
    // The caller talks over the greeting.
    sim.push_audio(&clip("book_table"));
    let h = stack
        .hermes
        .wait_until("the caller's turn", |r| !r.requests.is_empty())
        .await;
    let (_, content) = h.requests[0].messages().last().cloned().expect("message");
    assert_eq!(
        content,
        "I would like to book a table for four people on Tuesday evening."
    );
    // The reply starts playing after the whole greeting; then the caller cuts it.
    sim.wait_for("first reply sentence heard", LONG, |s| {
        s.marks_echoed.len() >= 2
    })
    .await
    .expect("reply plays");
    let (_, r) = says_tuesday(&stack, &sid, &sim, "the interrupting turn").await;
    let g = r
        .transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text == greeting)
        .expect("greeting entry");
    assert!(!g.interrupted, "{g:?}");
    assert_eq!(g.heard_text, greeting, "the greeting was heard whole");
    // The caller started speaking before the greeting was over, and the first turn was taken
    // while it still played (queued, not cut).
    let speech = nth_event(&r, "speech_start", 0).expect("speech_start");
    let first_mark = nth_event(&r, "mark_played", 0).expect("greeting mark");
    let first_request = nth_event(&r, "llm_request", 0).expect("first llm_request");
    assert!(speech < first_mark, "{:#?}", r.events);
    assert!(first_request < first_mark, "{:#?}", r.events);
    let reply_entry = agent_reply(&r).expect("reply entry");
    assert!(reply_entry.interrupted, "{reply_entry:?}");
    let s = sim.state();
    let greeting_back = s.marks_echoed.first().map(|(t, _)| *t).expect("mark");
    assert!(!s.clears.is_empty(), "the reply was cut");
    assert!(
        s.clears.iter().all(|c| *c > greeting_back),
        "only the reply was cleared: {:?} (greeting back at {greeting_back})",
        s.clears
    );
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
}

/// Interrupts the long reply with "no, I meant Tuesday" on an agent using brain `llm`; returns
/// the second request's messages and what the caller heard of the reply.
async fn interrupted_history(llm: &str) -> (Vec<(String, String)>, String) {
    let stack = Stack::start(Opts {
        llm: llm.into(),
        ..opts(&TUESDAY, "idle_nudge_after_s = 0")
    })
    .await;
    let (sid, sim) = into_reply(&stack).await;
    let (h, r) = says_tuesday(&stack, &sid, &sim, "the interrupting turn").await;
    let entry = agent_reply(&r).expect("reply entry");
    assert!(entry.interrupted, "{entry:?}");
    assert!(!entry.heard_text.is_empty(), "a sentence was heard first");
    assert!(entry.heard_text != reply(), "the reply was cut: {entry:?}");
    assert!(reply().starts_with(&entry.heard_text), "{entry:?}");
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
    (h.requests[1].messages(), entry.heard_text.clone())
}

#[tokio::test]
async fn an_interrupted_reply_reaches_each_brain_as_what_was_heard() {
    let (compat, hermes) =
        tokio::join!(interrupted_history("compat"), interrupted_history("hermes"));
    let first = "I would like to book a table for four people on Tuesday evening.";
    // openai_compatible: the whole history, the reply truncated to what was heard and marked.
    let (messages, heard) = compat;
    let pair = |r: &str, c: &str| (r.to_string(), c.to_string());
    assert_eq!(
        messages,
        vec![
            pair("system", SYSTEM_PROMPT),
            pair("user", first),
            pair("assistant", &format!("{heard} [interrupted by the caller]")),
            pair("user", "no, I meant Tuesday"),
        ]
    );
    // Hermes keeps its own (whole) copy: the next user message starts with a bracketed note.
    let (messages, heard) = hermes;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0], pair("system", SYSTEM_PROMPT));
    assert_eq!(
        messages[1],
        pair(
            "user",
            &format!(
                "[The caller interrupted you; of your last reply they heard only: \"{heard}\"] \
                 no, I meant Tuesday"
            )
        )
    );
}

/// The first `ms` of the agent's voice at `gain` (0–1): its own speech coming back down the
/// line.
fn echo_of_agent(ms: usize, gain: f32) -> Vec<u8> {
    use patterd::audio::g711::{decode_ulaw, encode_ulaw};
    let voice = clip("agent_voice");
    let pcm: Vec<i16> = decode_ulaw(&voice[..(ms * 8).min(voice.len())])
        .into_iter()
        .map(|s| (f32::from(s) * gain) as i16)
        .collect();
    encode_ulaw(&pcm)
}

#[tokio::test]
async fn a_loud_echo_the_stt_transcribes_is_ignored_and_the_reply_goes_on() {
    // At -6 dB the fake Deepgram hears the echo as speech and "transcribes" it as the
    // sentence the agent is saying (the -20 dB echo of the figures is below its threshold).
    let stack = stack(&[BOOKING, S2, S2, S2], "idle_nudge_after_s = 0").await;
    let (sid, sim) = into_reply(&stack).await;
    sim.push_audio(&echo_of_agent(1440, 0.5));
    let r = wait_record(&stack, &sid, "the whole reply heard", |r| {
        agent_reply(r).is_some_and(|e| e.heard_text == reply())
    })
    .await;
    if std::env::var_os("CONVERSATION_DEBUG").is_some() {
        for e in &r.events {
            eprintln!("{:6} {} {}", e.t_ms, e.kind, e.detail);
        }
    }
    let ignored: Vec<_> = r.events_of("echo_ignored").collect();
    assert!(!ignored.is_empty(), "{:#?}", r.events);
    assert!(ignored.iter().all(|e| e.detail == S2), "{ignored:?}");
    assert_eq!(r.events_of("barge_in_commit").count(), 0);
    assert_eq!(r.events_of("interrupted").count(), 0);
    assert_eq!(
        r.events_of("llm_request").count(),
        1,
        "no caller turn taken"
    );
    let entry = agent_reply(&r).expect("reply entry");
    assert!(!entry.interrupted, "{entry:?}");
    assert!(
        !r.transcript
            .iter()
            .any(|e| e.speaker == Speaker::Caller && e.text == S2),
        "the echo is not a caller turn"
    );
    assert_eq!(stack.hermes.record().requests.len(), 1);
    let s = sim.state();
    assert!(s.protocol_errors.is_empty(), "{:?}", s.protocol_errors);
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
}

/// Our detector and the speech-to-text disagreeing about the end of a turn.
mod turns;
