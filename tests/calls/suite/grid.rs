//! The suite's grid: the clips of `tests/fixtures/suite` (their words from `clips.tsv`), the
//! noise conditions, the scenario families and the scenarios generated from them.

use std::collections::BTreeMap;

use crate::common::fixtures::path;
use patterd::audio::g711::decode_ulaw;
use patterd_sim::words::{TimedWord, spread_words, voiced_spans};

pub(super) const SENTENCES: [&str; 4] = [
    "We are open every day from noon until ten.",
    "We can seat groups of up to twelve people.",
    "The kitchen closes an hour before we do.",
    "Would you like me to book a table for you?",
];
pub(super) const BOOKING: &str = "I would like to book a table for four people on Tuesday evening.";
/// Level (mean absolute PCM per 20 ms) that counts as voiced when spreading a clip's words.
pub(super) const VOICED_LEVEL: u32 = 300;

pub(super) fn reply() -> String {
    SENTENCES.join(" ")
}

/// A suite clip, `tests/fixtures/suite/<name>.ulaw`.
fn suite_clip(name: &str) -> Vec<u8> {
    let p = path(&format!("suite/{name}.ulaw"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `clips.tsv`: clip name → the words it says.
pub(super) fn clip_texts() -> BTreeMap<String, String> {
    std::fs::read_to_string(path("suite/clips.tsv"))
        .expect("clips.tsv")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// The clips whose name starts with `prefix`, in `clips.tsv`'s order (which pairs each head of
/// a thought with its tail: both lists are written in the same order).
fn clips_listed(prefix: &str) -> Vec<String> {
    std::fs::read_to_string(path("suite/clips.tsv"))
        .expect("clips.tsv")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, _)| n.to_string())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Every suite clip whose name starts with `prefix`, sorted.
fn clips_named(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path("suite"))
        .expect("suite fixtures")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".ulaw").map(str::to_string))
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Noise {
    Clean,
    Street,
    Cafe,
    Hiss,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Condition {
    pub(super) noise: Noise,
    pub(super) snr_db: u8,
}

impl Condition {
    pub(super) fn label(&self) -> String {
        match self.noise {
            Noise::Clean => "clean".into(),
            n => format!("{} {} dB", format!("{n:?}").to_lowercase(), self.snr_db),
        }
    }
}

pub(super) const CONDITIONS: [Condition; 7] = [
    Condition {
        noise: Noise::Clean,
        snr_db: 0,
    },
    Condition {
        noise: Noise::Street,
        snr_db: 20,
    },
    Condition {
        noise: Noise::Street,
        snr_db: 10,
    },
    Condition {
        noise: Noise::Cafe,
        snr_db: 20,
    },
    Condition {
        noise: Noise::Cafe,
        snr_db: 10,
    },
    Condition {
        noise: Noise::Hiss,
        snr_db: 20,
    },
    Condition {
        noise: Noise::Hiss,
        snr_db: 10,
    },
];

/// What the caller does, and so what should happen.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    /// Talks over the reply with a real interruption: the agent should stop and take it.
    Interruption,
    /// "mm hmm" over the reply: the agent should not stop.
    Backchannel,
    /// A cough or a laugh over the reply: the agent should not stop.
    Burst,
    /// The agent's own voice back at `db` below it: the agent should not stop.
    Echo { db: i8 },
    /// A head, a pause, the tail: one turn, committed after the tail. `real`: cut from a
    /// recording of a human reader at a pause inside it (else espeak-ng voices).
    MidThought {
        tail: String,
        pause_ms: u64,
        real: bool,
    },
    /// A complete turn: the agent should answer it, soon.
    Complete,
    /// The caller answers right as the agent's short reply ends: a second turn, answered.
    FastTurn,
}

impl Kind {
    pub(super) fn family(&self) -> &'static str {
        match self {
            Kind::Interruption => "interruption",
            Kind::Backchannel => "backchannel",
            Kind::Burst => "cough/laugh",
            Kind::Echo { db: -20 } => "echo -20 dB",
            Kind::Echo { .. } => "echo -6 dB",
            Kind::MidThought { real: false, .. } => "mid-thought pause",
            Kind::MidThought { real: true, .. } => "mid-thought pause, real speech",
            Kind::Complete => "complete turn",
            Kind::FastTurn => "fast turn-taking",
        }
    }

    pub(super) fn overlays_reply(&self) -> bool {
        matches!(
            self,
            Kind::Interruption | Kind::Backchannel | Kind::Burst | Kind::Echo { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub(super) struct Scenario {
    pub(super) id: String,
    pub(super) kind: Kind,
    pub(super) clip: String,
    pub(super) cond: Condition,
}

/// The grid: for each condition, a rotating share of each family's clips.
pub(super) fn scenarios() -> Vec<Scenario> {
    let ints: Vec<String> = [clips_named("int_"), vec!["real_ill_disposed".into()]].concat();
    let bcs = clips_named("bc_");
    let bursts: Vec<String> = [clips_named("cough_"), clips_named("laugh_")].concat();
    // Heads rotate in name order (the grid of the earlier runs); each is finished by the
    // tail listed at its place in clips.tsv.
    let heads = clips_named("head_");
    let listed_heads = clips_listed("head_");
    let tails = clips_listed("tail_");
    let real_heads = clips_listed("rhead_");
    let real_tails = clips_listed("rtail_");
    let dones: Vec<String> = [
        clips_named("done_"),
        vec![
            "real_amiable".into(),
            "real_selfish".into(),
            "real_cards_list".into(),
            "real_ten_clubs".into(),
        ],
    ]
    .concat();
    let mut out = Vec::new();
    let pick = |list: &[String], j: usize, k: usize| -> Vec<String> {
        (0..k)
            .map(|i| list[(j * k + i) % list.len()].clone())
            .collect()
    };
    for (j, cond) in CONDITIONS.iter().enumerate() {
        let mut add = |kind: Kind, clip: String| {
            let id = format!(
                "{}/{}/{}{}",
                cond.label().replace(' ', ""),
                kind.family().replace(' ', "-"),
                clip,
                match &kind {
                    Kind::MidThought { pause_ms, .. } => format!("+{pause_ms}ms"),
                    _ => String::new(),
                }
            );
            out.push(Scenario {
                id,
                kind,
                clip,
                cond: *cond,
            });
        };
        for c in pick(&ints, j, 6) {
            add(Kind::Interruption, c);
        }
        for c in pick(&bcs, j, 4) {
            add(Kind::Backchannel, c);
        }
        for c in pick(&bursts, j, 3) {
            add(Kind::Burst, c);
        }
        add(Kind::Echo { db: -20 }, "agent_voice".into());
        add(Kind::Echo { db: -6 }, "agent_voice".into());
        for i in 0..3 {
            let h = (j * 3 + i) % heads.len();
            let pause_ms = [500, 1000, 1500][(j + i) % 3];
            // The tail in the head's voice (clips.tsv lists both in the same order).
            let at = listed_heads
                .iter()
                .position(|x| *x == heads[h])
                .expect("every head clip is listed in clips.tsv");
            let tail = tails[at].clone();
            add(
                Kind::MidThought {
                    tail,
                    pause_ms,
                    real: false,
                },
                heads[h].clone(),
            );
        }
        let h = j % real_heads.len();
        add(
            Kind::MidThought {
                tail: real_tails[h].clone(),
                pause_ms: [1000, 1500, 500][j % 3],
                real: true,
            },
            real_heads[h].clone(),
        );
        for c in pick(&dones, j, 4) {
            add(Kind::Complete, c);
        }
        add(Kind::FastTurn, pick(&dones, j + 3, 1)[0].clone());
    }
    out
}

/// The clip's audio and its words (relative to its start); noise clips have none.
pub(super) fn clip_with_words(name: &str) -> (Vec<u8>, Vec<TimedWord>) {
    let audio = suite_clip(name);
    let text = clip_texts().get(name).cloned().unwrap_or_default();
    let words = spread_words(&text, &voiced_spans(&audio, VOICED_LEVEL));
    (audio, words)
}

fn rms(pcm: &[i16]) -> f64 {
    if pcm.is_empty() {
        return 0.0;
    }
    (pcm.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>() / pcm.len() as f64).sqrt()
}

/// RMS of the voiced parts of the interruption clips: the speech level SNRs refer to.
pub(super) fn speech_rms() -> f64 {
    let mut all = Vec::new();
    for name in clips_named("int_") {
        let audio = suite_clip(name.as_str());
        for (a, b) in voiced_spans(&audio, VOICED_LEVEL) {
            let (a, b) = (a as usize * 8, (b as usize * 8).min(audio.len()));
            all.extend(decode_ulaw(&audio[a..b]));
        }
    }
    rms(&all)
}

/// The condition's noise bed, scaled to its SNR against `speech_rms`.
pub(super) fn noise_bed(cond: Condition, speech_rms: f64) -> Option<Vec<i16>> {
    let name = match cond.noise {
        Noise::Clean => return None,
        Noise::Street => "noise_street",
        Noise::Cafe => "noise_cafe",
        Noise::Hiss => "noise_hiss",
    };
    let pcm = decode_ulaw(&suite_clip(name));
    let gain = speech_rms / rms(&pcm) / 10f64.powf(f64::from(cond.snr_db) / 20.0);
    Some(
        pcm.iter()
            .map(|s| (f64::from(*s) * gain).clamp(-32768.0, 32767.0) as i16)
            .collect(),
    )
}
