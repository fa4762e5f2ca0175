//! Whole calls (Twilio) through the other speech-to-text kinds, each against its own strict
//! fake: `openai_compatible` (per-utterance WAV upload to `FakeTranscriptions`, the caller's
//! real speech cut by our voice-activity detector).

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::call::Speaker;
use patterd_sim::hermes::HermesReply;
use patterd_sim::transcribe::{FakeTranscriptions, FakeTranscriptionsConfig};

const WHISPER_KEY: &str = "whisper-test-key";
const BOOKING: &str = "I would like to book a table for four.";

/// A stack whose agent listens through `[stt.whisper]` (kind `openai_compatible`) on `fake`.
async fn whisper_stack(fake: &FakeTranscriptions, api_key: &str) -> Stack {
    Stack::start(Opts {
        stt: "whisper".into(),
        extra_sections: format!(
            r#"[stt.whisper]
kind = "openai_compatible"
base_url = "{}"
api_key = "{api_key}"
model = "Systran/faster-whisper-small"
"#,
            fake.base_url()
        ),
        ..Default::default()
    })
    .await
}

async fn whisper_fake(api_key: &str) -> FakeTranscriptions {
    FakeTranscriptions::start_with(FakeTranscriptionsConfig {
        api_key: api_key.into(),
        transcripts: [BOOKING.to_string()].into(),
        ..Default::default()
    })
    .await
    .expect("fake transcriptions")
}

#[tokio::test]
async fn openai_compatible_stt_uploads_the_utterance_and_its_text_is_the_turn() {
    let fake = whisper_fake(WHISPER_KEY).await;
    let stack = whisper_stack(&fake, WHISPER_KEY).await;
    stack.hermes.push(HermesReply::text("Sure, for four."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    let speech = clip("book_table");
    sim.push_audio(&speech);
    let h = stack
        .hermes
        .wait_until("the turn reaches the brain", |r| !r.requests.is_empty())
        .await;
    let user = h.requests[0]
        .messages()
        .into_iter()
        .rev()
        .find(|(role, _)| role == "user")
        .expect("user message");
    assert_eq!(user.1, BOOKING);
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");

    // One upload, as OpenAI documents it: a WAV file (16-bit PCM, 8 kHz, mono) holding the
    // whole utterance, with the bearer key, the model, the language and JSON answers.
    let rec = fake.record();
    assert_eq!(rec.ok(), 1, "{rec:#?}");
    let r = &rec.requests[0];
    assert_eq!(r.field("model"), Some("Systran/faster-whisper-small"));
    assert_eq!(r.field("language"), Some("en"));
    assert_eq!(r.field("response_format"), Some("json"));
    assert_eq!(r.filename.as_deref(), Some("utterance.wav"));
    assert!(
        r.headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == &format!("Bearer {WHISPER_KEY}")),
        "{:?}",
        r.headers
    );
    let wav = r.wav.expect("wav");
    assert_eq!(
        (wav.format, wav.channels, wav.sample_rate, wav.bits),
        (1, 1, 8000, 16)
    );
    let clip_ms = speech.len() as u64 / 8;
    assert!(
        wav.audio_ms() + 300 >= clip_ms && wav.audio_ms() <= clip_ms + 1200,
        "uploaded {} ms for a {clip_ms} ms clip",
        wav.audio_ms()
    );
    // The file is the caller's audio itself: its loudest stretch is speech, not silence.
    let peak = r
        .samples
        .iter()
        .map(|s| s.unsigned_abs())
        .max()
        .unwrap_or(0);
    assert!(peak > 3000, "peak {peak}");

    sim.hang_up().await;
    let record = stack.finished(&sid).await;
    let caller: Vec<_> = record
        .transcript
        .iter()
        .filter(|e| e.speaker == Speaker::Caller)
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(caller, [BOOKING]);
}

#[tokio::test]
async fn openai_compatible_stt_wrong_key_is_a_clear_error_on_the_call() {
    let fake = whisper_fake(WHISPER_KEY).await;
    let stack = whisper_stack(&fake, "not-the-key").await;
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    sim.push_audio(&clip("book_table"));
    fake.wait_until("the refused upload", |r| {
        r.requests.iter().any(|q| q.status == 401)
    })
    .await;
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let errors: Vec<_> = rec
        .events_of("stt_error")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        errors.iter().any(|d| d.contains("HTTP 401")
            && d.contains("check [stt] api_key")
            && d.contains("Incorrect API key")),
        "{errors:?}"
    );
    assert!(
        stack.hermes.record().requests.is_empty(),
        "no turn without a transcript"
    );
}

