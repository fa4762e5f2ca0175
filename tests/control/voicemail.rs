//! Voicemail after the beep over the real wire protocols: a call placed through the API with
//! machine detection and a `voicemail_message`, a machine answering (Twilio's answer webhook
//! with `AnsweredBy=machine_start` or `machine_end_beep`, Telnyx's
//! `call.machine.detection.ended` then `call.machine.greeting.ended`, Plivo's `Machine=true`),
//! the machine's media stream carrying a recorded-style greeting (espeak-ng,
//! `tests/fixtures/voicemail/sam.ulaw`) and its beep: the agent's own TTS speaks the message
//! after the beep (never before its last frame went out, never the agent's greeting), the
//! call hangs up through the carrier's REST API once the message has played, the outcome is
//! `voicemail` and the message is on the transcript and the timeline. A machine that hangs
//! up mid-greeting gets nothing (a machine on a call without a message is hung up on:
//! `api::machine_without_a_message_is_hung_up_on_and_busy_is_an_outcome`). The
//! timing figure is measured on the paused clock (`src/app/media/tests/voicemail.rs`).

use crate::common::api::Api;
use crate::common::carrier::{Carrier, Carriers};
use crate::common::*;
use patterd::audio::g711::{ulaw_silence, ulaw_tone};
use patterd_sim::plivo::PlivoAnswer;
use patterd_sim::stream::SimCall;
use patterd_sim::twilio::xml::parse_twiml;
use serde_json::{Value, json};

const CALLEE: &str = "+15557654321";
const MESSAGE: &str = "Hi, this is the clinic. Please call us back.";

fn opts() -> Opts {
    Opts {
        allowed_destinations: vec![CALLEE.into()],
        transcripts: vec!["you have reached Sam leave a message after the tone".into()],
        ..Opts::default()
    }
}

/// Places a call from `from` with machine detection (and `message`); our call id.
async fn originate(stack: &Stack, from: &str, message: Option<&str>) -> String {
    let mut body = json!({"to": CALLEE, "from": from, "machine_detection": true});
    if let Some(m) = message {
        body["voicemail_message"] = json!(m);
    }
    let (s, v) = Api::authed(stack).post("/v1/calls", body).await;
    assert_eq!(s, 201, "{v}");
    v["call_id"].as_str().expect("call_id").to_string()
}

/// The machine's greeting, a pause, and its beep (1 kHz, −12 dBFS, 500 ms), μ-law.
fn greeting_and_beep() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/voicemail/sam.ulaw"
    );
    let mut audio = std::fs::read(path).expect("greeting fixture");
    audio.extend(ulaw_silence(400));
    audio.extend(ulaw_tone(1000.0, 500, 8000));
    audio
}

/// Plays the greeting and its beep into `sim` and waits for the call to hang up: the first
/// agent audio came after the beep's last frame went out, and it was the message.
async fn message_after_the_beep(stack: &Stack, sim: &SimCall) {
    sim.push_audio(&greeting_and_beep());
    sim.wait_closed(WAIT).await.expect("the call hangs up");
    let s = sim.state();
    let beep_sent = s.last_speech_frame_ms.expect("the beep went out");
    let first = s
        .first_agent_audio_ms
        .expect("the message reached the machine");
    assert!(
        first > beep_sent,
        "agent audio at {first} ms, before the beep's end at {beep_sent} ms"
    );
    assert!(s.marks_echoed.len() == 1, "{:?}", s.marks_echoed);
    assert!(
        stack.spoken().iter().any(|t| t == MESSAGE),
        "{:?}",
        stack.spoken()
    );
}

