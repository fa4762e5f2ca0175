//! Smart Turn v3.2 with the real model (cargo feature `smart_turn`): the Rust Whisper features
//! against numpy's (tests/fixtures/smart_turn/reference.json, made by make_reference.py beside
//! it), the probability against Python onnxruntime's on the same clip, and a whole call where
//! the model judges the caller's pause. The library and the model come from
//! tests/models/setup.sh, through `PATTERD_ORT_LIBRARY` / `PATTERD_SMART_TURN_MODEL` (default:
//! ~/.cache/patterd-models); without them these tests say so loudly and skip, unless
//! `PATTERD_REQUIRE_MODELS=1` (CI sets it), which makes them fail.

use std::path::PathBuf;

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::audio::g711::decode_ulaw;
use patterd::audio::whisper_mel::{FRAMES, N_MELS, WhisperMel};
use patterd::call::eot::EndOfTurnModel;
use patterd::call::eot::smart_turn::SmartTurn;
use patterd_sim::hermes::HermesReply;

fn file(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        home.join(".cache/patterd-models").join(name)
    })
}

/// The stored onnxruntime references were computed on a CPU with VNNI (AVX-512 VNNI or AVX-VNNI).
/// Without it, onnxruntime's int8 kernels take the AVX2 path (`vpmaddubsw`, whose 16-bit
/// intermediate sums saturate), and the quantized model's output differs from the stored figures
/// by more than their tolerance: seen on an AMD EPYC without VNNI, 0.0091 against 0.0067. The
/// comparisons with stored figures run only where they are valid; elsewhere they say why.
pub(super) fn reference_cpu() -> bool {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let vnni = flags
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            l.split_whitespace()
                .any(|f| f == "avx512_vnni" || f == "avx_vnni")
        });
    if !vnni {
        eprintln!(
            "SKIPPED: this CPU has no VNNI, so onnxruntime's int8 kernels differ from the ones \
             the stored reference figures were computed with; this comparison did not run"
        );
    }
    vnni
}

/// The library and the model, or `None` (after saying why) when they are not installed.
pub(super) fn model_files() -> Option<(PathBuf, PathBuf)> {
    let lib = file("PATTERD_ORT_LIBRARY", "libonnxruntime.so.1.32.0");
    let model = file("PATTERD_SMART_TURN_MODEL", "smart-turn-v3.2-cpu.onnx");
    if lib.is_file() && model.is_file() {
        return Some((lib, model));
    }
    assert!(
        std::env::var("PATTERD_REQUIRE_MODELS").as_deref() != Ok("1"),
        "PATTERD_REQUIRE_MODELS=1 but {} or {} is missing: run tests/models/setup.sh",
        lib.display(),
        model.display()
    );
    eprintln!(
        "SKIPPED: onnxruntime or the Smart Turn model is not installed (run tests/models/setup.sh); \
         this Smart Turn test did not run"
    );
    None
}

struct Reference {
    probability: f32,
    stride: usize,
    features: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smart_turn/reference.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("reference.json"))
            .expect("json");
    Reference {
        probability: v["probability"].as_f64().expect("probability") as f32,
        stride: v["stride"].as_u64().expect("stride") as usize,
        features: v["features"]
            .as_array()
            .expect("features")
            .iter()
            .map(|row| {
                row.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("number") as f32)
                    .collect()
            })
            .collect(),
    }
}

/// The reference clip at 16 kHz, as make_reference.py builds it (each sample twice).
fn clip_16k() -> Vec<f32> {
    decode_ulaw(&clip("book_table"))
        .into_iter()
        .flat_map(|s| [f32::from(s) / 32768.0; 2])
        .collect()
}

#[test]
fn whisper_features_match_numpy() {
    let r = reference();
    let f = WhisperMel::new().features(&clip_16k());
    assert_eq!(f.len(), N_MELS * FRAMES);
    assert_eq!(r.features.len(), N_MELS);
    let mut worst = 0f32;
    for (m, row) in r.features.iter().enumerate() {
        assert_eq!(row.len(), FRAMES / r.stride);
        for (i, want) in row.iter().enumerate() {
            let got = f[m * FRAMES + i * r.stride];
            worst = worst.max((got - want).abs());
        }
    }
    // The fixture is rounded to 6 decimals.
    assert!(worst < 1e-4, "largest difference from numpy: {worst}");
}

#[test]
fn the_probability_matches_python_onnxruntime() {
    let Some((lib, model)) = model_files() else {
        return;
    };
    if !reference_cpu() {
        return;
    }
    let mut m = SmartTurn::load(&lib, &model).expect("load Smart Turn");
    let p = m.complete_probability(&clip_16k()).expect("inference");
    let want = reference().probability;
    assert!(
        (p - want).abs() < 1e-3,
        "Rust {p}, Python onnxruntime {want}"
    );
}

#[tokio::test]
async fn a_call_with_smart_turn_records_each_judgement() {
    let Some((lib, model)) = model_files() else {
        return;
    };
    let stack = Stack::start(Opts {
        transcripts: vec!["I'd like to book a table for two tonight".into()],
        agent_extra: "turn_model = \"st\"\nidle_nudge_after_s = 0\nmax_endpointing_ms = 4000"
            .into(),
        extra_config: format!(
            "[turn_model.st]\nkind = \"smart_turn\"\nlibrary = {:?}\nmodel = {:?}\n\
             answer_timeout_ms = 3000\n",
            lib.display().to_string(),
            model.display().to_string()
        ),
        ..Default::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Done."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    sim.push_audio(&clip("book_table"));
    stack
        .hermes
        .wait_until("the turn", |r| !r.requests.is_empty())
        .await;
    sim.hang_up().await;
    let record = stack.finished(&sid).await;
    let judged: Vec<&str> = record
        .events_of("turn_model")
        .map(|e| e.detail.as_str())
        .filter(|d| !d.ends_with(" ignored"))
        .collect();
    let first = judged
        .first()
        .unwrap_or_else(|| panic!("the model judged no pause: {:#?}", record.events));
    assert!(
        first.starts_with("complete p=") || first.starts_with("incomplete p="),
        "{judged:?}"
    );
    assert!(
        first.contains(" pause=") && first.contains(" infer_us="),
        "{first}"
    );
    // The turn ended as the judgement says: held for incomplete_hold_ms (1500) when
    // incomplete.
    let end = record
        .events_of("turn_end")
        .next()
        .map(|e| e.detail.clone())
        .expect("turn_end");
    eprintln!("turn_model: {judged:?}; turn_end: {end}");
    let last = judged.last().expect("judged");
    if last.starts_with("incomplete") {
        let silence: u64 = end
            .split("silence_ms=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no silence_ms in {end}"));
        assert!(silence >= 1500, "{end} after {judged:?}");
    } else {
        assert!(
            !end.starts_with("max_endpointing"),
            "{end} after {judged:?}"
        );
    }
}
