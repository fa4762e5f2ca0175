//! Word timings from the TTS clients against their fakes: ElevenLabs HTTP
//! `…/stream/with-timestamps`, the ElevenLabs multi-context WebSocket and Cartesia
//! `add_timestamps` all yield `TtsEvent::Words` matching the words the fake aligned over the
//! audio it sent; `word_timestamps = false` asks for plain audio and yields none; a broken
//! `with-timestamps` line fails the sentence with a clear error.

use std::time::Duration;

use patterd::config::schema::{Secret, TtsConfig, TtsTransport};
use patterd::provider::cartesia::CartesiaTts;
use patterd::provider::elevenlabs::ElevenLabsTts;
use patterd::provider::{TtsEvent, TtsProvider, WordTiming};
use patterd_sim::alignment::word_times;
use patterd_sim::cartesia::{FakeCartesia, FakeCartesiaConfig};
use patterd_sim::elevenlabs::FakeElevenLabs;

const TEXT: &str = "We can seat groups of up to twelve people.";

fn cfg(kind: &str, base: &str, key: &str) -> TtsConfig {
    let mut c: TtsConfig = toml::from_str(&format!("kind = \"{kind}\"")).expect("tts config");
    c.fill_kind_defaults();
    c.base_url = base.into();
    c.api_key = Secret::new(key);
    c
}

/// All events of one synthesis: the audio bytes and the word timings, in order.
async fn synth(tts: &dyn TtsProvider, text: &str) -> (usize, Vec<WordTiming>, Vec<TtsEvent>) {
    let mut s = tts.synthesize(text);
    let mut bytes = 0;
    let mut words = Vec::new();
    let mut rest = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.events.recv()).await {
            Ok(Some(TtsEvent::Audio(a))) => bytes += a.len(),
            Ok(Some(TtsEvent::Words(w))) => words.extend(w),
            Ok(Some(ev)) => rest.push(ev),
            Ok(None) => return (bytes, words, rest),
            Err(_) => panic!("timed out"),
        }
    }
}

/// The fake's words for `text` over `ms` of audio, as the client should rebuild them.
fn expected(text: &str, ms: u32) -> Vec<WordTiming> {
    word_times(text, ms)
        .into_iter()
        .map(|w| WordTiming {
            word: w.text,
            start_ms: w.start_ms,
            end_ms: w.end_ms,
        })
        .collect()
}

#[tokio::test]
async fn elevenlabs_http_with_timestamps_gives_the_words_of_the_audio() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let tts = ElevenLabsTts::new(&cfg("elevenlabs", &fake.base_url(), "el")).expect("tts");
    let (bytes, words, rest) = synth(&tts, TEXT).await;
    assert_eq!(rest, vec![TtsEvent::Done]);
    assert_eq!(bytes, fake.expected_bytes(TEXT));
    assert_eq!(words, expected(TEXT, (bytes / 8) as u32));
    let r = &fake.record().requests[0];
    assert!(r.with_timestamps, "asked on …/stream/with-timestamps");
    assert!(
        r.headers
            .iter()
            .any(|(k, v)| k == "accept" && v == "application/json"),
        "{:?}",
        r.headers
    );
}

#[tokio::test]
async fn without_word_timestamps_elevenlabs_sends_plain_audio() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let mut c = cfg("elevenlabs", &fake.base_url(), "el");
    c.word_timestamps = false;
    let tts = ElevenLabsTts::new(&c).expect("tts");
    let (bytes, words, rest) = synth(&tts, TEXT).await;
    assert_eq!(rest, vec![TtsEvent::Done]);
    assert_eq!(bytes, fake.expected_bytes(TEXT));
    assert!(words.is_empty());
    assert!(!fake.record().requests[0].with_timestamps);
}

#[tokio::test]
async fn elevenlabs_websocket_alignment_is_placed_by_the_audio_before_it() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let mut c = cfg("elevenlabs", &fake.base_url(), "el");
    c.transport = TtsTransport::Websocket;
    let tts = ElevenLabsTts::new(&c).expect("tts");
    let call = tts.for_call().expect("a per-call session");
    let (bytes, words, rest) = synth(call.as_ref(), TEXT).await;
    assert_eq!(rest, vec![TtsEvent::Done]);
    // The session sends the text with one trailing space, which the fake aligns too.
    assert_eq!(words, expected(&format!("{TEXT} "), (bytes / 8) as u32));
    assert_eq!(words.len(), TEXT.split_whitespace().count());
}

#[tokio::test]
async fn cartesia_add_timestamps_gives_the_words_of_the_audio() {
    let fake = FakeCartesia::start(FakeCartesiaConfig::default())
        .await
        .expect("fake");
    let tts = CartesiaTts::new(&cfg("cartesia", &fake.base_url(), "cartesia-test-key"));
    let (bytes, words, rest) = synth(&tts, TEXT).await;
    assert_eq!(rest, vec![TtsEvent::Done]);
    assert_eq!(words, expected(TEXT, (bytes / 8) as u32));
    assert_eq!(
        fake.record().contexts[0].request["add_timestamps"],
        serde_json::json!(true)
    );
    // Not asked: no timestamps frames.
    let mut c = cfg("cartesia", &fake.base_url(), "cartesia-test-key");
    c.word_timestamps = false;
    let (_, words, _) = synth(&CartesiaTts::new(&c), TEXT).await;
    assert!(words.is_empty());
    assert!(
        fake.record().contexts[1]
            .request
            .get("add_timestamps")
            .is_none()
    );
}

/// A server answering `with-timestamps` with `lines` as a JSON-lines body.
async fn lines_server(body: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut buf = [0u8; 4096];
        let _ = sock.read(&mut buf).await;
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = sock.write_all(resp.as_bytes()).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_with_timestamps_line_that_is_not_json_fails_the_sentence() {
    let base = lines_server("{\"audio_base64\":\"//8=\",\"alignment\":null}\nnot json\n").await;
    let tts = ElevenLabsTts::new(&cfg("elevenlabs", &base, "el")).expect("tts");
    let (bytes, _, rest) = synth(&tts, TEXT).await;
    assert_eq!(bytes, 2, "the good line's audio went out");
    match rest.as_slice() {
        [TtsEvent::Error(e)] => assert!(e.contains("not JSON"), "{e}"),
        other => panic!("expected one error, got {other:?}"),
    }
}
