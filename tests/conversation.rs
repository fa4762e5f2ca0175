//! Conversation scenarios through the Twilio simulator with real (espeak-ng) speech from
//! tests/fixtures/speech: interruptions, backchannels, coughs and clicks, the agent's own voice
//! echoed back at -20 dB, a long pause mid-sentence and an idle caller. Each test asserts
//! behaviour; `conversation_figures` also prints the figures of docs/conversation.md
//! (`cargo test --release --test conversation -- --nocapture conversation_figures`).

mod common;

use std::time::Duration;

use common::*;
use patterd::call::{CallRecord, Speaker};
use patterd::sim::hermes::HermesReply;
use patterd::sim::twilio::call::{SimCall, TimelineEvent};

const S1: &str = "We are open every day from noon until ten.";
const S2: &str = "We can seat groups of up to twelve people.";
const S3: &str = "The kitchen closes an hour before we do.";
const S4: &str = "Would you like me to book a table for you?";
const LONG: Duration = Duration::from_secs(30);

fn clip(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/speech/{name}.ulaw",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn reply() -> String {
    format!("{S1} {S2} {S3} {S4}")
}

async fn stack(transcripts: &[&str], agent_extra: &str) -> Stack {
    Stack::start(Opts {
        transcripts: transcripts.iter().map(|t| t.to_string()).collect(),
        agent_extra: agent_extra.to_string(),
        // The agent speaks with a real voice at about 16 characters a second.
        voice: Some((clip("agent_voice"), 60)),
        long_turn_after_s: 20.0,
        ..Default::default()
    })
    .await
}

/// Polls the live call's record until `pred` holds (up to `LONG`).
async fn wait_record(
    stack: &Stack,
    sid: &str,
    what: &str,
    pred: impl Fn(&CallRecord) -> bool,
) -> CallRecord {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        if let Some(h) = stack.server.app.calls.get(sid)
            && let Ok(r) = h.snapshot().await
            && pred(&r)
        {
            return r;
        }
        if let Some(r) = stack.server.app.calls.finished(sid) {
            assert!(pred(&r), "call ended before {what}: {r:#?}");
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn agent_reply(r: &CallRecord) -> Option<&patterd::call::TranscriptEntry> {
    r.transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text.starts_with("We are open"))
}

/// Greeting, a caller turn, and the long reply playing; returns once its first sentence was
/// heard.
async fn into_reply(stack: &Stack) -> (String, SimCall) {
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
        &[
            "I would like to book a table for four people on Tuesday evening.",
            transcript,
            "",
            "",
        ],
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
        // Sentences whose marks came back before the clear are what the caller heard.
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
        out.heard_exact = Some(entry.heard_text == expected);
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
        "heard prefix exact (sentence marks): {} of {}",
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
async fn backchannel_over_the_agent_stops_it_briefly_then_it_resumes() {
    let out = scenario(Kind::Backchannel, "mm_hmm", "mm-hmm").await;
    assert!(!out.committed);
    assert!(out.resumed_and_finished);
}

#[tokio::test]
async fn a_pause_after_an_unfinished_phrase_is_one_turn() {
    let stack = stack(
        &["I need to", "move it to the afternoon."],
        "idle_nudge_after_s = 0",
    )
    .await;
    stack.hermes.push(HermesReply::text("Done."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    sim.push_audio(&clip("need_to"));
    sim.push_silence(1200);
    sim.push_audio(&clip("move_it"));
    let h = stack
        .hermes
        .wait_until("the turn", |r| !r.requests.is_empty())
        .await;
    let (_, content) = h.requests[0].messages().last().cloned().expect("message");
    assert_eq!(content, "I need to move it to the afternoon.");
    sim.hang_up().await;
    let record = stack.finished(&sid).await;
    assert_eq!(record.events_of("llm_request").count(), 1);
    assert!(record.events_of("speech_start").count() >= 2);
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
