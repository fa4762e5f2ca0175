//! The OpenAI-style speech client (`provider::openai_speech`, kinds `openai` and
//! `openai_compatible`) against `FakeOpenAiSpeech` in its three dialects: the exact request
//! (path, bearer key, body fields), PCM resampled to μ-law 8 kHz of the right length with the
//! fake's 9 kHz tone not folded back into the telephone band, errors mapped (401 refused, 500
//! and 429 `Unavailable` for a chain to switch on), cancellation by dropping the stream.

use std::time::Duration;

use patterd::audio::g711::decode_ulaw;
use patterd::config::schema::{Secret, TtsConfig};
use patterd::provider::openai_speech::OpenAiSpeech;
use patterd::provider::{TtsEvent, TtsProvider};
use patterd_sim::openai_speech::{Dialect, FakeOpenAiSpeech, FakeOpenAiSpeechConfig};
use tokio::sync::mpsc;

async fn drain(rx: &mut mpsc::Receiver<TtsEvent>) -> Vec<TtsEvent> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(t)) => seen.push(t),
            Ok(None) => return seen,
            Err(_) => panic!("timed out; so far: {seen:?}"),
        }
    }
}

fn cfg(kind: &str, base: &str, key: &str, extra: &str) -> TtsConfig {
    let mut c: TtsConfig =
        toml::from_str(&format!("kind = \"{kind}\"\n{extra}")).expect("tts config");
    c.fill_kind_defaults();
    c.base_url = base.into();
    c.api_key = Secret::new(key);
    c
}

fn audio(evs: &[TtsEvent]) -> Vec<u8> {
    evs.iter()
        .flat_map(|e| match e {
            TtsEvent::Audio(b) => b.to_vec(),
            _ => Vec::new(),
        })
        .collect()
}

/// Amplitude of `freq` in 8 kHz PCM (quadrature correlation).
fn amplitude_at(x: &[i16], freq: f64) -> f64 {
    let (mut re, mut im) = (0.0f64, 0.0f64);
    for (i, &s) in x.iter().enumerate() {
        let ph = 2.0 * std::f64::consts::PI * freq * i as f64 / 8000.0;
        re += f64::from(s) * ph.cos();
        im += f64::from(s) * ph.sin();
    }
    2.0 * (re * re + im * im).sqrt() / x.len() as f64
}

#[tokio::test]
async fn openai_speech_asks_for_pcm_and_resamples_to_mulaw_8k() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig::default())
        .await
        .expect("fake");
    let c = cfg(
        "openai",
        &fake.base_url(),
        "sk-test-key",
        "instructions = \"Speak warmly.\"\nspeed = 1.25",
    );
    let tts = OpenAiSpeech::new(&c).expect("tts");
    let text = "Hello there, how can I help you today?";
    let evs = drain(&mut tts.synthesize(text).events).await;
    assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
    let ulaw = audio(&evs);
    // 10 ms a character at 8 kHz: the exact length the 24 kHz PCM stands for.
    let want = text.chars().count() * 10 * 8;
    assert!(
        ulaw.len().abs_diff(want) <= 1,
        "{} bytes, want {want}",
        ulaw.len()
    );
    let pcm = decode_ulaw(&ulaw);
    let body = &pcm[400..pcm.len() - 400];
    let tone = amplitude_at(body, 440.0);
    assert!(tone > 0.2 * 32767.0, "440 Hz at {tone}");
    // The fake's 9 kHz tone would alias to 1 kHz after a careless 3:1 decimation.
    let alias = amplitude_at(body, 1000.0);
    assert!(
        alias < tone / 100.0,
        "alias at 1 kHz: {alias} vs tone {tone}"
    );

    let r = &fake.record().requests[0];
    assert_eq!(r.status, 200);
    assert!(
        r.headers
            .contains(&("authorization".into(), "Bearer sk-test-key".into()))
    );
    assert_eq!(r.body["model"], "gpt-4o-mini-tts");
    assert_eq!(r.body["voice"], "alloy");
    assert_eq!(r.body["input"], text);
    assert_eq!(r.body["response_format"], "pcm");
    assert_eq!(r.body["instructions"], "Speak warmly.");
    assert_eq!(r.body["speed"], 1.25);
    assert!(r.body.get("sample_rate").is_none());
}

