//! The Cartesia client (`provider::cartesia`) against `FakeCartesia`: the upgrade headers, the
//! generation request's exact fields, μ-law chunks passed through, the `error` frame and close
//! codes mapped (500 and 1011 `Unavailable` for a chain, 401 refused), and barge-in: dropping
//! the stream sends `cancel` for that context.

use std::time::Duration;

use patterd::config::schema::{Secret, TtsConfig};
use patterd::provider::cartesia::CartesiaTts;
use patterd::provider::{TtsEvent, TtsProvider};
use patterd_sim::cartesia::{FakeCartesia, FakeCartesiaConfig};
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

fn cfg(base: &str, key: &str) -> TtsConfig {
    let mut c: TtsConfig = toml::from_str("kind = \"cartesia\"").expect("tts config");
    c.fill_kind_defaults();
    c.base_url = base.into();
    c.api_key = Secret::new(key);
    c
}

#[tokio::test]
async fn cartesia_streams_mulaw_from_one_context() {
    let fake = FakeCartesia::start(FakeCartesiaConfig::default())
        .await
        .expect("fake");
    let mut c = cfg(&fake.base_url(), "cartesia-test-key");
    c.speed = Some(1.1);
    let tts = CartesiaTts::new(&c);
    let text = "Hello there, how can I help you today?";
    let evs = drain(&mut tts.synthesize(text).events).await;
    assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
    let bytes: usize = evs
        .iter()
        .map(|e| match e {
            TtsEvent::Audio(b) => b.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(bytes, text.chars().count() * 80);
    let rec = fake.record();
    let h = &rec.sockets[0];
    assert!(h.contains(&("x-api-key".into(), "cartesia-test-key".into())));
    assert!(h.contains(&("cartesia-version".into(), "2026-03-01".into())));
    let r = &rec.contexts[0].request;
    assert_eq!(r["model_id"], "sonic-3");
    assert_eq!(r["transcript"], text);
    assert_eq!(r["voice"]["mode"], "id");
    assert_eq!(r["voice"]["id"], "a0e99841-438c-4a64-b679-ae501e7d6091");
    assert_eq!(r["continue"], false);
    assert_eq!(r["max_buffer_delay_ms"], 0);
    assert_eq!(
        r["output_format"],
        serde_json::json!({"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000})
    );
    assert!((r["generation_config"]["speed"].as_f64().unwrap_or(0.0) - 1.1).abs() < 1e-6);
    assert!(rec.contexts[0].completed);
}

#[tokio::test]
async fn cartesia_errors_and_close_codes_are_mapped() {
    let fake = FakeCartesia::start(FakeCartesiaConfig::default())
        .await
        .expect("fake");
    let bad = CartesiaTts::new(&cfg(&fake.base_url(), "wrong"));
    let evs = drain(&mut bad.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("401") && e.contains("api_key")),
        "{evs:?}"
    );
    assert_eq!(fake.record().rejected[0].0, 401);

    let good = CartesiaTts::new(&cfg(&fake.base_url(), "cartesia-test-key"));
    fake.configure(|c| c.fail_status = Some(500));
    let evs = drain(&mut good.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Unavailable(e)] if e.contains("internal_error")),
        "{evs:?}"
    );
    fake.configure(|c| {
        c.fail_status = None;
        c.close_code = Some(1011);
    });
    let evs = drain(&mut good.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Unavailable(e)] if e.contains("1011")),
        "{evs:?}"
    );
    // An empty voice is refused by the service with a 400 error frame: not worth a switch.
    fake.configure(|c| c.close_code = None);
    let mut c = cfg(&fake.base_url(), "cartesia-test-key");
    c.voice_id = String::new();
    let evs = drain(&mut CartesiaTts::new(&c).synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("voice.id")),
        "{evs:?}"
    );
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_context() {
    let fake = FakeCartesia::start(FakeCartesiaConfig {
        chunk_interval: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .expect("fake");
    let tts = CartesiaTts::new(&cfg(&fake.base_url(), "cartesia-test-key"));
    let mut s = tts.synthesize(&"A long sentence to speak. ".repeat(20));
    assert!(matches!(s.events.recv().await, Some(TtsEvent::Audio(_))));
    drop(s);
    let rec = fake
        .wait_until("the context is cancelled", |r| {
            r.contexts.first().is_some_and(|c| c.cancelled)
        })
        .await;
    assert!(!rec.contexts[0].completed);
}
