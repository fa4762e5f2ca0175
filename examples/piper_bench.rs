//! Piper inside patterd (feature `piper`): the `kind = "piper"` provider as a call uses it,
//! on five typical agent sentences. Prints the voice's load time and the process's resident
//! memory before and after loading it, then per sentence the first audio (synthesize → first
//! μ-law chunk), the whole synthesis, the audio's length, RTF (wall and the process's CPU
//! time over audio time), and how much of it this build's resampler costs (unoptimised in a
//! debug build: subtract it for the engine's own figure).
//!
//! `scripts/setup/piper.sh` then
//! `cargo run --features piper --example piper_bench -- [RUNS] [THREADS]`
//! (voice and library from `PATTERD_PIPER_VOICE` / `PATTERD_ORT_LIBRARY` or
//! ~/.cache/patterd-models; RUNS per sentence, default 3; THREADS onnxruntime threads, default 1).

use std::time::{Duration, Instant};

use patterd::audio::resample::Resampler;
use patterd::config::schema::TtsConfig;
use patterd::provider::piper::PiperTts;
use patterd::provider::{TtsEvent, TtsProvider};

const LINES: &[&str] = &[
    "Sure, I can help you with that.",
    "Your table for four is booked for Tuesday at seven in the evening.",
    "I'm sorry, I didn't catch that, could you say it again?",
    "The kitchen closes an hour before we do, so please arrive by nine.",
    "Is there anything else I can do for you today?",
];

/// The process's resident set (kB), from /proc.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The process's CPU time so far (every thread: the blocking pool's too).
fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given; an all-zero rusage is a valid value.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) } != 0 {
        return Duration::ZERO;
    }
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(r.ru_utime) + t(r.ru_stime)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let threads: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut cfg: TtsConfig =
        toml::from_str(&format!("kind = \"piper\"\nthreads = {threads}")).expect("config");
    cfg.fill_kind_defaults();
    let before = rss_kb();
    let t = Instant::now();
    let tts = match PiperTts::new(&cfg) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "load + warm-up: {:.0} ms; resident memory {} MB before, {} MB after ({} MB for the \
         voice, onnxruntime and espeak-ng's pipes; espeak-ng's own process is separate)",
        t.elapsed().as_secs_f64() * 1e3,
        before / 1024,
        rss_kb() / 1024,
        (rss_kb().saturating_sub(before)) / 1024
    );
    let (mut firsts, mut rtfs, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    let mut audio_total = 0.0;
    for line in LINES {
        for _ in 0..runs {
            let (t, c) = (Instant::now(), cpu());
            let mut s = tts.synthesize(line);
            let (mut first, mut bytes) = (None, 0usize);
            while let Some(ev) = s.events.recv().await {
                match ev {
                    TtsEvent::Audio(a) => {
                        first.get_or_insert_with(|| t.elapsed());
                        bytes += a.len();
                    }
                    TtsEvent::Done => break,
                    TtsEvent::Words(_) => {}
                    other => panic!("{other:?}"),
                }
            }
            let (wall, used) = (t.elapsed(), cpu().saturating_sub(c));
            let audio = bytes as f64 / 8000.0;
            audio_total += audio;
            let first = first.unwrap_or_default().as_secs_f64() * 1e3;
            println!(
                "{line:?}: first audio {first:.0} ms, synthesis {:.0} ms, audio {audio:.2} s, \
                 RTF {:.3} (CPU {:.3})",
                wall.as_secs_f64() * 1e3,
                wall.as_secs_f64() / audio,
                used.as_secs_f64() / audio
            );
            firsts.push(first);
            rtfs.push(wall.as_secs_f64() / audio);
            cpus.push(used.as_secs_f64() / audio);
        }
    }
    // This build's resampler on a second of 22.05 kHz audio, for the share of the above that
    // is not the engine's.
    let tone: Vec<i16> = (0..22_050).map(|i| ((i % 50) * 400) as i16).collect();
    let mut r = Resampler::new(22_050, 8000).expect("resampler");
    let t = Instant::now();
    let mut out = Vec::new();
    for _ in 0..5 {
        r.push(&tone, &mut out);
        r.finish(&mut out);
    }
    let resample_ms = t.elapsed().as_secs_f64() * 1e3 / 5.0;
    println!(
        "over {} syntheses ({audio_total:.1} s of audio): first audio median {:.0} ms, p90 {:.0} \
         ms; RTF median {:.3}, p90 {:.3}; RTF of CPU median {:.3}; this build resamples a second \
         of 22.05 kHz audio in {resample_ms:.1} ms (RTF {:.3} of the above)",
        firsts.len(),
        percentile(&mut firsts, 0.5),
        percentile(&mut firsts, 0.9),
        percentile(&mut rtfs, 0.5),
        percentile(&mut rtfs, 0.9),
        percentile(&mut cpus, 0.5),
        resample_ms / 1000.0
    );
}
