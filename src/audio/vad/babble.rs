//! The VAD on speech over noise: caller clips placed on a timeline over a bed of
//! silence, white or pink noise, or babble (six espeak-ng talkers, `babble.ulaw`), mixed at a
//! given SNR (caller active-speech level against the bed's level), scored on the 20 ms packet
//! grid. Recall is the share of packets with active caller speech during which the VAD says
//! "speaking"; false alarms the share of gap packets (the 300 ms after each utterance excluded)
//! during which it does. `vad_figures` (ignored) prints the table in docs/conversation.md.

use super::*;
use crate::audio::g711::{linear_to_ulaw, ulaw_to_linear};

const PACKET: usize = 160;
const CLIPS: [&str; 7] = [
    "book_table",
    "yes_please",
    "change_booking",
    "no_tuesday",
    "move_it",
    "wait_stop",
    "need_to",
];
const GAPS_MS: [usize; 7] = [1000, 1400, 800, 1200, 900, 1300, 1100];

fn pcm(name: &str) -> Vec<i16> {
    let path = format!(
        "{}/tests/fixtures/speech/{name}.ulaw",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    bytes.into_iter().map(ulaw_to_linear).collect()
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Bed {
    Silence,
    White,
    Pink,
    Babble,
    /// The scenario suite's café bed (four espeak-ng talkers and clatter).
    Cafe,
}

impl Bed {
    fn name(self) -> &'static str {
        match self {
            Bed::Silence => "clean",
            Bed::White => "white noise",
            Bed::Pink => "pink noise",
            Bed::Babble => "babble",
            Bed::Cafe => "café (suite)",
        }
    }

    /// `n` samples of the bed at unit RMS (silence: zeros).
    fn samples(self, n: usize) -> Vec<f32> {
        let mut seed: u32 = 0x9e37_79b9;
        let mut white = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 * 2.0 - 1.0
        };
        let raw: Vec<f32> = match self {
            Bed::Silence => return vec![0.0; n],
            Bed::White => (0..n).map(|_| white()).collect(),
            Bed::Pink => {
                let (mut b0, mut b1, mut b2) = (0.0f32, 0.0f32, 0.0f32);
                (0..n)
                    .map(|_| {
                        let w = white();
                        b0 = 0.99765 * b0 + w * 0.099_046;
                        b1 = 0.963 * b1 + w * 0.296_516_4;
                        b2 = 0.57 * b2 + w * 1.052_691_3;
                        b0 + b1 + b2 + w * 0.1848
                    })
                    .collect()
            }
            Bed::Cafe => {
                let path = format!(
                    "{}/tests/fixtures/suite/noise_cafe.ulaw",
                    env!("CARGO_MANIFEST_DIR")
                );
                let b: Vec<i16> = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("{path}: {e}"))
                    .into_iter()
                    .map(ulaw_to_linear)
                    .collect();
                (0..n).map(|i| f32::from(b[i % b.len()])).collect()
            }
            Bed::Babble => {
                let b = pcm("babble");
                (0..n).map(|i| f32::from(b[(i + 2400) % b.len()])).collect()
            }
        };
        let r = rms(&raw);
        raw.into_iter().map(|v| v / r).collect()
    }
}

/// A mixed timeline and its labels per 20 ms packet.
pub(super) struct Timeline {
    pub ulaw: Vec<u8>,
    /// Packet holds active caller speech.
    pub active: Vec<bool>,
    /// Packet is in a gap (not speech, not within 300 ms after an utterance).
    pub gap: Vec<bool>,
}

