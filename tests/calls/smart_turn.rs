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
/// by more than their tolerance: seen on an AMD EPYC without VNNI, 0.0091 against 0.0067, where
/// Python onnxruntime on the same CPU gives patterd's figure. So the comparisons with stored
/// figures run only where they are valid; the comparison with Python onnxruntime run live
/// ([`python_onnxruntime`]) runs everywhere.
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
            "this CPU has no VNNI, so onnxruntime's int8 kernels differ from the ones the stored \
             reference figures were computed with: only the live Python comparison applies"
        );
    }
    vnni
}

/// Python onnxruntime's probabilities, on this CPU, for feature blocks patterd computed
/// (tests/models/ort_probability.py, in the venv tests/models/setup.sh makes). `None`, after
/// saying why, when that venv is missing (an error under `PATTERD_REQUIRE_MODELS=1`).
pub(super) fn python_onnxruntime(model: &std::path::Path, blocks: &[Vec<f32>]) -> Option<Vec<f32>> {
    let python = file("PATTERD_ORT_PYTHON", "venv/bin/python");
    if !python.is_file() {
        assert!(
            std::env::var("PATTERD_REQUIRE_MODELS").as_deref() != Ok("1"),
            "PATTERD_REQUIRE_MODELS=1 but {} is missing: run tests/models/setup.sh",
            python.display()
        );
        eprintln!(
            "SKIPPED: the Python onnxruntime venv is not installed (run tests/models/setup.sh); \
             the live comparison did not run"
        );
        return None;
    }
    let mut input = tempfile::NamedTempFile::new().expect("temp file");
    let bytes: Vec<u8> = blocks
        .iter()
        .flat_map(|b| {
            assert_eq!(
                b.len(),
                N_MELS * FRAMES,
                "a feature block has the wrong size"
            );
            b.iter().flat_map(|x| x.to_le_bytes())
        })
        .collect();
    std::io::Write::write_all(&mut input, &bytes).expect("write features");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/models/ort_probability.py"
    );
    let out = std::process::Command::new(&python)
        .arg(script)
        .arg(model)
        .arg(input.path())
        .output()
        .expect("run Python onnxruntime");
    assert!(
        out.status.success(),
        "ort_probability.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probabilities: Vec<f32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().expect("a probability"))
        .collect();
    assert_eq!(
        probabilities.len(),
        blocks.len(),
        "one probability per block"
    );
    Some(probabilities)
}

/// patterd's inference and Python onnxruntime's on the same features and the same CPU run the
/// same kernels: anything beyond rounding is a fault in how patterd feeds or reads the model.
pub(super) const LIVE_TOLERANCE: f32 = 1e-5;

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
    let mut m = SmartTurn::load(&lib, &model).expect("load Smart Turn");
    let features = m.features(&clip_16k());
    let p = m.run_features(&features).expect("inference");
    let stored = reference().probability;
    if let Some(live) = python_onnxruntime(&model, &[features]) {
        eprintln!(
            "patterd {p}, Python onnxruntime here {}, stored {stored}",
            live[0]
        );
        assert!(
            (p - live[0]).abs() < LIVE_TOLERANCE,
            "Rust {p}, Python onnxruntime on this CPU {}",
            live[0]
        );
    }
    if reference_cpu() {
        assert!(
            (p - stored).abs() < 1e-3,
            "Rust {p}, stored Python onnxruntime {stored}"
        );
    }
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
