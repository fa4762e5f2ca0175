//! The guards and the decoder pool without the model: scripted decoders stand in for
//! whisper.cpp. The model's own tests are `tests/calls/whisper.rs` and, for the figures,
//! [`model`] (feature `whisper`, ignored).

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::provider::SttInput;

// ---------------------------------------------------------------- guards

#[test]
fn a_phrase_looping_is_cut_back_to_its_first_occurrence() {
    assert_eq!(
        truncate_loop("Ten of clubs, ten of clubs, ten of clubs, ten of"),
        "Ten of clubs"
    );
    assert_eq!(
        truncate_loop("I want to book a table. A table. A table. A table. A table."),
        "I want to book a table."
    );
    // One word looping.
    assert_eq!(truncate_loop("Okay okay okay okay okay okay okay"), "Okay");
    // Case and punctuation do not hide a loop.
    assert_eq!(
        truncate_loop("Thank you. THANK YOU! thank you, thank you"),
        "Thank you."
    );
}

#[test]
fn speech_that_repeats_a_little_is_kept() {
    for text in [
        "No, no, no.",
        "Bye bye bye.",
        "five five",
        "My number is five five five, one two one two.",
        "Yes. Yes, please.",
        "That's that.",
        "",
    ] {
        assert_eq!(truncate_loop(text), text);
    }
}

#[test]
fn annotations_are_not_words() {
    assert_eq!(strip_annotations("[BLANK_AUDIO]"), "");
    assert_eq!(
        strip_annotations(" (coughing) Hello there."),
        "Hello there."
    );
    assert_eq!(strip_annotations("♪ la la ♪"), "la la");
    assert_eq!(strip_annotations("*music* [Music] (wind)"), "");
    assert_eq!(
        strip_annotations("Go forward ten meters."),
        "Go forward ten meters."
    );
    // An unclosed bracket swallows the rest: whisper's annotations are short.
    assert_eq!(strip_annotations("Yes [inaudible"), "Yes");
}

#[test]
fn what_whisper_calls_no_speech_is_dropped() {
    let raw = |text: &str, no_speech: f32| Raw {
        text: text.into(),
        no_speech,
    };
    assert_eq!(
        clean(&raw(" Go forward ten meters.", 0.02)),
        "Go forward ten meters."
    );
    // Silence and noise: whatever the decoder said, the model itself heard no speech.
    assert_eq!(clean(&raw(" Thank you.", 0.93)), "");
    assert_eq!(clean(&raw(" [BLANK_AUDIO]", 0.1)), "");
    assert_eq!(clean(&raw(" ...", 0.1)), "");
    assert_eq!(clean(&raw(" (cough)", 0.3)), "");
    assert_eq!(
        clean(&raw(
            " Hello, hello, hello, hello, hello, hello, hello, hello.",
            0.1
        )),
        "Hello"
    );
}

#[test]
fn the_token_budget_follows_the_audio() {
    assert_eq!(token_cap(0), 10);
    assert_eq!(token_cap(1_000), 18);
    assert_eq!(token_cap(2_500), 30);
    // Never more than the decoder's window.
    assert_eq!(token_cap(60_000), 224);
    assert!(token_cap(2_000) > token_cap(1_000));
}

#[test]
fn phone_audio_reaches_the_decoder_at_16k() {
    // 100 ms of a 1 kHz tone, μ-law 8 kHz.
    let ulaw = crate::audio::g711::ulaw_tone(1000.0, 100, 8000);
    let pcm = to_16k(&ulaw);
    assert_eq!(pcm.len(), 1600);
    let peak = pcm.iter().fold(0f32, |m, s| m.max(s.abs()));
    assert!(peak > 0.15 && peak < 0.35, "peak {peak}");
}

// ---------------------------------------------------------------- the pool

/// A decoder that answers from a script, after the test lets it (one message per decode).
struct Scripted {
    text: String,
    no_speech: f32,
    go: Option<std_mpsc::Receiver<()>>,
    seen: std_mpsc::Sender<(usize, u32)>,
}

