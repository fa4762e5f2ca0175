//! Whole calls through the real wire protocols on 127.0.0.1: the Twilio simulator signs the
//! webhook and speaks Media Streams; patterd talks to fake Deepgram, ElevenLabs and Hermes.

mod common;

use common::*;
use patterd::call::Speaker;
use patterd::sim::hermes::{HermesReply, HermesStep};

#[tokio::test]
async fn greeting_then_two_turns_with_one_hermes_session() {
    let stack = Stack::start(Opts {
        transcripts: vec!["I would like a table".into(), "for two people".into()],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Sure. What day works for you?"));
    stack.hermes.push(HermesReply::text("Great, two people it is."));

    let (call_sid, sim) = stack.call().await;

    // The greeting plays at start and its mark comes back.
    let s = sim
        .wait_for("greeting audio and its mark", WAIT, |s| {
            s.agent_audio_bytes > 0 && !s.marks_echoed.is_empty()
        })
        .await
        .expect("greeting");
    assert!(s.first_agent_audio_ms.is_some());
    assert!(s.protocol_errors.is_empty(), "{:?}", s.protocol_errors);
    assert_eq!(stack.spoken()[0], GREETING);

    // Turn 1.
    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("first turn", |r| r.requests.len() == 1)
        .await;
    let r1 = &rec.requests[0];
    let session = format!("patter-call-{call_sid}");
    assert_eq!(r1.header("X-Hermes-Session-Id"), Some(session.as_str()));
    assert_eq!(
        r1.header("Authorization"),
        Some(format!("Bearer {HERMES_KEY}").as_str())
    );
    assert!(
        r1.header("X-Hermes-Session-Key")
            .is_some_and(|k| k.starts_with("patter-caller-") && k.len() == 14 + 16)
    );
    assert_eq!(r1.body["user"], session.as_str());
    assert_eq!(r1.body["stream"], true);
    assert_eq!(
        r1.messages(),
        vec![
            ("system".to_string(), SYSTEM_PROMPT.to_string()),
            ("user".to_string(), "I would like a table".to_string()),
        ]
    );
    // The reply is spoken: two sentences, each followed by a mark that comes back.
    sim.wait_for("reply marks", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .expect("reply audio and marks");

    // Turn 2: same session, only the new caller message.
    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("second turn", |r| r.requests.len() == 2)
        .await;
    let r2 = &rec.requests[1];
    assert_eq!(r2.header("X-Hermes-Session-Id"), Some(session.as_str()));
    assert_eq!(
        r2.messages(),
        vec![
            ("system".to_string(), SYSTEM_PROMPT.to_string()),
            ("user".to_string(), "for two people".to_string()),
        ]
    );
    sim.wait_for("second reply mark", WAIT, |s| s.marks_echoed.len() >= 4)
        .await
        .expect("second reply");

    let spoken = stack.spoken();
    assert!(spoken.contains(&"Sure.".to_string()), "{spoken:?}");
    assert!(spoken.contains(&"What day works for you?".to_string()), "{spoken:?}");
    assert!(spoken.contains(&"Great, two people it is.".to_string()), "{spoken:?}");
    let el = stack.el.record();
    assert!(el.requests.iter().all(|r| r.query.iter().any(|(k, v)| k == "output_format" && v == "ulaw_8000")));

    // Deepgram got μ-law 8 kHz straight through.
    let dg = stack.dg.record();
    assert_eq!(dg.connections.len(), 1);
    assert_eq!(dg.connections[0].param("encoding"), Some("mulaw"));
    assert_eq!(dg.connections[0].param("sample_rate"), Some("8000"));

    sim.hang_up().await;
    let record = stack.finished(&call_sid).await;
    assert_eq!(record.ended_reason, "caller hung up");
    let who: Vec<(Speaker, &str)> = record
        .transcript
        .iter()
        .map(|e| (e.speaker, e.heard_text.as_str()))
        .collect();
    assert_eq!(
        who,
        vec![
            (Speaker::Agent, GREETING),
            (Speaker::Caller, "I would like a table"),
            (Speaker::Agent, "Sure. What day works for you?"),
            (Speaker::Caller, "for two people"),
            (Speaker::Agent, "Great, two people it is."),
        ]
    );
    assert!(!record.from_masked.contains("7654321") || record.from_masked.ends_with("4321"));
    assert_eq!(record.from_masked, "+1555***4321");
    // The caller hung up: patterd must not also hang up through the REST API.
    assert!(stack.rest.hung_up().is_empty());
    // Nothing left running for the call: Deepgram got CloseStream.
    stack
        .dg
        .wait_until("deepgram closed", |r| {
            r.connections.iter().all(|c| c.close_streams > 0 || c.closed.is_some())
        })
        .await;
    let first_frame_us: u64 = record
        .events_of("greeting_first_frame")
        .next()
        .expect("greeting first frame event")
        .detail
        .parse()
        .expect("micros");
    assert!(first_frame_us < 1_000_000, "greeting took {first_frame_us} µs");
    let _ = HermesStep::KeepAlive;
}