/// Caller clips over `bed` at `snr_db` (`with_speech = false`: the bed alone, at the level it
/// would have under the same clips).
pub(super) fn timeline(bed: Bed, snr_db: f32, with_speech: bool) -> Timeline {
    let lead = 2000 * 8;
    let mut clean: Vec<f32> = vec![0.0; lead];
    let mut spans = Vec::new();
    for (name, gap) in CLIPS.iter().zip(GAPS_MS) {
        let c = pcm(name);
        spans.push((clean.len(), clean.len() + c.len()));
        clean.extend(c.iter().map(|&s| f32::from(s)));
        clean.extend(std::iter::repeat_n(0.0, gap * 8));
    }
    clean.extend(std::iter::repeat_n(0.0, 1500 * 8));
    let n = clean.len().div_ceil(PACKET) * PACKET;
    clean.resize(n, 0.0);
    // Active packets: within 30 dB of the loudest packet of their clip.
    let packets = n / PACKET;
    let mut active = vec![false; packets];
    let mut active_samples = Vec::new();
    for &(a, b) in &spans {
        let (pa, pb) = (a / PACKET, b.div_ceil(PACKET));
        let levels: Vec<f32> = (pa..pb)
            .map(|p| rms(&clean[p * PACKET..(p + 1) * PACKET]))
            .collect();
        let max = levels.iter().cloned().fold(0.0, f32::max);
        for (i, l) in levels.iter().enumerate() {
            if *l >= max * 10f32.powf(-30.0 / 20.0) {
                active[pa + i] = true;
                active_samples.extend_from_slice(&clean[(pa + i) * PACKET..(pa + i + 1) * PACKET]);
            }
        }
    }
    let mut gap = vec![true; packets];
    for &(a, b) in &spans {
        let end = (b + 300 * 8).div_ceil(PACKET).min(packets);
        gap[a / PACKET..end].iter_mut().for_each(|g| *g = false);
    }
    let level = rms(&active_samples) * 10f32.powf(-snr_db / 20.0);
    let noise = bed.samples(n);
    let ulaw = (0..n)
        .map(|i| {
            let s = if with_speech { clean[i] } else { 0.0 } + noise[i] * level;
            linear_to_ulaw(s.clamp(-32768.0, 32767.0) as i16)
        })
        .collect();
    if !with_speech {
        active.iter_mut().for_each(|a| *a = false);
    }
    Timeline { ulaw, active, gap }
}

/// What the VAD did on a timeline.
#[derive(Debug, Clone, Copy)]
pub(super) struct Score {
    pub(crate) recall: f32,
    pub(crate) false_alarm: f32,
    /// Share of the whole timeline spent "speaking".
    pub speaking: f32,
    pub segments: usize,
    /// Speaking at the end of the timeline (after 1.5 s of bed only).
    pub(crate) speaking_at_end: bool,
    /// Share of 16 ms frames the network scored.
    pub scored: f32,
}

pub(super) fn run(cfg: VadConfig, t: &Timeline) -> (Score, Vec<bool>) {
    score_with(Vad::new(cfg), t)
}

fn score_with(mut v: Vad, t: &Timeline) -> (Score, Vec<bool>) {
    let mut states = Vec::with_capacity(t.active.len());
    let mut segments = 0;
    for packet in t.ulaw.chunks(PACKET) {
        segments += v
            .push_ulaw(packet)
            .iter()
            .filter(|e| matches!(e, VadEvent::SpeechStart { .. }))
            .count();
        states.push(v.is_speaking());
    }
    let share = |mask: &[bool]| {
        let n = mask.iter().filter(|m| **m).count();
        let hit = mask.iter().zip(&states).filter(|(m, s)| **m && **s).count();
        if n == 0 { 0.0 } else { hit as f32 / n as f32 }
    };
    let score = Score {
        recall: share(&t.active),
        false_alarm: share(&t.gap),
        speaking: states.iter().filter(|s| **s).count() as f32 / states.len() as f32,
        segments,
        speaking_at_end: v.is_speaking(),
        scored: v.frames_scored() as f32 / v.frames_seen() as f32,
    };
    (score, states)
}

/// earshot and hysteresis alone, as before the noise adaptation.
fn plain() -> VadConfig {
    VadConfig {
        floor_margin_db: 0.0,
        gate: false,
        ..VadConfig::default()
    }
}

fn ungated() -> VadConfig {
    VadConfig {
        gate: false,
        ..VadConfig::default()
    }
}

#[test]
fn babble_alone_at_10_db_is_not_a_caller_talking() {
    let t = timeline(Bed::Babble, 10.0, false);
    let (before, _) = run(plain(), &t);
    assert!(
        before.speaking > 0.5,
        "the old VAD hears babble: {before:?}"
    );
    let (s, _) = run(VadConfig::default(), &t);
    assert!(s.speaking < 0.02, "{s:?}");
    assert!(!s.speaking_at_end, "{s:?}");
}

#[test]
fn babble_alone_at_20_db_is_not_a_caller_talking() {
    let (s, _) = run(VadConfig::default(), &timeline(Bed::Babble, 20.0, false));
    assert!(s.speaking < 0.02, "{s:?}");
    assert!(!s.speaking_at_end, "{s:?}");
}

#[test]
fn a_caller_over_babble_is_still_heard() {
    for (snr, min_recall) in [(20.0, 0.9), (10.0, 0.75)] {
        let (s, _) = run(VadConfig::default(), &timeline(Bed::Babble, snr, true));
        assert!(s.recall >= min_recall, "{snr} dB: {s:?}");
        assert!(s.false_alarm < 0.05, "{snr} dB: {s:?}");
        assert!(!s.speaking_at_end, "{snr} dB: {s:?}");
    }
}

