//! Whole calls (Twilio) spoken by the text-to-speech engines that run on this machine: Piper
//! (cargo feature `piper`; the en_US-joe-medium voice, espeak-ng and onnxruntime from
//! scripts/setup/piper.sh, found through `PATTERD_PIPER_VOICE` / `PATTERD_ORT_LIBRARY` or
//! ~/.cache/patterd-models) and flite. The greeting and every reply sentence reach the caller
//! as speech — loud, and about as long as saying the sentence takes — and Piper's estimated
//! word timings make an interrupted reply keep the words the caller heard. Without the files or
//! programs these tests say so and skip, unless `PATTERD_REQUIRE_LOCAL_SPEECH=1`, which makes
//! them fail. `cargo test --features piper --test calls local_tts -- --nocapture` prints each
//! sentence's first-audio time.

use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::stream::Utterance;

/// `true` when `what` is there; otherwise says so (or fails under
/// `PATTERD_REQUIRE_LOCAL_SPEECH=1`).
fn present(what: &str, ok: bool) -> bool {
    if !ok {
        assert!(
            std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() != Ok("1"),
            "PATTERD_REQUIRE_LOCAL_SPEECH=1 but {what} is missing: run scripts/setup/piper.sh"
        );
        eprintln!("SKIPPED: {what} is missing (run scripts/setup/piper.sh); this test did not run");
    }
    ok
}

/// The reply: two sentences, the second with a clause the engine speaks as its own piece.
const REPLY: &str = "Sure. Your order ships today, and it should arrive on Friday morning.";

/// Checks that an utterance of `text` is speech: loud on average, and between 0.15 s and
/// 0.7 s per word (natural speech is about 0.3–0.4 s a word; the bounds catch silence, a
/// truncated piece or audio played at the wrong rate).
fn sounds_like(u: &Utterance, text: &str) {
    let words = text.split_whitespace().count() as f64;
    let secs = u.bytes as f64 / 8000.0;
    eprintln!(
        "{text:?}: {secs:.2} s ({:.2} s a word), mean |PCM| {}",
        secs / words,
        u.mean_energy
    );
    assert!(u.mean_energy > 800, "{text:?} is too quiet: {u:?}");
    assert!(
        secs >= 0.15 * words && secs <= 0.7 * words + 0.5,
        "{text:?} lasted {secs:.2} s for {words} words"
    );
}

