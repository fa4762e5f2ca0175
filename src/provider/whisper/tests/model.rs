//! With the real model (feature `whisper`): Whisper tiny.en converted by
//! scripts/setup/whisper.sh (`PATTERD_WHISPER_MODEL`, default
//! ~/.cache/patterd-models/ggml-tiny.en.bin) on Debian's pocketsphinx-testdata clips, through
//! the phone path (16 kHz → 8 kHz μ-law → 16 kHz). Without the model or the clips these tests
//! say so and pass, unless `PATTERD_REQUIRE_LOCAL_SPEECH=1`, which makes them fail.
//!
//! `figures` (ignored) prints the WER over the 11 utterances of the set, the per-utterance
//! decode time at one and two decodes at once, and the memory of the loaded model:
//! `cargo test --features whisper --lib provider::whisper::tests::model::figures -- --ignored --nocapture`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::super::*;
use crate::audio::g711::encode_ulaw;

const DATA: &str = "/usr/share/pocketsphinx/test/data";

fn require() -> bool {
    std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() == Ok("1")
}

/// The model file, or `None` after saying why (a failure under `PATTERD_REQUIRE_LOCAL_SPEECH=1`).
pub(crate) fn model() -> Option<PathBuf> {
    let path = std::env::var_os("PATTERD_WHISPER_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/patterd-models/ggml-tiny.en.bin")
        });
    let data = Path::new(DATA).join("goforward.raw");
    for (what, p, fix) in [
        ("the Whisper model", &path, "run scripts/setup/whisper.sh"),
        (
            "the test clips",
            &data,
            "apt-get install pocketsphinx-testdata (tests/setup.sh)",
        ),
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

fn decoders(model: &Path, threads: usize) -> Vec<Box<dyn Decode>> {
    engine::open(&PoolKey {
        model: model.display().to_string(),
        language: "en".into(),
        threads,
        queue: 0,
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// 16-bit mono PCM at 16 kHz: a `.raw` file as is, a `.wav` file after its 44-byte header.
fn pcm16k(path: &Path) -> Vec<i16> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let skip = if path.extension().is_some_and(|e| e == "wav") {
        44
    } else {
        0
    };
    bytes[skip..]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// What a carrier delivers for this 16 kHz recording: band-limited to 8 kHz, μ-law.
pub(crate) fn phone(pcm: &[i16]) -> Vec<u8> {
    let mut r = Resampler::new(16_000, 8_000).expect("resampler");
    let mut out = Vec::new();
    r.push(pcm, &mut out);
    r.finish(&mut out);
    encode_ulaw(&out)
}

/// One decode's cost: wall time, and the decoding thread's own CPU time (what it would take
/// on a core of its own; on a loaded machine the wall time is mostly waiting for one).
#[derive(Debug, Clone, Copy)]
struct Cost {
    wall: Duration,
    cpu: Duration,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Decodes one phone-band utterance as the provider does.
fn hear(d: &mut Box<dyn Decode>, ulaw: &[u8]) -> (String, Cost) {
    let (t, c) = (Instant::now(), thread_cpu());
    let raw = d
        .decode(&to_16k(ulaw), token_cap(ulaw.len() as u64 / 8))
        .expect("decode");
    let cost = Cost {
        wall: t.elapsed(),
        cpu: thread_cpu().saturating_sub(c),
    };
    (clean(&raw), cost)
}

#[test]
fn the_model_hears_a_sentence_through_the_phone_path() {
    let Some(m) = model() else { return };
    let mut d = decoders(&m, 1).remove(0);
    let (text, _) = hear(
        &mut d,
        &phone(&pcm16k(&Path::new(DATA).join("goforward.raw"))),
    );
    assert_eq!(words(&text), ["go", "forward", "ten", "meters"], "{text:?}");
}

#[test]
fn silence_and_noise_give_no_words() {
    let Some(m) = model() else { return };
    let mut d = decoders(&m, 1).remove(0);
    let fixture = |name: &str| {
        let p = format!(
            "{}/tests/fixtures/speech/{name}.ulaw",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    // A quiet line's hiss: white noise about 50 dB below full scale.
    let mut seed = 0x2545_f491_u32;
    let hiss: Vec<i16> = (0..16_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 200) as i16 - 100
        })
        .collect();
    let mut failed = Vec::new();
    for (what, ulaw) in [
        ("silence", vec![0xFF; 16_000]),
        ("hiss", encode_ulaw(&hiss)),
        ("cough", fixture("cough")),
        ("click", fixture("click")),
    ] {
        let raw = d
            .decode(&to_16k(&ulaw), token_cap(ulaw.len() as u64 / 8))
            .expect("decode");
        eprintln!("{what}: {raw:?}");
        if !clean(&raw).is_empty() {
            failed.push(format!("{what}: {raw:?}"));
        }
    }
    assert!(failed.is_empty(), "heard as words: {failed:?}");
}

/// `(file, reference)` for the 11 utterances: 5 LibriVox, 5 CMU cards, goforward.
fn test_set() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for (dir, list) in [
        ("librivox", "transcription"),
        ("cards", "cards.transcription"),
    ] {
        let text =
            std::fs::read_to_string(Path::new(DATA).join(dir).join(list)).expect("transcription");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            // `<s> words </s> (id)`
            let id = line
                .rsplit('(')
                .next()
                .unwrap_or("")
                .trim_end_matches(')')
                .trim();
            let words = line
                .replace("<s>", "")
                .split("</s>")
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            out.push((Path::new(DATA).join(dir).join(format!("{id}.wav")), words));
        }
    }
    out.push((
        Path::new(DATA).join("goforward.raw"),
        "go forward ten meters".into(),
    ));
    out
}

/// Lower case, no punctuation, hyphens as spaces, numbers as words, `mr` as `mister`.
pub(crate) fn words(text: &str) -> Vec<String> {
    let spaced: String = text
        .chars()
        .map(|c| if c == '-' { ' ' } else { c })
        .filter(|c| c.is_alphanumeric() || c.is_whitespace() || *c == '\'')
        .flat_map(char::to_lowercase)
        .collect();
    spaced
        .split_whitespace()
        .flat_map(|w| match w.parse::<u32>() {
            Ok(n) => number_words(n),
            Err(_) if w == "mr" => vec!["mister".to_string()],
            Err(_) => vec![w.to_string()],
        })
        .collect()
}

fn number_words(n: u32) -> Vec<String> {
    const ONES: [&str; 20] = [
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
    const TENS: [&str; 10] = [
        "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    match n {
        0..=19 => vec![ONES[n as usize].into()],
        20..=99 => {
            let mut v = vec![TENS[(n / 10) as usize].to_string()];
            if !n.is_multiple_of(10) {
                v.push(ONES[(n % 10) as usize].into());
            }
            v
        }
        100..=999 => {
            let mut v = vec![ONES[(n / 100) as usize].to_string(), "hundred".into()];
            if !n.is_multiple_of(100) {
                v.extend(number_words(n % 100));
            }
            v
        }
        _ => n
            .to_string()
            .chars()
            .map(|c| ONES[(c as u8 - b'0') as usize].to_string())
            .collect(),
    }
}

/// Word-level edit distance.
pub(crate) fn errors(reference: &[String], hyp: &[String]) -> usize {
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

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The `p` quantile (nearest rank) of `times`, in ms.
fn ms(times: &[Duration], p: f64) -> u128 {
    let mut t = times.to_vec();
    t.sort();
    t[((t.len() as f64 - 1.0) * p).round() as usize].as_millis()
}

fn summary(costs: &[Cost]) -> String {
    let cpu: Vec<Duration> = costs.iter().map(|c| c.cpu).collect();
    let wall: Vec<Duration> = costs.iter().map(|c| c.wall).collect();
    format!(
        "CPU p50 {} ms, p95 {} ms; wall p50 {} ms, p95 {} ms",
        ms(&cpu, 0.5),
        ms(&cpu, 0.95),
        ms(&wall, 0.5),
        ms(&wall, 0.95)
    )
}

#[test]
#[ignore = "figures for docs/BENCHMARKS.md; needs the model, takes minutes"]
fn figures() {
    let Some(m) = model() else { return };
    let set: Vec<(Vec<u8>, Vec<String>, u64)> = test_set()
        .into_iter()
        .map(|(p, r)| {
            let pcm = pcm16k(&p);
            let ms = pcm.len() as u64 / 16;
            (phone(&pcm), words(&r), ms)
        })
        .collect();
    let audio_s: f64 = set.iter().map(|s| s.2 as f64 / 1000.0).sum();
    let before = rss_kb();
    let mut one = decoders(&m, 1);
    let loaded = rss_kb();
    // One decode at a time: WER and times.
    let (mut errs, mut total, mut costs) = (0, 0, Vec::new());
    for (ulaw, reference, _) in &set {
        let (text, cost) = hear(&mut one[0], ulaw);
        let hyp = words(&text);
        let e = errors(reference, &hyp);
        println!(
            "{e} errors in {:>2} words, CPU {:>5} ms, wall {:>5} ms: {text}",
            reference.len(),
            cost.cpu.as_millis(),
            cost.wall.as_millis()
        );
        errs += e;
        total += reference.len();
        costs.push(cost);
    }
    let after_one = rss_kb();
    drop(one);
    // 2 and 4 decodes at once: that many decoder threads over one model, each through the
    // whole set, each starting at a different clip so that they decode different ones.
    let set = std::sync::Arc::new(set);
    let mut at_once = Vec::new();
    for n in [2usize, 4] {
        let ds = decoders(&m, n);
        let with_n = rss_kb();
        let handles: Vec<_> = ds
            .into_iter()
            .enumerate()
            .map(|(k, mut d)| {
                let set = set.clone();
                std::thread::spawn(move || {
                    let len = set.len();
                    (0..len)
                        .map(|i| hear(&mut d, &set[(i + k * len / n) % len].0).1)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let costs_n: Vec<Cost> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect();
        at_once.push((n, costs_n, with_n, rss_kb()));
    }
    let cpu: f64 = costs.iter().map(|c| c.cpu.as_secs_f64()).sum();
    println!(
        "WER {:.1} % ({errs} errors in {total} words, {} utterances, {audio_s:.1} s of audio, phone path)",
        100.0 * errs as f64 / total as f64,
        set.len()
    );
    println!(
        "decode, 1 at a time: {}; RTF_cpu {:.2}",
        summary(&costs),
        cpu / audio_s
    );
    for (n, costs_n, _, _) in &at_once {
        println!("decode, {n} at once: {}", summary(costs_n));
    }
    println!(
        "memory: model + 1 decoder {} MB (after decoding {} MB) (RSS above the test's {} MB)",
        (loaded - before) / 1024,
        (after_one - before) / 1024,
        before / 1024
    );
    for (n, _, with_n, after_n) in &at_once {
        println!(
            "memory: model + {n} decoders {} MB (after decoding {} MB)",
            with_n.saturating_sub(before) / 1024,
            after_n.saturating_sub(before) / 1024
        );
    }
}
