//! Checks of the `[tts.NAME]` kinds that run on this machine (`piper`, `flite`): the feature
//! compiled in, the voice, its JSON and onnxruntime present, the program on `PATH`, the numbers
//! in range; and the keys of those kinds refused on the others.

use std::path::Path;

use super::Check;
use crate::config::schema::{TtsConfig, TtsKind};
use crate::util::find_program;

/// How an operator gets Piper's files (docs/providers.md, "Local TTS: Piper and flite").
const PIPER_SETUP: &str = "run scripts/setup/piper.sh, which installs espeak-ng and the \
     en_US-joe-medium voice (docs/providers.md, \"Local TTS: Piper and flite\")";

/// flite's built-in voices; anything else must be a `.flitevox` file (flite would also fetch
/// a URL, which patterd never lets it do).
pub(crate) const FLITE_VOICES: &[&str] = &["kal", "kal16", "awb", "awb_time", "rms", "slt"];

pub(super) fn check(c: &mut Check<'_>, name: &str, tts: &TtsConfig) {
    match tts.kind {
        TtsKind::Piper => piper(c, name, tts),
        TtsKind::Flite => flite(c, name, tts),
        _ => {
            for (key, set) in [
                ("voice_path", tts.voice_path.is_some()),
                ("library", tts.library.is_some()),
                ("program", tts.program.is_some()),
                ("threads", tts.threads.is_some()),
                ("workers", tts.workers.is_some()),
            ] {
                if set {
                    c.fail(
                        &["tts", name, key],
                        format!(
                            "[tts.{name}] {key} is for kind = \"piper\" or \"flite\" (engines run \
                             on this machine); remove it"
                        ),
                    );
                }
            }
        }
    }
    if tts.kind.is_local() {
        if !tts.base_url.is_empty() {
            c.fail(
                &["tts", name, "base_url"],
                format!(
                    "[tts.{name}] kind = \"{}\" runs on this machine and has no base_url; remove it",
                    tts.kind.as_str()
                ),
            );
        }
        if let Some(speed) = tts.speed
            && !(speed.is_finite() && (0.5..=2.0).contains(&speed))
        {
            c.fail(
                &["tts", name, "speed"],
                format!("[tts.{name}] speed = {speed} must be 0.5–2.0 (1.0: the voice's own pace)"),
            );
        }
        if let Some(w) = tts.workers
            && !(1..=16).contains(&w)
        {
            c.fail(
                &["tts", name, "workers"],
                format!("[tts.{name}] workers = {w} must be 1–16"),
            );
        }
    }
}

fn piper(c: &mut Check<'_>, name: &str, tts: &TtsConfig) {
    if !cfg!(feature = "piper") {
        c.fail(
            &["tts", name, "kind"],
            format!(
                "[tts.{name}] kind = \"piper\" needs a patterd built with the cargo feature \
                 `piper` (cargo build --release --features piper); use another kind \
                 (\"flite\" runs here too) or rebuild"
            ),
        );
        return;
    }
    let voice = tts.piper_voice();
    if !voice.is_file() {
        c.fail(
            &["tts", name, "voice_path"],
            format!(
                "[tts.{name}] voice_path = {:?} is not a file; {PIPER_SETUP}",
                voice.display().to_string()
            ),
        );
    } else if !crate::config::schema::piper_voice_json(&voice).is_file() {
        c.fail(
            &["tts", name, "voice_path"],
            format!(
                "[tts.{name}] voice_path = {:?} has no {:?} beside it (the voice's settings and \
                 phoneme map); {PIPER_SETUP}",
                voice.display().to_string(),
                crate::config::schema::piper_voice_json(&voice)
                    .display()
                    .to_string()
            ),
        );
    }
    let library = tts.onnxruntime_library();
    if !library.is_file() {
        c.fail(
            &["tts", name, "library"],
            format!(
                "[tts.{name}] library = {:?} is not a file; point it at libonnxruntime.so.1.32.0 \
                 from the onnxruntime 1.32.0 wheel (tests/models/setup.sh installs it)",
                library.display().to_string()
            ),
        );
    }
    let program = tts.program_or("espeak-ng");
    if find_program(&program).is_none() {
        c.fail(
            &["tts", name, "program"],
            format!(
                "[tts.{name}] needs the espeak-ng program for phonemes, and {program:?} is not \
                 found; install it (`apt-get install espeak-ng`) or set program to its path"
            ),
        );
    }
    if let Some(t) = tts.threads
        && !(1..=16).contains(&t)
    {
        c.fail(
            &["tts", name, "threads"],
            format!("[tts.{name}] threads = {t} must be 1–16"),
        );
    }
    if !tts.voice_id.is_empty() || !tts.model.is_empty() {
        c.fail(
            &["tts", name, if tts.model.is_empty() { "voice_id" } else { "model" }],
            format!("[tts.{name}] kind = \"piper\" takes its voice from voice_path; remove voice_id and model"),
        );
    }
}

fn flite(c: &mut Check<'_>, name: &str, tts: &TtsConfig) {
    let program = tts.program_or("flite");
    if find_program(&program).is_none() {
        c.fail(
            &["tts", name, "program"],
            format!(
                "[tts.{name}] kind = \"flite\" runs the flite program, and {program:?} is not \
                 found; install it (`apt-get install flite`) or set program to its path"
            ),
        );
    }
    let voice = tts.voice_id.as_str();
    let built_in = FLITE_VOICES.contains(&voice);
    let voice_file = voice.ends_with(".flitevox") && Path::new(voice).is_file();
    if !(built_in || voice_file) {
        c.fail(
            &["tts", name, "voice_id"],
            format!(
                "[tts.{name}] voice_id = {voice:?} is neither a flite voice ({}) nor a .flitevox \
                 file",
                FLITE_VOICES.join(", ")
            ),
        );
    }
    if tts.threads.is_some() || tts.voice_path.is_some() || tts.library.is_some() {
        c.fail(
            &["tts", name, "kind"],
            format!(
                "[tts.{name}] voice_path, library and threads are for kind = \"piper\"; remove \
                 them (flite's voice is voice_id)"
            ),
        );
    }
}