// ---------------------------------------------------------------- Deepgram Flux

use patterd_sim::flux::{FakeFlux, FakeFluxConfig};

async fn flux_stack(flux: &FakeFlux, eager: bool) -> Stack {
    let eager_line = if eager {
        "eager_eot_threshold = 0.4\n"
    } else {
        ""
    };
    Stack::start(Opts {
        stt: "flux".into(),
        // A stateless brain: only those are asked speculatively.
        llm: "compat".into(),
        extra_sections: format!(
            "[stt.flux]\nkind = \"deepgram_flux\"\nbase_url = \"{}\"\napi_key = \"{DG_KEY}\"\n\
             eot_threshold = 0.7\n{eager_line}",
            flux.base_url()
        ),
        ..Default::default()
    })
    .await
}

#[tokio::test]
async fn flux_turn_resumed_after_eager_end_of_turn_never_plays_the_speculation() {
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: DG_KEY.into(),
        bursts: vec!["I need a table".into(), "for four".into()],
        eager_ms: 200,
        eot_ms: 1500,
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let stack = flux_stack(&flux, true).await;
    stack.hermes.push(HermesReply::text("SPECULATIVE answer."));
    stack.hermes.push(HermesReply::text("For four, sure."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    flux.wait_until("the eager end of turn", |r| {
        r.connections
            .last()
            .is_some_and(|c| !c.events("EagerEndOfTurn").is_empty())
    })
    .await;
    stack
        .hermes
        .wait_until("the speculative request", |r| !r.requests.is_empty())
        .await;
    // The caller goes on before the turn ends.
    speak(&sim, 500);
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;

    let c = flux.record().connections[0].clone();
    assert_eq!(c.events("TurnResumed").len(), 1, "{:#?}", c.sent);
    assert_eq!(
        c.events("EndOfTurn")[0].1["transcript"],
        "I need a table for four"
    );
    let h = stack.hermes.record();
    assert_eq!(
        h.requests.len(),
        2,
        "the cancelled speculation, then the answer"
    );
    let last_user = |i: usize| {
        h.requests[i]
            .messages()
            .into_iter()
            .rev()
            .find(|(r, _)| r == "user")
            .map(|(_, t)| t)
    };
    assert_eq!(last_user(0).as_deref(), Some("I need a table"));
    assert_eq!(last_user(1).as_deref(), Some("I need a table for four"));
    let spoken = stack.spoken();
    assert!(spoken.iter().any(|t| t.contains("For four")), "{spoken:?}");
    assert!(
        !spoken.iter().any(|t| t.contains("SPECULATIVE")),
        "{spoken:?}"
    );
    let details = |k: &str| {
        rec.events_of(k)
            .map(|e| e.detail.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(details("speculation_cancelled"), ["turn_resumed"]);
    assert_eq!(details("speculation_used").len(), 1);
    assert_eq!(details("turn_end"), ["end_of_turn"]);
}

/// Flux ends its turn at the caller's pause after "I want to": our rules veto that end (the
/// head cannot end there), the rest comes as Flux's next turn, and the brain gets one turn.
#[tokio::test]
async fn flux_end_of_turn_on_an_unfinished_head_is_joined_with_the_rest() {
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: DG_KEY.into(),
        bursts: vec!["I want to".into(), "cancel the premium plan".into()],
        eot_ms: 500,
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let stack = flux_stack(&flux, false).await;
    stack
        .hermes
        .push(HermesReply::text("Done, it is cancelled."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 500);
    sim.push_silence(900);
    speak(&sim, 700);
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let c = flux.record().connections[0].clone();
    assert_eq!(c.events("EndOfTurn").len(), 2, "{:#?}", c.sent);
    assert_eq!(c.force_end_turns, 0);
    let h = stack.hermes.record();
    assert_eq!(h.requests.len(), 1, "one turn");
    let last_user = h.requests[0]
        .messages()
        .into_iter()
        .rev()
        .find(|(r, _)| r == "user")
        .map(|(_, t)| t);
    assert_eq!(
        last_user.as_deref(),
        Some("I want to cancel the premium plan")
    );
    let held: Vec<_> = rec
        .events_of("turn_held")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(held, ["end_of_turn unfinished"]);
}

/// The hold after a vetoed end runs out while the caller is still talking: patterd sends
/// Flux `ForceEndTurn`, and Flux's `EndOfTurn` on what it has is the rest of the turn.
#[tokio::test]
async fn flux_is_asked_to_end_its_turn_when_the_hold_runs_out_mid_speech() {
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: DG_KEY.into(),
        bursts: vec!["I need to".into(), "move my appointment".into()],
        // The speech after the forced end opens a turn of its own, with no words.
        default_words: String::new(),
        eot_ms: 500,
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let stack = Stack::start(Opts {
        stt: "flux".into(),
        llm: "compat".into(),
        agent_extra: "unfinished_hold_ms = 800".into(),
        extra_sections: format!(
            "[stt.flux]\nkind = \"deepgram_flux\"\nbase_url = \"{}\"\napi_key = \"{DG_KEY}\"\n",
            flux.base_url()
        ),
        ..Default::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Sure, to when?"));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 500);
    sim.push_silence(600);
    // Still talking 800 ms after Flux's end of "I need to".
    speak(&sim, 2500);
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let c = flux.record().connections[0].clone();
    assert_eq!(c.force_end_turns, 1, "{:#?}", c.received);
    assert!(
        c.received.iter().any(|t| t.contains("ForceEndTurn")),
        "{:?}",
        c.received
    );
    let h = stack.hermes.record();
    assert_eq!(h.requests.len(), 1, "one turn");
    let last_user = h.requests[0]
        .messages()
        .into_iter()
        .rev()
        .find(|(r, _)| r == "user")
        .map(|(_, t)| t);
    assert_eq!(last_user.as_deref(), Some("I need to move my appointment"));
    let sent: Vec<_> = rec
        .events_of("finalize_sent")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(sent, ["end_of_turn"]);
}

#[tokio::test]
async fn flux_refused_and_failing_streams_are_clear_errors() {
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: "another-key".into(),
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let stack = flux_stack(&flux, false).await;
    let (sid, sim) = stack.call().await;
    flux.wait_until("two refused handshakes (open and the one reopen)", |r| {
        r.rejected.len() >= 2
    })
    .await;
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let errors: Vec<_> = rec
        .events_of("stt_error")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        errors.iter().any(|d| d.contains("Deepgram Flux")
            && d.contains("HTTP 401")
            && d.contains("api_key")),
        "{errors:?}"
    );
}

#[tokio::test]
async fn flux_error_message_and_close_code_are_reported() {
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: DG_KEY.into(),
        failure: Some(patterd_sim::flux::FluxFailure::ErrorAfterAudioBytes(1600)),
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let stack = flux_stack(&flux, false).await;
    let (sid, sim) = stack.call().await;
    flux.wait_until("the failed stream", |r| {
        r.connections.first().is_some_and(|c| c.closed.is_some())
    })
    .await;
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let errors: Vec<_> = rec
        .events_of("stt_error")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        errors
            .iter()
            .any(|d| d.contains("INTERNAL_SERVER_ERROR: the fake failed on purpose")),
        "{errors:?}"
    );
}

/// Caller speech end → first reply audio at the caller, over `turns` calls: Deepgram v1 with
/// our endpointer, against Flux with eager end of turn. Both fakes answer with zero
/// processing time; the brain takes `BRAIN_MS` before its first words. Prints the figures of
/// docs/providers.md: `cargo test --test calls -- --ignored --nocapture flux_vs_v1_figures`.
#[tokio::test]
#[ignore = "figures, not a check: run by hand"]
async fn flux_vs_v1_figures() {
    const BRAIN_MS: u64 = 300;
    const TURNS: usize = 5;
    async fn one(stack: &Stack) -> u64 {
        stack.hermes.push(HermesReply::text_paced(
            "Sure.",
            std::time::Duration::from_millis(BRAIN_MS),
        ));
        let (_sid, sim) = stack.call().await;
        sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .expect("greeting");
        speak(&sim, 800);
        let s = sim
            .wait_for("reply audio", WAIT, |s| s.utterances.len() >= 2)
            .await
            .expect("reply");
        sim.hang_up().await;
        let spoke_until = s.last_speech_frame_ms.expect("caller speech");
        s.utterances[1].start_ms.saturating_sub(spoke_until)
    }
    let v1 = Stack::start(Opts::default()).await;
    let mut v1_ms = Vec::new();
    for _ in 0..TURNS {
        v1_ms.push(one(&v1).await);
    }
    let flux = FakeFlux::start_with(FakeFluxConfig {
        api_key: DG_KEY.into(),
        eager_ms: 200,
        eot_ms: 400,
        ..Default::default()
    })
    .await
    .expect("fake flux");
    let fx = flux_stack(&flux, true).await;
    let mut fx_ms = Vec::new();
    for _ in 0..TURNS {
        fx_ms.push(one(&fx).await);
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    println!(
        "speech end → first reply audio, median of {TURNS}: deepgram v1 + endpointer {} ms {v1_ms:?}; \
         flux eager {} ms {fx_ms:?}",
        median(&mut v1_ms),
        median(&mut fx_ms)
    );
}

// ---------------------------------------------------------------- brain fallback

#[tokio::test]
async fn brain_500_the_backup_answers_the_same_turn() {
    let stack = Stack::start(Opts {
        llm: r#"["hermes", "compat"]"#.into(),
        ..Default::default()
    })
    .await;
    // Both brains are the same fake: Hermes (model hermes-agent) gets the 500, the backup
    // (model compat-model) the reply.
    stack
        .hermes
        .push(HermesReply::http(500, "upstream model crashed"));
    stack.hermes.push(HermesReply::text("The backup answers."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    sim.wait_for("the backup's reply heard", WAIT, |s| {
        s.marks_echoed.len() >= 2
    })
    .await
    .expect("reply plays");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let h = stack.hermes.record();
    assert_eq!(h.requests.len(), 2, "the failed primary, then the backup");
    let spoken = stack.spoken();
    assert!(
        spoken.iter().any(|t| t == "The backup answers."),
        "{spoken:?}"
    );
    assert!(
        !spoken.iter().any(|t| t == LLM_ERROR),
        "no apology: {spoken:?}"
    );
    let switches: Vec<_> = rec
        .events_of("provider_switch")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(switches.len(), 1, "{switches:?}");
    assert!(
        switches[0].starts_with("llm hermes -> compat: HTTP 500"),
        "{switches:?}"
    );
    assert_eq!(rec.events_of("llm_request").count(), 1, "one caller turn");
    assert_eq!(
        stack
            .server
            .app
            .providers()
            .llm_switches
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

// ---------------------------------------------------------------- AssemblyAI

use patterd_sim::assemblyai::{FakeAssemblyAi, FakeAssemblyAiConfig};

const AAI_KEY: &str = "aai-test-key";

async fn assemblyai_stack(fake: &FakeAssemblyAi, api_key: &str) -> Stack {
    Stack::start(Opts {
        stt: "aai".into(),
        extra_sections: format!(
            "[stt.aai]\nkind = \"assemblyai\"\nbase_url = \"{}\"\napi_key = \"{api_key}\"\n\
             eot_threshold = 0.7\n",
            fake.base_url()
        ),
        ..Default::default()
    })
    .await
}

#[tokio::test]
async fn assemblyai_end_of_turn_is_the_turn_and_the_session_terminates() {
    let fake = FakeAssemblyAi::start_with(FakeAssemblyAiConfig {
        api_key: AAI_KEY.into(),
        turns: vec!["i need a table for four".into()],
        ..Default::default()
    })
    .await
    .expect("fake assemblyai");
    let stack = assemblyai_stack(&fake, AAI_KEY).await;
    stack.hermes.push(HermesReply::text("For four, sure."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    let h = stack
        .hermes
        .wait_until("the turn reaches the brain", |r| !r.requests.is_empty())
        .await;
    let user = h.requests[0]
        .messages()
        .into_iter()
        .rev()
        .find(|(role, _)| role == "user")
        .map(|(_, t)| t);
    // format_turns is on (smart_format): the formatted end of turn is the one used.
    assert_eq!(user.as_deref(), Some("I need a table for four."));
    sim.wait_for("reply heard", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply plays");
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let r = fake
        .wait_until("the terminated session", |r| {
            r.connections.first().is_some_and(|c| c.closed.is_some())
        })
        .await;
    let c = &r.connections[0];
    let q = |k: &str| {
        c.query
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(q("encoding"), Some("pcm_mulaw"));
    assert_eq!(q("sample_rate"), Some("8000"));
    assert_eq!(q("format_turns"), Some("true"));
    assert_eq!(q("end_of_turn_confidence_threshold"), Some("0.7"));
    assert!(
        c.headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == AAI_KEY),
        "raw key, no scheme: {:?}",
        c.headers
    );
    // Every chunk within AssemblyAI's 50–1000 ms bounds (400–8000 μ-law bytes).
    assert!(
        c.chunks.iter().all(|n| (400..=8000).contains(n)),
        "{:?}",
        c.chunks
    );
    assert_eq!(c.terminates, 1);
    assert_eq!(c.closed.as_ref().map(|x| x.0), Some(1000));
    assert_eq!(c.ends_of_turn().len(), 2, "unformatted then formatted");
    let turn_ends: Vec<_> = rec
        .events_of("turn_end")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(turn_ends, ["end_of_turn"]);
}

#[tokio::test]
async fn assemblyai_bad_key_and_server_error_are_clear_errors() {
    let fake = FakeAssemblyAi::start_with(FakeAssemblyAiConfig {
        api_key: AAI_KEY.into(),
        ..Default::default()
    })
    .await
    .expect("fake assemblyai");
    let stack = assemblyai_stack(&fake, "not-the-key").await;
    let (sid, sim) = stack.call().await;
    fake.wait_until("two refused sessions (open and the one reopen)", |r| {
        r.connections
            .iter()
            .filter(|c| c.closed.as_ref().is_some_and(|x| x.0 == 4001))
            .count()
            >= 2
    })
    .await;
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let errors: Vec<_> = rec
        .events_of("stt_error")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        errors.iter().any(|d| d.contains("AssemblyAI")
            && d.contains("4001")
            && d.contains("check [stt] api_key")),
        "{errors:?}"
    );
    assert!(stack.hermes.record().requests.is_empty());

    // A server error mid-call: AssemblyAI's `Error` message names its code.
    let fake = FakeAssemblyAi::start_with(FakeAssemblyAiConfig {
        api_key: AAI_KEY.into(),
        failure: Some(patterd_sim::assemblyai::AssemblyAiFailure::ErrorAfterAudioBytes(1600)),
        ..Default::default()
    })
    .await
    .expect("fake assemblyai");
    let stack = assemblyai_stack(&fake, AAI_KEY).await;
    let (sid, sim) = stack.call().await;
    fake.wait_until("the failed stream", |r| {
        r.connections.first().is_some_and(|c| c.closed.is_some())
    })
    .await;
    sim.hang_up().await;
    let rec = stack.finished(&sid).await;
    let errors: Vec<_> = rec
        .events_of("stt_error")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        errors
            .iter()
            .any(|d| d.contains("3005: the fake failed on purpose")),
        "{errors:?}"
    );
}