impl Decode for Scripted {
    fn decode(&mut self, pcm: &[f32], max_tokens: u32) -> Result<Raw, String> {
        let _ = self.seen.send((pcm.len(), max_tokens));
        if let Some(go) = &self.go {
            go.recv().map_err(|_| "stopped".to_string())?;
        }
        Ok(Raw {
            text: self.text.clone(),
            no_speech: self.no_speech,
        })
    }
}

struct Fake {
    pool: Arc<Pool>,
    seen: std_mpsc::Receiver<(usize, u32)>,
    go: Vec<std_mpsc::Sender<()>>,
}

/// A pool of `threads` scripted decoders saying `text`; `gated`: each decode waits for a
/// message on its thread's `go`.
fn fake(threads: usize, queue: usize, text: &str, no_speech: f32, gated: bool) -> Fake {
    let (seen_tx, seen) = std_mpsc::channel();
    let mut go = Vec::new();
    let decoders: Vec<Box<dyn Decode>> = (0..threads)
        .map(|_| {
            let rx = gated.then(|| {
                let (tx, rx) = std_mpsc::channel();
                go.push(tx);
                rx
            });
            Box::new(Scripted {
                text: text.into(),
                no_speech,
                go: rx,
                seen: seen_tx.clone(),
            }) as Box<dyn Decode>
        })
        .collect();
    Fake {
        pool: Arc::new(Pool::start(decoders, queue)),
        seen,
        go,
    }
}

fn provider(pool: &Arc<Pool>) -> WhisperStt {
    WhisperStt {
        pool: pool.clone(),
        endpointing_ms: 300,
    }
}