/// The stored call: outcome `voicemail`, answered by `by`, ended after the message, with the
/// message as what the agent said (and the machine heard), and the timeline saying why it went.
async fn assert_voicemail_left(stack: &Stack, id: &str, by: &str, cue: &str) {
    let record = stack.finished(id).await;
    assert_eq!(record.ended_reason, "voicemail left", "{:?}", record.events);
    stack.server.app.store.tx.flush().await.expect("flush");
    let api = Api::authed(stack);
    let (_, v) = api.get(&format!("/v1/calls/{id}")).await;
    assert_eq!(v["outcome"], "voicemail", "{v}");
    assert_eq!(v["answered_by"], by, "{v}");
    let (_, v) = api.get(&format!("/v1/calls/{id}/transcript")).await;
    let agent: Vec<&Value> = v["transcript"]
        .as_array()
        .expect("transcript")
        .iter()
        .filter(|e| e["speaker"] == "agent")
        .collect();
    assert_eq!(agent.len(), 1, "only the message, never the greeting: {v}");
    assert_eq!(agent[0]["text"], MESSAGE, "{v}");
    assert_eq!(agent[0]["heard_text"], MESSAGE, "{v}");
    let (_, v) = api.get(&format!("/v1/calls/{id}/events")).await;
    let events = v["events"].as_array().expect("events");
    let of = |kind: &str| {
        events
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["detail"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(of("machine_detected").len(), 1, "{v}");
    let message = of("voicemail_message");
    assert!(
        message.len() == 1 && message[0].starts_with(&format!("cue={cue} ")),
        "{message:?}"
    );
    assert!(
        of("llm_request").is_empty(),
        "the brain heard a machine: {v}"
    );
}

#[tokio::test]
async fn twilio_machine_start_hears_the_message_after_the_beep() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, OUR_NUMBER, Some(MESSAGE)).await;
    let created = stack.rest.created();
    assert_eq!(
        created[0].field("MachineDetection").as_deref(),
        Some("Enable")
    );
    let answer = stack
        .twilio
        .answer_outbound(&created[0], Some("machine_start"))
        .await
        .expect("answer webhook");
    let twiml = parse_twiml(&answer.body).expect("TwiML");
    assert!(twiml.stream_url.is_some(), "{}", answer.body);
    assert!(!answer.body.contains("<Say>"), "{}", answer.body);
    let sim = stack.open(&id, &twiml).await;
    message_after_the_beep(&stack, &sim).await;
    stack.wait_rest_hang_up(Carrier::Twilio, &id).await;
    assert_voicemail_left(&stack, &id, "machine_start", "beep").await;
    let bytes = beep_events(&stack, &id).await;
    assert!(bytes.contains("freq_hz=1000"), "{bytes}");
}

/// The `beep` event's detail of call `id`.
async fn beep_events(stack: &Stack, id: &str) -> String {
    let (_, v) = Api::authed(stack)
        .get(&format!("/v1/calls/{id}/events"))
        .await;
    v["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "beep")
        .map(|e| e["detail"].as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `MachineDetection=DetectMessageEnd`'s answers come after the greeting: the message goes
/// at once, without waiting for a beep.
#[tokio::test]
async fn twilio_machine_end_beep_hears_the_message_at_once() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, OUR_NUMBER, Some(MESSAGE)).await;
    let created = stack.rest.created();
    let answer = stack
        .twilio
        .answer_outbound(&created[0], Some("machine_end_beep"))
        .await
        .expect("answer webhook");
    let sim = stack
        .open(&id, &parse_twiml(&answer.body).expect("TwiML"))
        .await;
    sim.wait_closed(WAIT).await.expect("the call hangs up");
    assert!(sim.state().first_agent_audio_ms.is_some());
    stack.wait_rest_hang_up(Carrier::Twilio, &id).await;
    assert_voicemail_left(&stack, &id, "machine_end_beep", "carrier").await;
}

/// A machine that hangs up mid-greeting hears nothing; the outcome stays `voicemail`.
#[tokio::test]
async fn a_machine_hanging_up_mid_greeting_gets_nothing() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, OUR_NUMBER, Some(MESSAGE)).await;
    let created = stack.rest.created();
    let answer = stack
        .twilio
        .answer_outbound(&created[0], Some("machine_start"))
        .await
        .expect("answer webhook");
    let sim = stack
        .open(&id, &parse_twiml(&answer.body).expect("TwiML"))
        .await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/voicemail/sam.ulaw"
    );
    sim.push_audio(&std::fs::read(path).expect("greeting fixture")[..8000]);
    sim.wait_for("the first second", WAIT, |s| s.speech_frames_sent >= 50)
        .await
        .expect("sent");
    sim.hang_up().await;
    let record = stack.finished(&id).await;
    assert_eq!(record.ended_reason, "caller hung up");
    assert_eq!(
        sim.state().agent_audio_bytes,
        0,
        "the machine heard the agent"
    );
    stack.server.app.store.tx.flush().await.expect("flush");
    let (_, v) = Api::authed(&stack).get(&format!("/v1/calls/{id}")).await;
    assert_eq!(v["outcome"], "voicemail", "{v}");
}