/// The default detector without the lower margin while speaking (no speaking relief).
fn no_relief(t: &Timeline) -> Score {
    let mut v = Vad::new(VadConfig::default());
    v.relief_db = 0.0;
    score_with(v, t).0
}

#[test]
fn a_caller_already_speaking_over_babble_keeps_the_quieter_syllables() {
    for bed in [Bed::Babble, Bed::Cafe] {
        let t = timeline(bed, 10.0, true);
        let before = no_relief(&t);
        let (now, _) = run(VadConfig::default(), &t);
        assert!(
            now.recall >= before.recall + 0.05,
            "{}: {before:?} → {now:?}",
            bed.name()
        );
        // Fewer splits of the seven utterances, no more speech in the gaps.
        assert!(now.segments < before.segments, "{before:?} → {now:?}");
        assert!(now.segments >= 7, "{now:?}");
        assert!(now.false_alarm <= before.false_alarm + 0.05, "{now:?}");
        assert!(!now.speaking_at_end, "{now:?}");
        // The bed alone: starts still need the full margin.
        let alone = timeline(bed, 10.0, false);
        let (a0, a) = (no_relief(&alone), run(VadConfig::default(), &alone).0);
        assert!(a.segments <= a0.segments, "{a0:?} → {a:?}");
        assert!(a.speaking <= a0.speaking + 0.03, "{a0:?} → {a:?}");
    }
}

#[test]
fn clean_and_stationary_noise_recall_is_unchanged() {
    for (bed, snr) in [(Bed::Silence, 0.0), (Bed::White, 20.0), (Bed::Pink, 20.0)] {
        let t = timeline(bed, snr, true);
        let (before, _) = run(plain(), &t);
        let (now, _) = run(VadConfig::default(), &t);
        assert!(
            now.recall >= before.recall - 0.02,
            "{}: {before:?} → {now:?}",
            bed.name()
        );
        assert!(now.false_alarm <= before.false_alarm + 0.005, "{now:?}");
    }
}

#[test]
fn the_energy_gate_skips_silence_without_moving_decisions() {
    for (bed, snr) in [(Bed::Silence, 0.0), (Bed::White, 20.0), (Bed::Babble, 10.0)] {
        let t = timeline(bed, snr, true);
        let (full, a) = run(ungated(), &t);
        let (gated, b) = run(VadConfig::default(), &t);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f32 / a.len() as f32;
        assert!(same >= 0.99, "{}: {same} {full:?} {gated:?}", bed.name());
        assert!(
            (full.recall - gated.recall).abs() <= 0.01,
            "{full:?} {gated:?}"
        );
        if bed != Bed::Babble {
            assert!(gated.scored < 0.7, "{}: {gated:?}", bed.name());
        }
    }
}

/// Prints the recall / false-alarm table of docs/conversation.md:
/// `cargo test --release --lib audio::vad::babble::vad_figures -- --ignored --nocapture`
#[test]
#[ignore]
fn vad_figures() {
    println!(
        "| audio | VAD | recall | gap false alarms | bed alone: time \"speaking\" / segments / speaking at end | frames scored |"
    );
    println!("|---|---|---|---|---|---|");
    let conds = [
        (Bed::Silence, 0.0),
        (Bed::White, 20.0),
        (Bed::White, 10.0),
        (Bed::Pink, 20.0),
        (Bed::Pink, 10.0),
        (Bed::Babble, 20.0),
        (Bed::Babble, 10.0),
        (Bed::Cafe, 20.0),
        (Bed::Cafe, 10.0),
    ];
    for (bed, snr) in conds {
        let t = timeline(bed, snr, true);
        let alone = timeline(bed, snr, false);
        for (label, cfg, relief) in [
            ("earshot only", plain(), true),
            ("+ floor margin", ungated(), true),
            (
                "+ energy gate, full margin while speaking",
                VadConfig::default(),
                false,
            ),
            ("+ energy gate", VadConfig::default(), true),
        ] {
            let vad = || {
                let mut v = Vad::new(cfg);
                if !relief {
                    v.relief_db = 0.0;
                }
                v
            };
            let (s, _) = score_with(vad(), &t);
            let (a, _) = score_with(vad(), &alone);
            let audio = if bed == Bed::Silence {
                bed.name().to_string()
            } else {
                format!("{} {snr} dB", bed.name())
            };
            println!(
                "| {audio} | {label} | {:.3} | {:.3} | {:.3} / {} / {} | {:.2} |",
                s.recall,
                s.false_alarm,
                a.speaking,
                a.segments,
                if a.speaking_at_end { "yes" } else { "no" },
                s.scored,
            );
        }
    }
}
