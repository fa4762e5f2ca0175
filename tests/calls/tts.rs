//! Whole calls (Twilio) through the other text-to-speech providers and through TTS fallback
//! chains: OpenAI speech (24 kHz PCM resampled to μ-law 8 kHz) and a self-hosted Kokoro
//! server speak the greeting and the reply; a chain `["elevenlabs", "openai"]` gives a sentence
//! whose ElevenLabs request stalls past `tts_first_byte_timeout_ms`, or answers 500, to OpenAI,
//! records `tts_fallback` and counts it; every sentence's `tts_first_byte` is on the timeline.
//! ElevenLabs with `transport = "websocket"` speaks a whole call over one socket and a barge-in
//! plays nothing more of the cut reply; the HTTP transport still speaks a whole call.

use patterd_sim::openai_speech::{Dialect, FakeOpenAiSpeech, FakeOpenAiSpeechConfig};

use crate::common::*;
use patterd_sim::hermes::HermesReply;

const OPENAI_KEY: &str = "sk-test-key";

fn openai_section(name: &str, kind: &str, base: &str) -> String {
    format!("[tts.{name}]\nkind = \"{kind}\"\napi_key = \"{OPENAI_KEY}\"\nbase_url = \"{base}\"\n")
}

/// A greeting and one answered turn spoken by the agent's `tts`; returns the call record.
async fn greeting_and_reply(stack: &Stack) -> patterd::call::CallRecord {
    stack
        .hermes
        .push(HermesReply::text("Sure. Your order ships today."));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("reply marks", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    let st = sim.state();
    assert!(st.agent_audio_bytes > 0);
    // Every utterance is loud (the 440 Hz tone), not silence or noise.
    assert!(
        st.utterances.iter().all(|u| u.mean_energy > 2000),
        "{:?}",
        st.utterances
    );
    sim.hang_up().await;
    stack.finished(&call_sid).await
}

/// `(provider, µs)` of each `tts_first_byte` event.
fn first_bytes(rec: &patterd::call::CallRecord) -> Vec<(String, u64)> {
    rec.events_of("tts_first_byte")
        .map(|e| {
            let (p, us) = e.detail.split_once(' ').expect("provider and µs");
            (p.to_string(), us.parse().expect("µs"))
        })
        .collect()
}

#[tokio::test]
async fn openai_speech_speaks_a_whole_call() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig::default())
        .await
        .expect("fake");
    let stack = Stack::start(Opts {
        tts: "\"openai\"".into(),
        extra_sections: openai_section("openai", "openai", &fake.base_url()),
        ..Default::default()
    })
    .await;
    let rec = greeting_and_reply(&stack).await;
    let texts = fake.record().texts();
    assert_eq!(texts[0], GREETING);
    assert!(texts.iter().any(|t| t.contains("ships today")), "{texts:?}");
    assert!(stack.spoken().is_empty(), "ElevenLabs was not asked");
    let fb = first_bytes(&rec);
    assert!(
        fb.len() >= 3 && fb.iter().all(|(p, _)| p == "openai"),
        "{fb:?}"
    );
    eprintln!("openai tts_first_byte µs (zero-latency fake): {fb:?}");
}

#[tokio::test]
async fn kokoro_speaks_a_whole_call_without_a_key() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig {
        dialect: Dialect::Kokoro,
        api_key: None,
        ..Default::default()
    })
    .await
    .expect("fake");
    let stack = Stack::start(Opts {
        tts: "\"kokoro\"".into(),
        extra_sections: format!(
            "[tts.kokoro]\nkind = \"openai_compatible\"\nbase_url = \"{}\"\n",
            fake.base_url()
        ),
        ..Default::default()
    })
    .await;
    let rec = greeting_and_reply(&stack).await;
    assert!(
        fake.record()
            .requests
            .iter()
            .all(|r| r.body["model"] == "kokoro")
    );
    let fb = first_bytes(&rec);
    eprintln!("kokoro tts_first_byte µs (zero-latency fake): {fb:?}");
    assert!(fb.iter().all(|(p, _)| p == "kokoro"), "{fb:?}");
}

async fn chain_stack(fake: &FakeOpenAiSpeech, extra: &str) -> Stack {
    Stack::start(Opts {
        tts: "[\"elevenlabs\", \"openai\"]".into(),
        extra_sections: openai_section("openai", "openai", &fake.base_url()),
        agent_extra: format!("tts_first_byte_timeout_ms = 300\n{extra}"),
        ..Default::default()
    })
    .await
}