#[tokio::test]
async fn openai_speech_errors_are_mapped_for_the_chain() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig::default())
        .await
        .expect("fake");
    let bad_key = OpenAiSpeech::new(&cfg("openai", &fake.base_url(), "sk-wrong", "")).expect("tts");
    let evs = drain(&mut bad_key.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("401") && e.contains("Incorrect API key") && e.contains("api_key")),
        "{evs:?}"
    );
    // tts-1 with instructions: refused as OpenAI refuses it, not worth another TTS.
    let tts1 = OpenAiSpeech::new(&cfg(
        "openai",
        &fake.base_url(),
        "sk-test-key",
        "model = \"tts-1\"\ninstructions = \"x\"",
    ))
    .expect("tts");
    let evs = drain(&mut tts1.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("400")),
        "{evs:?}"
    );

    let good = OpenAiSpeech::new(&cfg("openai", &fake.base_url(), "sk-test-key", "")).expect("tts");
    for status in [500u16, 429] {
        fake.configure(|c| c.fail_status = Some(status));
        let evs = drain(&mut good.synthesize("Hi there").events).await;
        assert!(
            matches!(&evs[..], [TtsEvent::Unavailable(e)] if e.contains(&status.to_string())),
            "{status}: {evs:?}"
        );
    }
    // Nobody listening: a connect error, also switchable.
    drop(fake);
    let evs = drain(&mut good.synthesize("Hi there").events).await;
    assert!(matches!(&evs[..], [TtsEvent::Unavailable(_)]), "{evs:?}");
}

#[tokio::test]
async fn kokoro_and_speaches_dialects_go_through_the_same_path() {
    let kokoro = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig {
        dialect: Dialect::Kokoro,
        api_key: None,
        ..Default::default()
    })
    .await
    .expect("fake");
    let tts =
        OpenAiSpeech::new(&cfg("openai_compatible", &kokoro.base_url(), "", "")).expect("tts");
    let evs = drain(&mut tts.synthesize("Hello from Kokoro.").events).await;
    assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
    // 18 characters at 10 ms each, but at least the fake's 200 ms.
    assert!(audio(&evs).len().abs_diff(1600) <= 1);
    let r = &kokoro.record().requests[0];
    assert_eq!(r.body["model"], "kokoro");
    assert_eq!(r.body["voice"], "af_heart");
    assert!(!r.headers.iter().any(|(k, _)| k == "authorization"));

    let speaches = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig {
        dialect: Dialect::Speaches,
        api_key: Some("local".into()),
        ..Default::default()
    })
    .await
    .expect("fake");
    let c = cfg(
        "openai_compatible",
        &speaches.base_url(),
        "local",
        "model = \"speaches-ai/Kokoro-82M-v1.0-ONNX\"\nsample_rate = 16000",
    );
    let tts = OpenAiSpeech::new(&c).expect("tts");
    let evs = drain(&mut tts.synthesize("Hello from speaches.").events).await;
    assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
    assert!(audio(&evs).len().abs_diff(1600) <= 1);
    let r = &speaches.record().requests[0];
    assert_eq!(r.body["sample_rate"], 16000);
    assert_eq!(r.rate, 16000);

    // A rate the resampler does not know is refused at start-up, not per sentence.
    let bad = cfg(
        "openai_compatible",
        &speaches.base_url(),
        "",
        "sample_rate = 11025",
    );
    let e = OpenAiSpeech::new(&bad).err().expect("refused");
    assert!(e.to_string().contains("supported rates"), "{e}");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let fake = FakeOpenAiSpeech::start(FakeOpenAiSpeechConfig {
        chunk_interval: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .expect("fake");
    let tts = OpenAiSpeech::new(&cfg("openai", &fake.base_url(), "sk-test-key", "")).expect("tts");
    let mut s = tts.synthesize(&"A long sentence to speak. ".repeat(20));
    assert!(matches!(s.events.recv().await, Some(TtsEvent::Audio(_))));
    drop(s);
    let rec = fake
        .wait_until("the request is cancelled", |r| {
            r.requests.first().is_some_and(|q| q.cancelled)
        })
        .await;
    assert!(!rec.requests[0].completed);
}