/// Telnyx: `detect_beep`; a machine gets the stream (never Telnyx's own `speak`), and
/// `call.machine.greeting.ended` lets the message go when no beep was heard in-band.
#[tokio::test]
async fn telnyx_machine_hears_the_message_when_the_greeting_ends() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, TELNYX_NUMBER, Some(MESSAGE)).await;
    let d = stack.telnyx_rest.dialled()[0].clone();
    assert_eq!(d.body["answering_machine_detection"], "detect_beep");
    let sim = stack
        .telnyx
        .answer_outbound(&stack.telnyx_rest, &d, &stack.ws_base(), Some("machine"))
        .await
        .expect("telnyx answers")
        .expect("the machine gets the stream");
    // The greeting, quietly ending (no beep in it): the carrier says when it is over.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/voicemail/sam.ulaw"
    );
    let greeting = std::fs::read(path).expect("greeting fixture");
    let frames = greeting.len().div_ceil(160) as u64;
    sim.push_audio(&greeting);
    sim.wait_for("the greeting", WAIT, |s| s.speech_frames_sent >= frames)
        .await
        .expect("sent");
    assert_eq!(sim.state().agent_audio_bytes, 0, "the message went early");
    let r = stack
        .telnyx
        .greeting_ended(&id, "beep_detected")
        .await
        .expect("greeting ended");
    assert_eq!(r.status, 200);
    sim.wait_closed(WAIT).await.expect("the call hangs up");
    assert!(sim.state().first_agent_audio_ms.is_some());
    let rec = stack.telnyx_rest.record();
    assert!(rec.ok("speak").is_empty(), "Telnyx's own TTS spoke");
    stack.wait_rest_hang_up(Carrier::Telnyx, &id).await;
    assert_voicemail_left(&stack, &id, "machine", "carrier").await;
    // A late greeting-ended for the finished call changes nothing.
    let r = stack
        .telnyx
        .greeting_ended(&id, "ended")
        .await
        .expect("greeting ended");
    assert_eq!(r.status, 200);
}

/// `call.machine.greeting.ended` for a call a person answered changes nothing: the agent
/// greets and listens as ever.
#[tokio::test]
async fn telnyx_greeting_ended_on_a_person_changes_nothing() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, TELNYX_NUMBER, Some(MESSAGE)).await;
    let d = stack.telnyx_rest.dialled()[0].clone();
    let sim = stack
        .telnyx
        .answer_outbound(&stack.telnyx_rest, &d, &stack.ws_base(), Some("human"))
        .await
        .expect("telnyx answers")
        .expect("a person gets the stream");
    let r = stack
        .telnyx
        .greeting_ended(&id, "ended")
        .await
        .expect("greeting ended");
    assert_eq!(r.status, 200);
    sim.wait_for("the greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("the agent greets");
    assert!(
        !stack.spoken().iter().any(|t| t == MESSAGE),
        "{:?}",
        stack.spoken()
    );
    assert!(
        stack.server.app.calls.get(&id).is_some(),
        "the call goes on"
    );
    sim.hang_up().await;
    let record = stack.finished(&id).await;
    assert_eq!(record.ended_reason, "caller hung up");
    assert_eq!(
        record
            .events_of(patterd::call::EventKind::MachineDetected)
            .count(),
        0
    );
}

/// Plivo: `Machine=true` gets the stream; the message goes after the beep heard in-band.
#[tokio::test]
async fn plivo_machine_hears_the_message_after_the_beep() {
    let stack = Stack::start(opts()).await;
    let id = originate(&stack, PLIVO_NUMBER, Some(MESSAGE)).await;
    let c = stack.plivo_rest.created()[0].clone();
    assert_eq!(c.field("machine_detection"), Some("true"));
    let (uuid, r) = stack
        .plivo
        .answer_outbound(&c, Some(true))
        .await
        .expect("answer URL");
    let a = PlivoAnswer::parse(&r.body).expect("Plivo XML");
    assert!(a.speak.is_empty() && a.hangup.is_none(), "{}", r.body);
    let sim = stack
        .plivo
        .open_stream(&a, &stack.ws_base(), &uuid)
        .await
        .expect("stream opens");
    message_after_the_beep(&stack, &sim).await;
    stack.wait_rest_hang_up(Carrier::Plivo, &uuid).await;
    assert_voicemail_left(&stack, &id, "machine", "beep").await;
}
