//! The beep detector on synthetic tones (the common machine frequencies, levels and lengths,
//! in noise), and on what must never be a beep: every speech, laughter, cough and noise clip of
//! the test fixtures, DTMF, short blips and endless tones.

use super::*;
use crate::audio::g711::linear_to_ulaw;

/// A sine of `freq` Hz, `ms` long, peaking at `peak_dbfs`, as PCM in ±1.
fn tone(freq: f32, ms: u64, peak_dbfs: f32) -> Vec<f32> {
    let a = 10f32.powf(peak_dbfs / 20.0);
    (0..ms as usize * 8)
        .map(|i| a * (2.0 * std::f32::consts::PI * freq * i as f32 / 8000.0).sin())
        .collect()
}

fn silence(ms: u64) -> Vec<f32> {
    vec![0.0; ms as usize * 8]
}

/// White noise at `rms_dbfs`, from a fixed seed.
fn noise(ms: u64, rms_dbfs: f32, seed: u32) -> Vec<f32> {
    let mut s = seed.max(1);
    let a = 10f32.powf(rms_dbfs / 20.0) * 3f32.sqrt();
    (0..ms as usize * 8)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            a * (s as f32 / u32::MAX as f32 * 2.0 - 1.0)
        })
        .collect()
}

fn ulaw(x: &[f32]) -> Vec<u8> {
    x.iter()
        .map(|v| linear_to_ulaw((v * 32767.0).clamp(-32768.0, 32767.0) as i16))
        .collect()
}

fn mix(a: &[f32], b: &[f32]) -> Vec<f32> {
    (0..a.len().max(b.len()))
        .map(|i| a.get(i).unwrap_or(&0.0) + b.get(i).unwrap_or(&0.0))
        .collect()
}

/// Every beep the detector reports over `audio` pushed in 20 ms frames, with the audio time
/// (ms) of the frame that reported it.
fn beeps(audio: &[u8]) -> Vec<(Beep, u64)> {
    let mut d = BeepDetector::new();
    let mut out = Vec::new();
    for frame in audio.chunks(160) {
        if let Some(b) = d.push_ulaw(frame) {
            out.push((b, d.audio_ms()));
        }
    }
    out
}

/// 500 ms of silence, the tone, 1 s of silence.
fn lone(freq: f32, ms: u64, peak_dbfs: f32) -> Vec<f32> {
    [silence(500), tone(freq, ms, peak_dbfs), silence(1000)].concat()
}

#[test]
fn machine_beeps_are_found_after_they_end() {
    for freq in [
        440.0, 850.0, 950.0, 1000.0, 1250.0, 1400.0, 1500.0, 1700.0, 2100.0,
    ] {
        for peak in [-6.0, -12.0, -20.0, -30.0] {
            for ms in [120, 250, 500, 1000, 2000] {
                let found = beeps(&ulaw(&lone(freq, ms, peak)));
                let case = format!("{freq} Hz {peak} dBFS {ms} ms: {found:?}");
                assert_eq!(found.len(), 1, "{case}");
                let (b, at) = found[0];
                let end = 500 + ms;
                assert!(at > end && at <= end + 60, "reported at {at} ms: {case}");
                assert!(b.freq_hz.abs_diff(freq as u32) <= BIN_STEP_HZ, "{case}");
                assert!(b.end_ms.abs_diff(end) <= 12, "{case}");
                assert!(b.start_ms.abs_diff(500) <= 12, "{case}");
                assert!((b.level_db - (peak - 3.0)).abs() < 1.5, "{case}");
            }
        }
    }
}

#[test]
fn a_beep_in_noise_is_found() {
    for (freq, snr) in [
        (1000.0, 20.0),
        (1400.0, 15.0),
        (1000.0, 10.0),
        (1700.0, 10.0),
    ] {
        let beep = lone(freq, 400, -12.0);
        let audio = mix(&beep, &noise(1900, -15.0 - snr, 7));
        let found = beeps(&ulaw(&audio));
        assert_eq!(found.len(), 1, "{freq} Hz at {snr} dB: {found:?}");
        assert!(found[0].1 > 900, "{found:?}");
    }
}

#[test]
fn the_frame_split_does_not_change_the_answer() {
    let audio = ulaw(&lone(1400.0, 300, -12.0));
    let whole = BeepDetector::new().push_ulaw(&audio);
    let mut d = BeepDetector::new();
    let mut odd = None;
    for chunk in audio.chunks(37) {
        odd = odd.or(d.push_ulaw(chunk));
    }
    assert!(whole.is_some());
    assert_eq!(whole, odd);
}

#[test]
fn blips_endless_tones_and_dtmf_are_not_beeps() {
    // Too short: a 60 ms blip.
    assert!(beeps(&ulaw(&lone(1000.0, 60, -12.0))).is_empty());
    // Too quiet.
    assert!(beeps(&ulaw(&lone(1000.0, 500, -50.0))).is_empty());
    // Out of band.
    assert!(beeps(&ulaw(&lone(3000.0, 500, -12.0))).is_empty());
    assert!(beeps(&ulaw(&lone(200.0, 500, -12.0))).is_empty());
    // A tone that never stops (6 s, then silence): a dial tone, not the end of a greeting.
    assert!(beeps(&ulaw(&lone(1000.0, 6000, -12.0))).is_empty());
    // DTMF and the North American ringback and dial tones: two tones at once.
    for (lo, hi, ms) in [
        (697.0, 1209.0, 400),
        (941.0, 1477.0, 400),
        (440.0, 480.0, 2000),
        (350.0, 440.0, 2000),
    ] {
        let pair = mix(&tone(lo, ms, -12.0), &tone(hi, ms, -10.0));
        let audio = [silence(500), pair, silence(1000)].concat();
        assert!(beeps(&ulaw(&audio)).is_empty(), "{lo}+{hi} Hz");
    }
    // A tone whose level slides by 20 dB (a swell, not a beep).
    let a: Vec<f32> = tone(1000.0, 800, -6.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 10f32.powf(-(i as f32 / 6400.0) * 20.0 / 20.0))
        .collect();
    assert!(beeps(&ulaw(&[silence(500), a, silence(1000)].concat())).is_empty());
}

#[test]
fn two_beeps_are_two() {
    let audio = [
        silence(300),
        tone(1000.0, 300, -12.0),
        silence(400),
        tone(1400.0, 500, -12.0),
        silence(500),
    ]
    .concat();
    let found = beeps(&ulaw(&audio));
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].0.freq_hz, 1000);
    assert_eq!(found[1].0.freq_hz, 1400);
}

#[test]
fn a_frequency_jump_without_a_gap_ends_the_first_tone() {
    let audio = [
        silence(300),
        tone(1000.0, 300, -12.0),
        tone(1400.0, 300, -12.0),
        silence(500),
    ]
    .concat();
    let found = beeps(&ulaw(&audio));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].1 >= 600 && found[0].1 <= 650, "{found:?}");
}

/// Every clip of `tests/fixtures/{speech,suite,voicemail}`: speech of many voices and rates
/// (espeak-ng and human readers), laughter, coughs, babble, street and café noise.
#[test]
fn no_speech_or_noise_fixture_holds_a_beep() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut checked = 0;
    for dir in ["speech", "suite", "voicemail"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "ulaw") {
                continue;
            }
            let audio = std::fs::read(&path).expect("fixture");
            let found = beeps(&audio);
            assert!(found.is_empty(), "{}: {found:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} fixtures");
}