/// A greeting and one answered turn spoken by `[tts.local]`: every utterance is speech of the
/// right length, every sentence's first audio is on the timeline from `provider`.
async fn speaks_a_whole_call(section: String, provider: &str) {
    let stack = Stack::start(Opts {
        tts: "\"local\"".into(),
        extra_sections: section,
        ..Default::default()
    })
    .await;
    stack.hermes.push(HermesReply::text(REPLY));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", LONG_WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("the greeting plays");
    speak(&sim, 600);
    sim.wait_for("reply marks", LONG_WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .expect("the reply plays");
    let st = sim.state();
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert!(st.protocol_errors.is_empty(), "{:?}", st.protocol_errors);
    let texts = [
        GREETING,
        "Sure.",
        "Your order ships today, and it should arrive on Friday morning.",
    ];
    assert!(st.utterances.len() >= 3, "{:?}", st.utterances);
    for (u, text) in st.utterances.iter().zip(texts) {
        sounds_like(u, text);
    }
    assert!(
        stack.spoken().is_empty(),
        "the fake ElevenLabs was not asked"
    );
    let first: Vec<_> = rec
        .events_of("tts_first_byte")
        .map(|e| e.detail.clone())
        .collect();
    assert!(
        first.len() >= 3 && first.iter().all(|d| d.starts_with(&format!("{provider} "))),
        "{first:?}"
    );
    assert!(
        rec.events_of("tts_error").next().is_none(),
        "{:?}",
        rec.events
    );
    eprintln!("{provider} tts_first_byte (provider µs) per sentence: {first:?}");
}

/// Longer than `WAIT`: a local engine on a shared machine takes its time.
const LONG_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

#[tokio::test]
async fn flite_speaks_a_whole_call() {
    if !present("flite", patterd::util::find_program("flite").is_some()) {
        return;
    }
    speaks_a_whole_call("[tts.local]\nkind = \"flite\"\n".into(), "local").await;
}

#[cfg(feature = "piper")]
mod piper {
    use super::*;
    use crate::conversation::{LONG, S1, S2, agent_reply, into_reply, opts, reply, says_tuesday};
    use patterd::config::schema::TtsConfig;
    use patterd::provider::{TtsEvent, TtsProvider};

    /// The keys of a `[tts.local]` table for the installed voice, or `None` (after saying
    /// why).
    fn keys() -> Option<String> {
        let espeak = patterd::util::find_program("espeak-ng").is_some();
        let probe: TtsConfig = toml::from_str("kind = \"piper\"").expect("config");
        let (voice, library) = (probe.piper_voice(), probe.onnxruntime_library());
        let ok = present("espeak-ng", espeak)
            && present(
                &format!("the Piper voice {}", voice.display()),
                voice.is_file(),
            )
            && present(
                &format!("onnxruntime {}", library.display()),
                library.is_file(),
            );
        ok.then(|| {
            format!(
                "kind = \"piper\"\nvoice_path = \"{}\"\nlibrary = \"{}\"\n",
                voice.display(),
                library.display()
            )
        })
    }

    fn section() -> Option<String> {
        keys().map(|k| format!("[tts.local]\n{k}"))
    }

    #[tokio::test]
    async fn piper_speaks_a_whole_call() {
        let Some(section) = section() else { return };
        speaks_a_whole_call(section, "local").await;
    }

    /// The words of `text` Piper's timings put before `ms` (a word counts once half of it has
    /// played), and the whole synthesis's length in ms.
    async fn words_before(text: &str, ms: u64) -> (usize, u64) {
        let mut cfg: TtsConfig = toml::from_str(&keys().expect("checked")).expect("config");
        cfg.fill_kind_defaults();
        let tts = patterd::provider::piper::PiperTts::new(&cfg).expect("voice");
        let mut s = tts.synthesize(text);
        let (mut bytes, mut words) = (0u64, Vec::new());
        while let Some(ev) = s.events.recv().await {
            match ev {
                TtsEvent::Audio(a) => bytes += a.len() as u64,
                TtsEvent::Words(w) => words.extend(w),
                TtsEvent::Done => break,
                other => panic!("{other:?}"),
            }
        }
        let heard = words
            .iter()
            .filter(|w| u64::from(w.start_ms + w.end_ms) / 2 <= ms)
            .count();
        (heard, bytes / 8)
    }

    /// The caller cuts the reply `into` its second sentence: the stored heard text is the
    /// first sentence and the words of the second Piper's timings put before the cut (±1, as
    /// the voice's durations vary from one synthesis to the next), at word precision.
    #[tokio::test]
    async fn piper_timings_keep_the_words_heard_of_a_cut_reply() {
        let Some(section) = section() else { return };
        let stack = Stack::start(Opts {
            tts: "\"local\"".into(),
            extra_sections: section,
            voice: None,
            ..opts(&crate::conversation::TUESDAY, "idle_nudge_after_s = 0")
        })
        .await;
        let (sid, sim) = into_reply(&stack).await;
        sim.wait_for("the second sentence playing", LONG, |s| {
            s.utterances.len() >= 3 && s.played_bytes >= s.utterances[1].end_pos + 1200 * 8
        })
        .await
        .expect("the reply plays on");
        let (_, record) = says_tuesday(&stack, &sid, &sim, "the interrupting turn").await;
        let st = sim.state();
        sim.hang_up().await;
        let _ = stack.finished(&sid).await;
        let stop = *st.cleared_at_pos.last().expect("the carrier got a clear");
        let into = stop.saturating_sub(st.utterances[1].end_pos) / 8;
        let (expected, s2_ms) = words_before(S2, into).await;
        assert!(
            into < s2_ms,
            "the cut ({into} ms) falls inside S2 ({s2_ms} ms)"
        );
        let entry = agent_reply(&record).expect("reply entry");
        assert!(entry.interrupted, "{entry:?}");
        let heard = entry.heard_text.clone();
        assert!(
            reply().starts_with(&heard),
            "a prefix of the reply: {heard:?}"
        );
        let of_s2 = heard.split_whitespace().count() as i64 - S1.split_whitespace().count() as i64;
        eprintln!(
            "piper heard: playback stopped {into} of {s2_ms} ms into S2; stored {of_s2} of its \
             words, timings of a fresh synthesis say {expected}: {heard:?}"
        );
        assert!(
            heard.starts_with(S1) && of_s2 >= 1,
            "words of the cut sentence: {heard:?}"
        );
        assert!(
            (of_s2 - expected as i64).abs() <= 1,
            "{heard:?}: {expected} expected"
        );
        let ev = record.events_of("heard").last().expect("a heard event");
        let ev: serde_json::Value = serde_json::from_str(&ev.detail).expect("JSON");
        assert_eq!(ev["precision"], "word", "{ev}");
    }

    /// Every event of one synthesis.
    async fn drain(mut s: patterd::provider::TtsStream) -> Vec<TtsEvent> {
        let mut out = Vec::new();
        while let Some(e) = s.events.recv().await {
            out.push(e);
        }
        out
    }

    /// Syntheses beyond the one worker wait their turn, and streams dropped while waiting or
    /// after their first audio free it: the last one still speaks, and so does the next.
    #[tokio::test]
    async fn dropped_syntheses_free_the_worker() {
        let Some(keys) = keys() else { return };
        let mut cfg: TtsConfig = toml::from_str(&keys).expect("config");
        cfg.fill_kind_defaults();
        let tts = patterd::provider::piper::PiperTts::new(&cfg).expect("voice");
        let text = "One, two, three, four, five, six, seven, eight, nine, ten.";
        let mut first = tts.synthesize(text);
        let waiting: Vec<_> = (0..3).map(|_| tts.synthesize(text)).collect();
        let last = tts.synthesize("That is all.");
        loop {
            match first.events.recv().await {
                Some(TtsEvent::Audio(_)) => break,
                Some(_) => {}
                None => panic!("the first synthesis ended without audio"),
            }
        }
        drop(first);
        drop(waiting);
        for s in [last, tts.synthesize("Goodbye.")] {
            // A permit kept by a dropped stream would leave these waiting for ever.
            let evs = tokio::time::timeout(std::time::Duration::from_secs(60), drain(s))
                .await
                .expect("the worker was freed");
            assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
            assert!(
                evs.iter()
                    .any(|e| matches!(e, TtsEvent::Audio(a) if !a.is_empty()))
            );
        }
    }
}
