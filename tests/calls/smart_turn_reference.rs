//! Smart Turn through patterd's own path against pipecat's (feature `smart_turn`): suite clips
//! (espeak-ng and real human speech, 8 kHz μ-law) streamed frame by frame into the call's
//! [`CallerRing`] as the actor feeds it (a second of silence, the clip, then the trailing
//! silence our detector has heard when it says the caller stopped), then our Whisper features
//! and onnxruntime, compared with `tests/fixtures/smart_turn/suite_reference.json`, which
//! `tests/models/smart_turn_reference.py` made with pipecat 1.14.0's own pieces on the same
//! stream (soxr "HQ" 8 → 16 kHz as its analyzer resamples, its vendored Whisper extractor,
//! Python onnxruntime 1.32.0). The ignored `smart_turn_reference_table` prints every clip.

use patterd::audio::whisper_mel::{FRAMES, N_MELS};
use patterd::call::eot::CallerRing;
use patterd::call::eot::smart_turn::SmartTurn;

use super::smart_turn::{LIVE_TOLERANCE, model_files, python_onnxruntime, reference_cpu};
use crate::common::fixtures::path;

/// One 20 ms frame of μ-law silence.
const SILENCE: [u8; 160] = [0xFF; 160];

/// The ring's content after `lead_ms` of silence, the clip and `trail_ms` of silence, and the
/// number of 8 kHz samples pushed.
pub fn ring_audio(clip: &[u8], lead_ms: u64, trail_ms: u64) -> (Vec<f32>, usize) {
    let mut ring = CallerRing::new();
    let mut pushed = 0;
    let mut push = |f: &[u8]| {
        ring.push_ulaw(f);
        pushed += f.len();
    };
    for _ in 0..lead_ms / 20 {
        push(&SILENCE);
    }
    for chunk in clip.chunks(160) {
        let mut f = SILENCE;
        f[..chunk.len()].copy_from_slice(chunk);
        push(&f);
    }
    for _ in 0..trail_ms / 20 {
        push(&SILENCE);
    }
    (ring.snapshot(), pushed)
}

struct Entry {
    clip: String,
    trail_ms: u64,
    probability: f32,
    /// Per mel bin, the mean over the last `tail_frames` frames.
    mel_means: Option<Vec<f32>>,
    /// Per frame of the last `tail_frames`, the mean over the mel bins.
    frame_means: Option<Vec<f32>>,
    /// pipecat's probability with soxr's other filters ("VHQ", "MQ").
    other_resamplers: Option<Vec<f32>>,
}

struct Reference {
    lead_ms: u64,
    held_back: usize,
    tail_frames: usize,
    entries: Vec<Entry>,
}

fn floats(v: &serde_json::Value) -> Option<Vec<f32>> {
    v.as_array().map(|a| {
        a.iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    })
}

fn reference() -> Reference {
    let p = path("smart_turn/suite_reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("suite_reference.json"))
            .expect("json");
    Reference {
        lead_ms: v["lead_ms"].as_u64().expect("lead_ms"),
        held_back: v["held_back"].as_u64().expect("held_back") as usize,
        tail_frames: v["tail_frames"].as_u64().expect("tail_frames") as usize,
        entries: v["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| Entry {
                clip: e["clip"].as_str().expect("clip").to_string(),
                trail_ms: e["trail_ms"].as_u64().expect("trail_ms"),
                probability: e["probability"].as_f64().expect("probability") as f32,
                mel_means: floats(&e["mel_means"]),
                frame_means: floats(&e["frame_means"]),
                other_resamplers: floats(&e["other_resamplers"]),
            })
            .collect(),
    }
}

