//! Whole calls (Twilio) through the `openai_realtime` STT and through STT fallback chains:
//! the caller's words reach the brain over OpenAI Realtime transcription (μ-law passed
//! through, the session configured as documented), and a primary STT that refuses the
//! connection (HTTP 503 on the handshake, or nothing listening) hands the call to the backup,
//! which hears the caller; the switch is on the call's timeline and in `/metrics`.

use crate::common::*;
use patterd::app::metrics::Provider;
use patterd::config::SttKind;
use patterd::provider::fallback_stt::SttSwitchReason;
use patterd_sim::assemblyai::{AssemblyAiFailure, FakeAssemblyAi, FakeAssemblyAiConfig};
use patterd_sim::hermes::HermesReply;
use patterd_sim::openai_realtime::{FakeOpenAiRealtime, FakeOpenAiRealtimeConfig};

const RT_KEY: &str = "sk-realtime-test";
const WORDS: &str = "I need a table for four";

async fn realtime_fake() -> FakeOpenAiRealtime {
    FakeOpenAiRealtime::start_with(FakeOpenAiRealtimeConfig {
        api_key: RT_KEY.into(),
        utterances: vec![WORDS.into()],
        ..Default::default()
    })
    .await
    .expect("fake realtime")
}

fn realtime_section(fake: &FakeOpenAiRealtime) -> String {
    format!(
        "[stt.rt]\nkind = \"openai_realtime\"\nbase_url = \"{}\"\napi_key = \"{RT_KEY}\"\n",
        fake.base_url()
    )
}

/// The last user message of the brain's first request.
fn first_user_message(stack: &Stack) -> Option<String> {
    stack.hermes.record().requests[0]
        .messages()
        .into_iter()
        .rev()
        .find(|(role, _)| role == "user")
        .map(|(_, t)| t)
}

