//! The browser phone in headless Chromium with a fake microphone: the page is served by the
//! stack, its microphone plays a WAV (a 600 ms tone — speech to the fake STT — then 2.4 s of
//! silence, looped by Chromium), the fake brain answers with long replies, and the page must
//! play them (its own played-sample counter), show the transcript, and when the looped tone
//! comes back over the agent's reply, receive the carrier clear and flush its playback queue.
//! The stored call is a `web` call with the interrupted turn heard only in part.
//!
//! Mouth-to-ear latency (last voiced microphone frame → first played agent sample, browser
//! clock) is printed: `cargo test --test calls web:: -- --nocapture`. With
//! `PATTERD_SCREENSHOT=FILE.png` the test also saves a screenshot of the page mid-call.

use std::time::Duration;

use patterd::security::link::unix_now;
use patterd_sim::hermes::HermesReply;

use crate::common::browser::Browser;
use crate::common::{Opts, Stack};

const LIMIT: Duration = Duration::from_secs(40);

/// A mono 16-bit PCM WAV at `rate`.
fn wav(samples: &[i16], rate: u32) -> Vec<u8> {
    let data_len = (samples.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// Real speech (espeak-ng's "move it", 1.4 s, `tests/fixtures/speech/`), then silence to 3 s,
/// at 8 kHz: the fake microphone's loop. Speech, not a tone: the detector treats a steady tone
/// as background after a moment, which made the barge-in depend on the machine's load.
fn caller_clip() -> Vec<u8> {
    let ulaw = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/speech/move_it.ulaw"
    ))
    .expect("the speech fixture");
    let mut s = patterd::audio::g711::decode_ulaw(&ulaw);
    s.resize(8_000 * 3, 0);
    wav(&s, 8_000)
}

/// A reply of several sentences, about 3.3 s of fake speech (longer than the 3 s loop).
const LONG_REPLY: &str = "Thanks for trying the browser phone. This reply is long on purpose. \
    It keeps going so that you can interrupt it. When you speak over it, the page drops what \
    it has queued. Then the agent listens again. It is longer than the microphone's loop, so \
    the caller's next words always land on it. And that is the whole test of barge in.";

#[tokio::test]
async fn the_page_talks_plays_and_is_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clip = dir.path().join("caller.wav");
    std::fs::write(&clip, caller_clip()).expect("write the clip");
    let capture = format!("--use-file-for-fake-audio-capture={}", clip.display());
    let Some(browser) = Browser::start(&[
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        &capture,
        "--autoplay-policy=no-user-gesture-required",
    ])
    .await
    else {
        return;
    };
    let stack = Stack::start(Opts::default()).await;
    for _ in 0..6 {
        stack.hermes.push(HermesReply::text(LONG_REPLY));
    }
    let links = stack.server.app.phone_links().expect("link key");
    let (link, claims) = links.mint("front-desk", unix_now() + 120);
    // aec=0: Chromium's echo canceller would treat the fake microphone's tone as an echo of
    // the fake voice's tone; a real microphone keeps it on.
    let url = format!("{}/phone?link={link}&aec=0", stack.base);
    browser.client.goto(&url).await.expect("open the page");
    browser
        .eval("document.getElementById('call').click(); return true;")
        .await;
    browser
        .wait_for(
            "return window.patterd.connected === true",
            LIMIT,
            "the socket",
        )
        .await;
    browser
        .wait_for(
            "return [...document.querySelectorAll('#transcript li.caller')]\
             .some(li => li.textContent.includes('hello there'))",
            LIMIT,
            "the caller's words in the transcript",
        )
        .await;
    browser
        .wait_for(
            "return window.patterd.samplesPlayed > 8000 && window.patterd.replyLatencyMs.length > 0",
            LIMIT,
            "a second of the agent played",
        )
        .await;
    browser
        .wait_for(
            "return window.patterd.clears >= 1 && window.patterd.samplesFlushed > 0",
            LIMIT,
            "a barge-in clear flushing the page's queue",
        )
        .await;
    browser
        .wait_for(
            "return [...document.querySelectorAll('#transcript li.agent')]\
             .some(li => li.textContent.includes('(interrupted)'))",
            LIMIT,
            "the interrupted reply in the transcript",
        )
        .await;
    if let Ok(path) = std::env::var("PATTERD_SCREENSHOT") {
        let png = browser.client.screenshot().await.expect("screenshot");
        std::fs::write(&path, png).expect("write the screenshot");
    }
    let stats = browser.eval("return window.patterd").await;
    eprintln!(
        "browser phone: mouth-to-ear {} ms, reply latency (server) {} ms, played {} samples, \
         flushed {} samples on {} clear(s)",
        stats["mouthToEarMs"],
        stats["replyLatencyMs"],
        stats["samplesPlayed"],
        stats["samplesFlushed"],
        stats["clears"]
    );
    assert!(
        stats["samplesReceived"].as_u64() >= stats["samplesPlayed"].as_u64(),
        "played more than received: {stats}"
    );
    // The page is sent what is new and keeps a bounded list; a link shows no tool internals.
    let kept = stats["events"].as_array().map_or(0, Vec::len) as u64;
    assert!(
        stats["eventsSeen"]
            .as_u64()
            .is_some_and(|n| n >= kept && kept > 0)
            && kept <= 500,
        "{stats}"
    );

    // Hang up from the page; the stored call is a `web` call with the interruption.
    browser
        .eval("document.getElementById('call').click(); return true;")
        .await;
    let rec = stack.finished(&claims.call_id).await;
    browser.close().await;
    assert_eq!(rec.carrier, "web");
    assert!(
        rec.transcript
            .iter()
            .any(|e| e.speaker == patterd::call::Speaker::Caller && e.text == "hello there"),
        "{:?}",
        rec.transcript
    );
    let cut = rec
        .transcript
        .iter()
        .find(|e| e.speaker == patterd::call::Speaker::Agent && e.interrupted)
        .expect("an interrupted agent turn");
    assert!(
        cut.heard_text.len() < cut.text.len() && cut.text.starts_with(&cut.heard_text),
        "heard only what played: {cut:?}"
    );
    assert!(rec.events_of(patterd::call::EventKind::BargeInStop).count() >= 1);
}