fn speech() -> Vec<u8> {
    let p = format!(
        "{}/tests/fixtures/speech/book_table.ulaw",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Speaks `clip` then a second of silence into the session, in 20 ms frames.
async fn say(s: &SttStream, clip: &[u8]) {
    let silence = vec![0xFF; 8000];
    for frame in clip.chunks(160).chain(silence.chunks(160)) {
        s.input
            .send(SttInput::Audio(Bytes::copy_from_slice(frame)))
            .await
            .expect("session input");
    }
}

async fn next_event(s: &mut SttStream) -> SttEvent {
    tokio::time::timeout(Duration::from_secs(20), s.events.recv())
        .await
        .expect("an event within 20 s")
        .expect("the session is open")
}

/// The next event that is not `Connected`.
async fn next_news(s: &mut SttStream) -> SttEvent {
    loop {
        match next_event(s).await {
            SttEvent::Connected => continue,
            e => return e,
        }
    }
}

fn ctx(fallback: bool) -> SttContext {
    SttContext {
        call_id: "CA-test".into(),
        fallback,
    }
}

#[tokio::test]
async fn an_utterance_is_decoded_at_16k_with_a_budget_and_becomes_a_final() {
    let f = fake(1, 2, " I would like to book a table for four.", 0.05, false);
    let mut s = provider(&f.pool).open(&ctx(false));
    let clip = speech();
    say(&s, &clip).await;
    match next_news(&mut s).await {
        SttEvent::Final {
            text,
            speech_final,
            from_finalize,
        } => {
            assert_eq!(text, "I would like to book a table for four.");
            assert!(speech_final && !from_finalize);
        }
        e => panic!("{e:?}"),
    }
    let (samples, budget) = f.seen.try_recv().expect("one decode");
    // The utterance (clip plus pre-roll and the cutting silence) at twice the phone rate.
    let clip_16k = clip.len() * 2;
    assert!(
        samples >= clip_16k * 9 / 10 && samples <= clip_16k + 16 * 800,
        "{samples} samples for a clip of {clip_16k}"
    );
    assert_eq!(budget, token_cap(samples as u64 / 16));
}

#[tokio::test]
async fn silence_is_never_decoded_and_no_speech_gives_an_empty_final() {
    let f = fake(1, 2, " Thank you.", 0.95, false);
    let mut s = provider(&f.pool).open(&ctx(false));
    // Three seconds of line silence: nothing is cut, nothing decoded; the flush answers empty.
    for frame in vec![0xFFu8; 24_000].chunks(160) {
        s.input
            .send(SttInput::Audio(Bytes::copy_from_slice(frame)))
            .await
            .expect("input");
    }
    s.input.send(SttInput::Finalize).await.expect("finalize");
    match next_news(&mut s).await {
        SttEvent::Final { text, .. } => assert_eq!(text, ""),
        e => panic!("{e:?}"),
    }
    assert!(f.seen.try_recv().is_err(), "silence reached the decoder");
    // Speech the model says was no speech: decoded, its text dropped.
    say(&s, &speech()).await;
    match next_news(&mut s).await {
        SttEvent::Final { text, .. } => assert_eq!(text, ""),
        e => panic!("{e:?}"),
    }
    assert!(f.seen.try_recv().is_ok());
}

#[tokio::test]
async fn a_sentence_cut_at_a_pause_is_one_final_however_slow_the_decodes() {
    let f = fake(1, 4, " Half.", 0.0, true);
    let mut s = provider(&f.pool).open(&ctx(false));
    assert_eq!(next_event(&mut s).await, SttEvent::Connected);
    // Two utterances (the cutter ends one at the pause), both cut before the first decode
    // ends: the session has read every frame.
    let clip = speech();
    say(&s, &clip).await;
    say(&s, &clip).await;
    while s.input.capacity() < s.input.max_capacity() {
        tokio::task::yield_now().await;
    }
    // The first decode has started (its thread reports it without the runtime).
    while f.seen.try_recv().is_err() {
        tokio::task::yield_now().await;
    }
    for go in &f.go {
        go.send(()).expect("go");
        go.send(()).expect("go");
    }
    // One final with both halves: an early one with the first half would let the call's
    // max_endpointing_ms end the turn while the second half is still being decoded.
    match next_event(&mut s).await {
        SttEvent::Final {
            text,
            speech_final,
            from_finalize,
        } => {
            assert_eq!(text, "Half. Half.");
            assert!(speech_final && !from_finalize);
        }
        e => panic!("{e:?}"),
    }
    assert!(f.seen.try_recv().is_ok(), "the second half was decoded");
}

/// Fills a one-thread pool with a queue of one: a decode running, one waiting.
async fn saturate(f: &Fake) -> (SttStream, SttStream) {
    let clip = speech();
    let a = provider(&f.pool).open(&ctx(false));
    say(&a, &clip).await;
    // The decoder has it (and waits for `go`).
    tokio::task::spawn_blocking({
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let pool = f.pool.clone();
        move || {
            while pool.busy.load(Ordering::Acquire) < 1 {
                assert!(std::time::Instant::now() < deadline, "no decode started");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    })
    .await
    .expect("wait");
    let b = provider(&f.pool).open(&ctx(false));
    say(&b, &clip).await;
    let pool = f.pool.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !pool.full() {
            assert!(
                std::time::Instant::now() < deadline,
                "the queue did not fill"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .await
    .expect("wait");
    (a, b)
}

#[tokio::test]
async fn a_full_pool_alone_says_so_and_the_turn_still_ends() {
    let f = fake(1, 1, " Hello.", 0.0, true);
    let (_a, _b) = saturate(&f).await;
    // A third call's utterance finds the decoder busy and one waiting.
    let mut c = provider(&f.pool).open(&ctx(false));
    say(&c, &speech()).await;
    match next_news(&mut c).await {
        SttEvent::Error { message, fatal } => {
            assert!(!fatal, "alone, the session carries on");
            assert!(
                message.contains("all 1 whisper decoders are busy")
                    && message.contains("raise [stt] threads or queue"),
                "{message}"
            );
        }
        e => panic!("{e:?}"),
    }
    match next_news(&mut c).await {
        SttEvent::Final {
            text, speech_final, ..
        } => assert!(text.is_empty() && speech_final),
        e => panic!("{e:?}"),
    }
    // Once the decoder is free again, the same session is served.
    for go in &f.go {
        let _ = go.send(());
        let _ = go.send(());
        let _ = go.send(());
    }
    say(&c, &speech()).await;
    match next_news(&mut c).await {
        SttEvent::Final { text, .. } => assert_eq!(text, "Hello."),
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn a_full_pool_in_a_chain_fails_fast_so_the_next_stt_takes_over() {
    let f = fake(1, 1, " Hello.", 0.0, true);
    let (_a, _b) = saturate(&f).await;
    // Opening while full: refused before it opens (the chain's `OpenFailed`).
    let mut c = provider(&f.pool).open(&ctx(true));
    match next_event(&mut c).await {
        SttEvent::Error { message, fatal } => {
            assert!(fatal);
            assert!(
                message.contains("the next STT of the chain takes over"),
                "{message}"
            );
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(next_event(&mut c).await, SttEvent::Closed);
}

#[tokio::test]
async fn a_full_pool_mid_call_in_a_chain_ends_the_session() {
    let f = fake(1, 1, " Hello.", 0.0, true);
    // Opened while there was room.
    let mut c = provider(&f.pool).open(&ctx(true));
    assert_eq!(next_event(&mut c).await, SttEvent::Connected);
    let (_a, _b) = saturate(&f).await;
    say(&c, &speech()).await;
    match next_event(&mut c).await {
        SttEvent::Error { fatal, .. } => assert!(fatal, "the chain must see a fatal error"),
        e => panic!("{e:?}"),
    }
    assert_eq!(next_event(&mut c).await, SttEvent::Closed);
}

#[tokio::test]
async fn a_chain_moves_to_its_next_stt_when_the_pool_is_full() {
    use crate::provider::fallback::{Chain, Member};
    let f = fake(1, 1, " Hello.", 0.0, true);
    let (_a, _b) = saturate(&f).await;
    let next = Arc::new(crate::provider::memory::ScriptedStt::new(&["hello"], 300));
    let members: Vec<Member<dyn SttProvider>> = vec![
        Member {
            name: "local".into(),
            provider: Arc::new(provider(&f.pool)),
            health: Default::default(),
        },
        Member {
            name: "cloud".into(),
            provider: next.clone(),
            health: Default::default(),
        },
    ];
    let chain = Chain::new(
        members,
        Duration::from_secs(30),
        Duration::from_secs(5),
        Default::default(),
    );
    let mut s = chain.open(&ctx(false));
    match next_event(&mut s).await {
        SttEvent::Switched {
            from, to, message, ..
        } => {
            assert_eq!((from.as_str(), to.as_str()), ("local", "cloud"));
            assert!(message.contains("whisper decoders are busy"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(next_event(&mut s).await, SttEvent::Connected);
}

#[test]
fn tables_with_the_same_model_share_one_pool() {
    fn open(key: &PoolKey) -> Result<Vec<Box<dyn Decode>>, SetupError> {
        let (seen, _) = std_mpsc::channel();
        Ok((0..key.threads)
            .map(|_| {
                Box::new(Scripted {
                    text: String::new(),
                    no_speech: 0.0,
                    go: None,
                    seen: seen.clone(),
                }) as Box<dyn Decode>
            })
            .collect())
    }
    let key = |threads| PoolKey {
        model: "/models/shared-test.bin".into(),
        language: "en".into(),
        threads,
        queue: 2,
    };
    let a = Pool::shared(key(2), open).expect("pool");
    let b = Pool::shared(key(2), open).expect("pool");
    assert!(Arc::ptr_eq(&a, &b), "a reload reuses the loaded model");
    let c = Pool::shared(key(3), open).expect("pool");
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(c.threads, 3);
    let weak = Arc::downgrade(&a);
    drop((a, b));
    assert!(weak.upgrade().is_none(), "the last user frees it");
}

#[cfg(not(feature = "whisper"))]
#[test]
fn without_the_feature_the_build_says_how_to_get_it() {
    let cfg: SttConfig =
        toml::from_str("kind = \"whisper\"\nmodel_path = \"/m.bin\"").expect("config");
    let e = <WhisperStt as crate::provider::kinds::SttKindImpl>::build(&cfg)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("--features whisper"), "{e}");
}

#[cfg(feature = "whisper")]
#[test]
fn a_missing_or_foreign_model_file_says_what_to_run() {
    let key = |model: &str| PoolKey {
        model: model.into(),
        language: "en".into(),
        threads: 1,
        queue: 1,
    };
    let e = engine::open(&key("/nonexistent/ggml-tiny.en.bin"))
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("run scripts/setup/whisper.sh"),
        "{e}"
    );
    let foreign = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let e = engine::open(&key(foreign)).err().expect("refused");
    assert!(
        e.to_string().contains("is not a whisper.cpp (ggml) model"),
        "{e}"
    );
}

#[cfg(feature = "whisper")]
mod model;