/// The greeting plays, the caller speaks, the turn reaches the brain, the reply plays, the
/// caller hangs up; returns the call's record.
async fn one_turn(stack: &Stack) -> patterd::call::CallRecord {
    stack.hermes.push(HermesReply::text("For four, sure."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    stack
        .hermes
        .wait_until("the turn reaches the brain", |r| !r.requests.is_empty())
        .await;
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");
    sim.hang_up().await;
    stack.finished(&sid).await
}

#[tokio::test]
async fn openai_realtime_transcription_is_the_turn() {
    let fake = realtime_fake().await;
    let stack = Stack::start(Opts {
        stt: "rt".into(),
        extra_sections: realtime_section(&fake),
        ..Default::default()
    })
    .await;
    let rec = one_turn(&stack).await;
    assert_eq!(first_user_message(&stack).as_deref(), Some(WORDS));
    assert!(rec.events_of("stt_connected").count() >= 1);

    let r = fake
        .wait_until("the closed session", |r| {
            r.connections.first().is_some_and(|c| c.closed.is_some())
        })
        .await;
    let c = &r.connections[0];
    // GA interface: bearer key, no beta header, intent in the URL and no model there.
    assert!(
        c.headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == &format!("Bearer {RT_KEY}")),
        "{:?}",
        c.headers
    );
    assert!(!c.headers.iter().any(|(k, _)| k == "openai-beta"));
    assert_eq!(
        c.query,
        [("intent".to_string(), "transcription".to_string())]
    );
    // One session.update of the documented shape: μ-law passed through, the model and
    // language in the transcription object, the server's VAD.
    assert_eq!(c.session_updates.len(), 1);
    let input = &c.session_updates[0]["audio"]["input"];
    assert_eq!(c.session_updates[0]["type"], "transcription");
    assert_eq!(input["format"]["type"], "audio/pcmu");
    assert_eq!(input["transcription"]["model"], "gpt-4o-transcribe");
    assert_eq!(input["transcription"]["language"], "en");
    assert_eq!(input["turn_detection"]["type"], "server_vad");
    assert!(c.errors().is_empty(), "{:?}", c.errors());
    assert_eq!(
        c.appends_before_update, 0,
        "audio waits for session.updated"
    );
    // The caller's audio went up as is: 8 bytes a millisecond, at least the speech.
    assert!(c.audio_bytes >= 600 * 8, "{} bytes", c.audio_bytes);
    assert_eq!(
        c.events("conversation.item.input_audio_transcription.completed")
            .len(),
        1
    );
    assert_eq!(c.closed.as_ref().map(|x| (x.0, x.2)), Some((1000, true)));
}

#[tokio::test]
async fn primary_stt_refusing_the_handshake_hands_the_call_to_the_backup() {
    let aai = FakeAssemblyAi::start_with(FakeAssemblyAiConfig {
        failure: Some(AssemblyAiFailure::RefuseHandshake(503)),
        ..Default::default()
    })
    .await
    .expect("fake assemblyai");
    let stack = Stack::start(Opts {
        stt: r#"["aai", "deepgram"]"#.into(),
        extra_sections: format!(
            "[stt.aai]\nkind = \"assemblyai\"\nbase_url = \"{}\"\napi_key = \"aai-test-key\"\n",
            aai.base_url()
        ),
        transcripts: vec![WORDS.into()],
        ..Default::default()
    })
    .await;
    let rec = one_turn(&stack).await;
    // The backup (the fake Deepgram) heard the caller.
    assert_eq!(first_user_message(&stack).as_deref(), Some(WORDS));
    assert_eq!(aai.record().rejected.len(), 1, "the primary was tried once");
    let switches: Vec<_> = rec
        .events_of("stt_switched")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(switches.len(), 1, "{switches:?}");
    assert!(
        switches[0].starts_with("open_failed: aai -> deepgram: ") && switches[0].contains("503"),
        "{switches:?}"
    );
    let m = &stack.server.app.metrics;
    assert_eq!(
        m.stt_switches.get((
            Provider::from(SttKind::Assemblyai),
            SttSwitchReason::OpenFailed
        )),
        1
    );
    let mut page = String::new();
    m.render(&mut page);
    assert!(
        page.lines()
            .any(|l| l
                == "patterd_stt_switches_total{provider=\"assemblyai\",reason=\"open_failed\"} 1"),
        "{page}"
    );

    // The next call does not try the primary while it cools down, and reports no switch.
    let rec = one_turn(&stack).await;
    assert_eq!(rec.events_of("stt_switched").count(), 0);
    assert_eq!(aai.record().rejected.len(), 1);
}

#[tokio::test]
async fn primary_stt_with_nothing_listening_hands_the_call_to_openai_realtime() {
    // A port that was just free: connecting is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let fake = realtime_fake().await;
    let stack = Stack::start(Opts {
        stt: r#"["down", "rt"]"#.into(),
        extra_sections: format!(
            "[stt.down]\nkind = \"deepgram\"\nbase_url = \"ws://{closed}\"\napi_key = \"k\"\n\n{}",
            realtime_section(&fake)
        ),
        ..Default::default()
    })
    .await;
    let rec = one_turn(&stack).await;
    assert_eq!(first_user_message(&stack).as_deref(), Some(WORDS));
    let switches: Vec<_> = rec
        .events_of("stt_switched")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(switches.len(), 1, "{switches:?}");
    assert!(
        switches[0].starts_with("open_failed: down -> rt: ")
            && switches[0].contains("could not reach Deepgram"),
        "{switches:?}"
    );
    assert_eq!(
        stack.server.app.metrics.stt_switches.get((
            Provider::from(SttKind::Deepgram),
            SttSwitchReason::OpenFailed
        )),
        1
    );
}

#[tokio::test]
async fn a_primary_dropping_mid_call_is_reopened_on_the_backup() {
    let aai = FakeAssemblyAi::start_with(FakeAssemblyAiConfig {
        failure: Some(AssemblyAiFailure::ErrorAfterAudioBytes(1600)),
        ..Default::default()
    })
    .await
    .expect("fake assemblyai");
    let stack = Stack::start(Opts {
        stt: r#"["aai", "deepgram"]"#.into(),
        extra_sections: format!(
            "[stt.aai]\nkind = \"assemblyai\"\nbase_url = \"{}\"\napi_key = \"aai-test-key\"\n",
            aai.base_url()
        ),
        transcripts: vec![WORDS.into()],
        ..Default::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("For four, sure."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    // AssemblyAI fails after 200 ms of audio (Error 3005, close 3005).
    speak(&sim, 300);
    aai.wait_until("the primary's failure", |r| {
        r.connections.first().is_some_and(|c| c.closed.is_some())
    })
    .await;
    speak(&sim, 600);
    let h = stack
        .hermes
        .wait_until("the turn reaches the brain", |r| !r.requests.is_empty())
        .await;
    let users: Vec<_> = h
        .requests
        .iter()
        .filter_map(|q| {
            q.messages()
                .into_iter()
                .rev()
                .find(|(r, _)| r == "user")
                .map(|(_, t)| t)
        })
        .collect();
    assert!(users.iter().any(|u| u == WORDS), "{users:?}");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let switches: Vec<_> = rec
        .events_of("stt_switched")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(switches.len(), 1, "{switches:?}");
    assert!(
        switches[0].starts_with("dropped: aai -> deepgram: ") && switches[0].contains("3005"),
        "{switches:?}"
    );
    assert_eq!(rec.events_of("stt_reopen").count(), 1);
    assert_eq!(aai.record().connections.len(), 1, "the reopen skipped it");
    assert_eq!(
        stack.server.app.metrics.stt_switches.get((
            Provider::from(SttKind::Assemblyai),
            SttSwitchReason::Dropped
        )),
        1
    );
}