fn suite_clip(name: &str) -> Vec<u8> {
    let p = path(&format!("suite/{name}.ulaw"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Mel bins 59–65 (centres 3.6–4.7 kHz): the resamplers' transition band around the 4 kHz
/// edge of telephone audio, where rubato's filter and soxr's differ in how much they keep.
const EDGE_BINS: std::ops::RangeInclusive<usize> = 59..=65;

/// Largest differences between our features and the reference's: mel means outside
/// [`EDGE_BINS`], frame means, and mel means in them.
fn feature_gap(features: &[f32], e: &Entry, tail: usize) -> (f32, f32, f32) {
    let from = FRAMES - tail;
    let gaps: Vec<f32> = e.mel_means.as_ref().map_or(Vec::new(), |want| {
        (0..N_MELS)
            .map(|m| {
                let got = features[m * FRAMES + from..(m + 1) * FRAMES]
                    .iter()
                    .sum::<f32>()
                    / tail as f32;
                (got - want[m]).abs()
            })
            .collect()
    });
    let worst = |edge: bool| {
        gaps.iter()
            .enumerate()
            .filter(|(m, _)| EDGE_BINS.contains(m) == edge)
            .map(|(_, g)| *g)
            .fold(0.0, f32::max)
    };
    let mel = worst(false);
    let frame = e.frame_means.as_ref().map_or(0.0, |want| {
        (0..tail)
            .map(|t| {
                let got = (0..N_MELS)
                    .map(|m| features[m * FRAMES + from + t])
                    .sum::<f32>()
                    / N_MELS as f32;
                (got - want[t]).abs()
            })
            .fold(0.0, f32::max)
    });
    (mel, frame, worst(true))
}

/// Our probability, feature gaps and features for one entry.
fn judge(model: &mut SmartTurn, r: &Reference, e: &Entry) -> (f32, (f32, f32, f32), Vec<f32>) {
    let (audio, pushed) = ring_audio(&suite_clip(&e.clip), r.lead_ms, e.trail_ms);
    assert_eq!(
        2 * pushed - audio.len().min(2 * pushed),
        r.held_back,
        "the ring holds back a different number of samples than the reference assumed"
    );
    let features = model.features(&audio);
    let p = model.run_features(&features).expect("inference");
    let gap = feature_gap(&features, e, r.tail_frames);
    (p, gap, features)
}

/// The entries with features (a handful of clips): features match pipecat's everywhere; the
/// probability matches Python onnxruntime's run live on the same features everywhere, and
/// pipecat's stored figure on CPUs like the one it was made on ([`reference_cpu`]).
#[test]
fn suite_clips_match_pipecat_reference() {
    let Some((lib, model)) = model_files() else {
        return;
    };
    let mut m = SmartTurn::load(&lib, &model).expect("load Smart Turn");
    let r = reference();
    let checked: Vec<&Entry> = r.entries.iter().filter(|e| e.mel_means.is_some()).collect();
    assert!(checked.len() >= 4, "the fixture has too few checked clips");
    let stored_applies = reference_cpu();
    let mut ours = Vec::new();
    let mut blocks = Vec::new();
    for e in checked {
        let (p, (mel, frame, edge), features) = judge(&mut m, &r, e);
        ours.push((e.clip.as_str(), p));
        blocks.push(features);
        let others = e.other_resamplers.clone().unwrap_or_default();
        eprintln!(
            "{} +{} ms: patterd {p:.4}, pipecat {:.4} (other soxr filters {others:?}); \
             mel gap {mel:.4} (4 kHz edge {edge:.4}), frame gap {frame:.4}",
            e.clip, e.trail_ms, e.probability
        );
        assert!(
            mel < 0.03 && frame < 0.03,
            "{}: features differ from pipecat's by {mel} (mel), {frame} (frame)",
            e.clip
        );
        if !stored_applies {
            continue;
        }
        // Inside the model's spread over resamplers (soxr HQ/VHQ/MQ), give or take 0.05.
        let lo = others.iter().fold(e.probability, |a, b| a.min(*b)) - 0.05;
        let hi = others.iter().fold(e.probability, |a, b| a.max(*b)) + 0.05;
        assert!(
            (lo..=hi).contains(&p),
            "{} +{} ms: patterd {p}, pipecat {} (other filters {others:?})",
            e.clip,
            e.trail_ms,
            e.probability
        );
    }
    if let Some(live) = python_onnxruntime(&model, &blocks) {
        for ((clip, p), want) in ours.iter().zip(&live) {
            assert!(
                (p - want).abs() < LIVE_TOLERANCE,
                "{clip}: patterd {p}, Python onnxruntime on the same features here {want}"
            );
        }
    }
}

/// Every clip of the fixture: ours against pipecat's (`--ignored --nocapture`).
#[test]
#[ignore]
fn smart_turn_reference_table() {
    let Some((lib, model)) = model_files() else {
        return;
    };
    let mut m = SmartTurn::load(&lib, &model).expect("load Smart Turn");
    let r = reference();
    println!(
        "| clip | trailing silence ms | pipecat | patterd | difference |\n|---|---|---|---|---|"
    );
    let mut worst = 0f32;
    for e in &r.entries {
        let (p, _, _) = judge(&mut m, &r, e);
        worst = worst.max((p - e.probability).abs());
        println!(
            "| {} | {} | {:.3} | {p:.3} | {:+.3} |",
            e.clip,
            e.trail_ms,
            e.probability,
            p - e.probability
        );
    }
    println!("largest difference: {worst:.4}");
}