/// The primary fails on the reply's first sentence as `configure` makes it: the backup speaks
/// that very sentence, the switch is an event and a count.
async fn backup_speaks_the_failed_sentence(
    configure: impl FnOnce(&mut patterd_sim::elevenlabs::FakeElevenLabsConfig),
    why: &str,
) {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig::default())
        .await
        .expect("fake");
    let stack = chain_stack(&fake, "").await;
    stack.el.configure(configure);
    let rec = greeting_and_reply(&stack).await;
    // ElevenLabs spoke the greeting; the failed sentence went to OpenAI.
    assert_eq!(stack.spoken()[0], GREETING);
    let backup = fake.record().texts();
    assert!(backup.iter().any(|t| t.contains("Sure")), "{backup:?}");
    let switches: Vec<_> = rec.events_of("tts_fallback").collect();
    assert!(!switches.is_empty(), "{:?}", rec.events);
    assert!(
        switches[0].detail.starts_with("elevenlabs -> openai: ")
            && switches[0].detail.contains(why),
        "{switches:?}"
    );
    assert!(
        rec.events_of("tts_error").next().is_none(),
        "no sentence lost"
    );
    assert!(
        patterd::app::Metrics::get(&stack.server.app.providers().tts_fallbacks) >= 1,
        "counted"
    );
    let fb = first_bytes(&rec);
    eprintln!(
        "chain tts_first_byte µs (zero-latency fakes; the switched one includes the failure): {fb:?}"
    );
    assert_eq!(fb[0].0, "elevenlabs");
    assert!(fb.iter().any(|(p, _)| p == "openai"), "{fb:?}");
}

#[tokio::test]
async fn tts_stalled_past_the_deadline_the_next_tts_speaks_that_sentence() {
    backup_speaks_the_failed_sentence(
        |c| c.stall_text_containing = Some("Sure".into()),
        "no audio within 300 ms",
    )
    .await;
}

#[tokio::test]
async fn primary_tts_500_the_backup_speaks() {
    backup_speaks_the_failed_sentence(|c| c.fail_text_containing = Some("Sure".into()), "500")
        .await;
}

/// After its cool-down the primary is asked again: with `tts_cooldown_s = 0` the sentence after
/// the switched one goes back to ElevenLabs.
#[tokio::test]
async fn after_the_cool_down_the_primary_is_retried() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig::default())
        .await
        .expect("fake");
    let stack = chain_stack(&fake, "tts_cooldown_s = 0").await;
    stack
        .el
        .configure(|c| c.fail_text_containing = Some("Sure".into()));
    greeting_and_reply(&stack).await;
    let el = stack.spoken();
    assert!(el.iter().any(|t| t.contains("ships today")), "{el:?}");
    assert!(!fake.record().texts().iter().any(|t| t.contains("ships")));
}

#[tokio::test]
async fn cartesia_speaks_a_whole_call() {
    use patterd_sim::cartesia::{FakeCartesia, FakeCartesiaConfig};
    let fake = FakeCartesia::start(FakeCartesiaConfig::default())
        .await
        .expect("fake");
    let stack = Stack::start(Opts {
        tts: "\"cartesia\"".into(),
        extra_sections: format!(
            "[tts.cartesia]\nkind = \"cartesia\"\napi_key = \"cartesia-test-key\"\nbase_url = \"{}\"\n",
            fake.base_url()
        ),
        ..Default::default()
    })
    .await;
    let rec = greeting_and_reply(&stack).await;
    let texts = fake.record().texts();
    assert_eq!(texts[0], GREETING);
    assert!(texts.iter().any(|t| t.contains("ships today")), "{texts:?}");
    let fb = first_bytes(&rec);
    eprintln!("cartesia tts_first_byte µs (zero-latency fake): {fb:?}");
    assert!(fb.iter().all(|(p, _)| p == "cartesia"), "{fb:?}");
}

fn elevenlabs_ws_section(fake: &patterd_sim::elevenlabs::FakeElevenLabs) -> String {
    format!(
        "[tts.elws]\nkind = \"elevenlabs\"\ntransport = \"websocket\"\napi_key = \"{EL_KEY}\"\nvoice_id = \"voice123\"\nbase_url = \"{}\"\n",
        fake.base_url()
    )
}

