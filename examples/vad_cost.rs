//! Runs the per-call voice detector (`audio::vad`) over a call's caller audio, for counting
//! its instructions under callgrind (load-independent, unlike wall time):
//!
//!     cargo build --release --example vad_cost
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!         target/release/examples/vad_cost call gated
//!
//! `speech` | `silence` | `call` (each clip then 1.5× its length of silence, ~60 % silence);
//! `gated` (the default detector) | `ungated` (every frame scored). Prints the packets fed and
//! the frames the network scored; divide callgrind's total (minus a run with `0` as the third
//! argument, which only loads the audio) by the packets.

use patterd::audio::g711::ulaw_silence;
use patterd::audio::vad::{Vad, VadConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map_or("call", String::as_str);
    let gate = args.get(2).map_or("gated", String::as_str) != "ungated";
    let reps: usize = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(10);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/speech");
    let mut audio = Vec::new();
    for name in ["book_table", "change_booking", "no_tuesday", "yes_please"] {
        let clip = std::fs::read(format!("{dir}/{name}.ulaw")).expect("speech fixture");
        match kind {
            "speech" => audio.extend(&clip),
            "silence" => audio.extend(ulaw_silence(clip.len() as u64 / 8)),
            _ => {
                audio.extend(&clip);
                audio.extend(ulaw_silence(clip.len() as u64 / 8 * 3 / 2));
            }
        }
    }
    audio.truncate(audio.len() / 160 * 160);
    let cfg = VadConfig {
        gate,
        ..VadConfig::default()
    };
    let (mut packets, mut scored, mut events) = (0, 0, 0);
    for _ in 0..reps {
        let mut v = Vad::new(cfg);
        for packet in audio.chunks(160) {
            events += v.push_ulaw(std::hint::black_box(packet)).len();
            packets += 1;
        }
        scored += v.frames_scored();
    }
    println!("{kind} gate={gate}: {packets} packets, {scored} frames scored, {events} events");
}
