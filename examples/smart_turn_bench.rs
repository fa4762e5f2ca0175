//! Cost of one Smart Turn decision (feature `smart_turn`): the Whisper features of an 8 s
//! window and one onnxruntime inference (one intra-op thread), as the turn-model worker runs
//! them. Prints the median and p90 of each over N runs (default 50) on the reference clip.
//!
//! `tests/models/setup.sh` then
//! `cargo run --release --features smart_turn --example smart_turn_bench -- LIB MODEL [N]`
//! (LIB, MODEL default to ~/.cache/patterd-models).

use std::path::PathBuf;
use std::time::Instant;

use patterd::audio::g711::decode_ulaw;
use patterd::audio::whisper_mel::WhisperMel;
use patterd::call::eot::smart_turn::SmartTurn;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let cache = home.join(".cache/patterd-models");
    let lib = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("libonnxruntime.so.1.32.0"));
    let model = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("smart-turn-v3.2-cpu.onnx"));
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let clip = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/speech/book_table.ulaw"
    ))
    .expect("clip");
    let audio: Vec<f32> = decode_ulaw(&clip)
        .into_iter()
        .flat_map(|s| [f32::from(s) / 32768.0; 2])
        .collect();
    let t = Instant::now();
    let mut m = match SmartTurn::load(&lib, &model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "load (library + model): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mel = WhisperMel::new();
    let features = mel.features(&audio);
    let _ = m.run_features(&features); // warm-up
    let (mut feat_ms, mut infer_ms) = (Vec::new(), Vec::new());
    let mut p = 0.0;
    for _ in 0..n {
        let t = Instant::now();
        let f = mel.features(&audio);
        feat_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        p = m.run_features(&f).expect("inference");
        infer_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "features: median {:.2} ms, p90 {:.2} ms; inference: median {:.2} ms, p90 {:.2} ms; \
         {n} runs, probability {p:.4}",
        percentile(&mut feat_ms, 0.5),
        percentile(&mut feat_ms, 0.9),
        percentile(&mut infer_ms, 0.5),
        percentile(&mut infer_ms, 0.9),
    );
}