async fn elevenlabs_ws_stack(
    transcripts: &[&str],
) -> (patterd_sim::elevenlabs::FakeElevenLabs, Stack) {
    let fake = patterd_sim::elevenlabs::FakeElevenLabs::start(EL_KEY)
        .await
        .expect("fake");
    let stack = Stack::start(Opts {
        tts: "\"elws\"".into(),
        transcripts: transcripts.iter().map(|t| t.to_string()).collect(),
        extra_sections: elevenlabs_ws_section(&fake),
        ..Default::default()
    })
    .await;
    (fake, stack)
}

#[tokio::test]
async fn elevenlabs_websocket_speaks_a_whole_call_over_one_socket() {
    let (fake, stack) = elevenlabs_ws_stack(&[]).await;
    let rec = greeting_and_reply(&stack).await;
    let el = fake.record();
    assert_eq!(el.ws_sockets.len(), 1, "one socket for the whole call");
    assert!(el.requests.is_empty(), "no HTTP synthesis");
    let texts: Vec<&str> = el.ws_contexts.iter().map(|c| c.text.trim()).collect();
    assert_eq!(texts[0], GREETING);
    assert!(texts.len() >= 3, "greeting and two sentences: {texts:?}");
    assert!(texts.iter().any(|t| t.contains("ships today")), "{texts:?}");
    assert!(el.ws_errors.is_empty(), "{:?}", el.ws_errors);
    // The hang-up dropped the call's session: it said goodbye with close_socket.
    fake.wait_until("close_socket", |r| r.ws_close_socket == 1)
        .await;
    let fb = first_bytes(&rec);
    eprintln!("elevenlabs websocket tts_first_byte µs (zero-latency fake): {fb:?}");
    assert!(fb.iter().all(|(p, _)| p == "elws"), "{fb:?}");
}

#[tokio::test]
async fn elevenlabs_http_still_speaks_a_whole_call() {
    let stack = Stack::start(Opts::default()).await;
    let rec = greeting_and_reply(&stack).await;
    let el = stack.el.record();
    assert!(el.ws_sockets.is_empty());
    assert!(el.requests.len() >= 3, "{:?}", el.texts());
    let fb = first_bytes(&rec);
    eprintln!("elevenlabs http tts_first_byte µs (zero-latency fake): {fb:?}");
    assert!(fb.iter().all(|(p, _)| p == "elevenlabs"), "{fb:?}");
}

#[tokio::test]
async fn elevenlabs_websocket_barge_in_plays_nothing_more_of_the_cut_sentence() {
    let (fake, stack) = elevenlabs_ws_stack(&["tell me everything", "stop please"]).await;
    let long = "This is the first of many sentences. ".repeat(12);
    stack.hermes.push(HermesReply::text(long.trim()));
    stack.hermes.push(HermesReply::text("Okay."));
    let (call_id, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    sim.wait_for("reply playing", WAIT, |s| {
        s.utterances.len() >= 2 && s.playback_queued_bytes > 1600
    })
    .await
    .expect("reply playing");
    speak(&sim, 600);
    let s = sim
        .wait_for("the clear", WAIT, |s| !s.clears.is_empty())
        .await
        .expect("clear");
    let clear_at = s.clears[0];
    stack
        .hermes
        .wait_until("second turn", |r| r.requests.len() == 2)
        .await;
    let acked = s.marks_echoed.len();
    let s = sim
        .wait_for("next reply acknowledged", WAIT, |s| {
            s.marks_echoed.len() > acked
        })
        .await
        .expect("next reply");
    // After the clear, the only agent audio is the new reply's.
    let after: u64 = s
        .utterances
        .iter()
        .filter(|u| u.start_ms >= clear_at)
        .map(|u| u.bytes)
        .sum();
    assert_eq!(
        after as usize,
        fake.expected_bytes("Okay."),
        "{:?}",
        s.utterances
    );
    let el = fake.record();
    assert_eq!(el.ws_sockets.len(), 1, "the same socket after the barge-in");
    assert!(el.ws_errors.is_empty(), "{:?}", el.ws_errors);
    // Every context was closed (none left open towards the 5-context limit).
    assert!(
        el.ws_contexts.iter().all(|c| c.closed),
        "{:?}",
        el.ws_contexts
    );
    sim.hang_up().await;
    stack.finished(&call_id).await;
}
