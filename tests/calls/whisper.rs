//! Whole Twilio calls whose agent listens with `[stt.local] kind = "whisper"` (cargo feature
//! `whisper`): real speech from Debian's pocketsphinx-testdata, turned into what a carrier
//! sends (8 kHz μ-law), through the real media socket, our voice-activity cutter and the
//! in-process Whisper tiny.en; the fake brain must receive the sentence with at most one word
//! in ten wrong. The model comes from scripts/setup/whisper.sh (`PATTERD_WHISPER_MODEL`,
//! default ~/.cache/patterd-models/ggml-tiny.en.bin), the clips from tests/speech/setup.sh;
//! without them these tests say so and pass, unless `PATTERD_REQUIRE_LOCAL_SPEECH=1`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::audio::g711::encode_ulaw;
use patterd::audio::resample::Resampler;
use patterd::call::Speaker;
use patterd_sim::hermes::HermesReply;

const DATA: &str = "/usr/share/pocketsphinx/test/data";
/// A decode takes about a second of CPU on an idle core and much longer on a loaded one.
const DECODE_WAIT: Duration = Duration::from_secs(240);

fn require() -> bool {
    std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() == Ok("1")
}

/// The model file, or `None` after saying what is missing.
fn model() -> Option<PathBuf> {
    let path = std::env::var_os("PATTERD_WHISPER_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/patterd-models/ggml-tiny.en.bin")
        });
    let clips = Path::new(DATA).join("goforward.raw");
    for (what, p, fix) in [
        ("the Whisper model", &path, "run scripts/setup/whisper.sh"),
        ("the test clips", &clips, "run tests/speech/setup.sh"),
    ] {
        if !p.is_file() {
            assert!(
                !require(),
                "PATTERD_REQUIRE_LOCAL_SPEECH=1 but {what} ({}) is missing: {fix}",
                p.display()
            );
            eprintln!("SKIPPED: {what} ({}) is missing: {fix}", p.display());
            return None;
        }
    }
    Some(path)
}

/// A 16 kHz 16-bit recording as a carrier delivers it: band-limited to 8 kHz, μ-law.
fn phone_clip(name: &str) -> Vec<u8> {
    let path = Path::new(DATA).join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let skip = if name.ends_with(".wav") { 44 } else { 0 };
    let pcm: Vec<i16> = bytes[skip..]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    let mut r = Resampler::new(16_000, 8_000).expect("resampler");
    let mut out = Vec::new();
    r.push(&pcm, &mut out);
    r.finish(&mut out);
    encode_ulaw(&out)
}

/// Lower case, letters, digits and apostrophes; numbers below 20 as words.
fn words(text: &str) -> Vec<String> {
    const SMALL: [&str; 20] = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    text.chars()
        .map(|c| if c == '-' { ' ' } else { c })
        .filter(|c| c.is_alphanumeric() || c.is_whitespace() || *c == '\'')
        .flat_map(char::to_lowercase)
        .collect::<String>()
        .split_whitespace()
        .map(|w| match w.parse::<usize>() {
            Ok(n) if n < 20 => SMALL[n].to_string(),
            _ if w == "mr" => "mister".to_string(),
            _ => w.to_string(),
        })
        .collect()
}

/// Word-level edit distance.
fn errors(reference: &[String], hyp: &[String]) -> usize {
    let mut prev: Vec<usize> = (0..=hyp.len()).collect();
    for (i, r) in reference.iter().enumerate() {
        let mut cur = vec![i + 1; hyp.len() + 1];
        for (j, h) in hyp.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(r != h))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[hyp.len()]
}

async fn local_stack(model: &Path) -> Stack {
    Stack::start(Opts {
        stt: "local".into(),
        extra_sections: format!(
            "[stt.local]\nkind = \"whisper\"\nmodel_path = \"{}\"\nthreads = 1\n",
            model.display()
        ),
        ..Default::default()
    })
    .await
}

/// The user messages the brain received, in order.
fn user_turns(stack: &Stack) -> Vec<String> {
    stack
        .hermes
        .record()
        .requests
        .iter()
        .filter_map(|r| {
            r.messages()
                .into_iter()
                .rev()
                .find(|(role, _)| role == "user")
                .map(|(_, text)| text)
        })
        .collect()
}

#[tokio::test]
async fn whisper_hears_real_speech_on_a_phone_call_and_ignores_noise() {
    let Some(model) = model() else { return };
    let stack = local_stack(&model).await;
    stack.hermes.push(HermesReply::text("Moving forward."));
    stack.hermes.push(HermesReply::text("Indeed he did."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");

    // Noise first: a cough and a click on the line must not become a turn.
    sim.push_audio(&clip("cough"));
    sim.push_silence(1500);
    sim.push_audio(&clip("click"));
    sim.push_silence(1500);
    // Then a short command and a long sentence, each its own turn.
    let turns = [
        ("goforward.raw", "go forward ten meters"),
        (
            "librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
            "and mister john dashwood had then leisure to consider how much there might be \
             prudently in his power to do for them",
        ),
    ];
    for (k, (name, _)) in turns.iter().enumerate() {
        let marks = sim.state().marks_echoed.len();
        sim.push_audio(&phone_clip(name));
        sim.push_silence(1500);
        stack
            .hermes
            .wait_until_within("the turn reaches the brain", DECODE_WAIT, |r| {
                r.requests.len() > k
            })
            .await;
        // Its reply plays out before the caller speaks again.
        sim.wait_for("the reply is heard", WAIT, |s| s.marks_echoed.len() > marks)
            .await
            .expect("the reply plays");
    }
    let heard = user_turns(&stack);
    assert_eq!(heard.len(), 2, "exactly the two sentences: {heard:?}");
    for ((_, reference), text) in turns.iter().zip(&heard) {
        let reference = words(reference);
        let e = errors(&reference, &words(text));
        assert!(
            e * 10 <= reference.len(),
            "{e} of {} words wrong: heard {text:?}",
            reference.len()
        );
    }

    sim.hang_up().await;
    let record = stack.finished(&sid).await;
    let caller: Vec<_> = record
        .transcript
        .iter()
        .filter(|e| e.speaker == Speaker::Caller)
        .map(|e| e.text.clone())
        .collect();
    assert_eq!(
        caller, heard,
        "the call's transcript keeps what the brain got"
    );
    assert_eq!(
        record.events_of("stt_error").count(),
        0,
        "no STT error on a quiet machine's call"
    );
}
