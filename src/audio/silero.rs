//! Silero VAD v6 at 8 kHz through tract (cargo feature `silero`, `vad_engine = "silero"`): the
//! model is `models/silero/silero_vad_8k.onnx`, derived offline from the MIT `silero-vad` 6.2.3
//! wheel with its `If` nodes replaced by the 8 kHz branches (models/silero/NOTES.md), compiled
//! into the binary. It is loaded and optimised once per process into a plan every call shares;
//! each call owns only its LSTM state and the last 32 samples, which precede the next 256 as
//! context (a 32 ms window costs ~30 µs; see the design note).

use std::sync::{Arc, OnceLock};

use tract_onnx::prelude::*;

/// New samples per window (8 kHz).
pub const WINDOW: usize = 256;
/// Audio milliseconds per window.
pub const WINDOW_MS: u64 = 32;
/// Samples of the previous window fed before the new ones.
const CONTEXT: usize = 32;
const STATE: usize = 2 * 128;

static MODEL_BYTES: &[u8] = include_bytes!("../../models/silero/silero_vad_8k.onnx");

type Plan = Arc<TypedRunnableModel>;

fn load() -> TractResult<Plan> {
    let model = tract_onnx::onnx()
        .model_for_read(&mut std::io::Cursor::new(MODEL_BYTES))?
        .with_input_fact(
            0,
            InferenceFact::dt_shape(f32::datum_type(), tvec!(1, CONTEXT + WINDOW)),
        )?
        .with_input_fact(
            1,
            InferenceFact::dt_shape(f32::datum_type(), tvec!(2, 1, 128)),
        )?
        .into_optimized()?
        .into_runnable()?;
    Ok(model)
}

/// The shared plan; `None` if the embedded model failed to load (logged once; calls then
/// score every window 0).
fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| match load() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!(error = %e, "the built-in Silero VAD model did not load; voice detection is off");
            None
        }
    })
    .as_ref()
}

/// One call's Silero state.
pub struct Silero {
    state: Vec<f32>,
    input: Vec<f32>,
}

impl Default for Silero {
    fn default() -> Self {
        Self::new()
    }
}

impl Silero {
    pub fn new() -> Self {
        Self {
            state: vec![0.0; STATE],
            input: vec![0.0; CONTEXT + WINDOW],
        }
    }

    /// Loads the shared model now (it is otherwise loaded by the first window).
    pub fn warm_up() -> bool {
        plan().is_some()
    }

    /// The speech probability of the next 256 samples (8 kHz PCM16).
    pub fn predict(&mut self, window: &[i16; WINDOW]) -> f32 {
        self.input.copy_within(WINDOW.., 0);
        for (d, &s) in self.input[CONTEXT..].iter_mut().zip(window) {
            *d = f32::from(s) / 32768.0;
        }
        let Some(plan) = plan() else { return 0.0 };
        match self.run(plan) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "Silero VAD window failed; scored as silence");
                0.0
            }
        }
    }

    fn run(&mut self, plan: &Plan) -> TractResult<f32> {
        let input = Tensor::from_shape(&[1, CONTEXT + WINDOW], &self.input)?;
        let state = Tensor::from_shape(&[2, 1, 128], &self.state)?;
        let out = plan.run(tvec!(input.into(), state.into()))?;
        let p = out[0]
            .to_plain_array_view::<f32>()?
            .iter()
            .next()
            .copied()
            .unwrap_or_default();
        let state = out[1].to_plain_array_view::<f32>()?;
        for (d, s) in self.state.iter_mut().zip(state.iter()) {
            *d = *s;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::g711::ulaw_to_linear;
    use crate::audio::vad::{Vad, VadConfig, VadEngine, VadEvent};

    fn book_table() -> Vec<i16> {
        let path = format!(
            "{}/tests/fixtures/speech/book_table.ulaw",
            env!("CARGO_MANIFEST_DIR")
        );
        let ulaw = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        ulaw.into_iter().map(ulaw_to_linear).collect()
    }

    /// tract on the derived model against onnxruntime on the original (models/silero/expected.py).
    #[test]
    fn tract_matches_onnxruntime_on_the_original_model() {
        let expected: Vec<f32> = include_str!("../../models/silero/expected_book_table.txt")
            .lines()
            .map(|l| l.trim().parse().expect("a probability per line"))
            .collect();
        let mut audio = vec![0i16; 4000];
        audio.extend(book_table());
        audio.extend(vec![0i16; 8000]);
        audio.truncate(audio.len() / WINDOW * WINDOW);
        let mut s = Silero::new();
        let got: Vec<f32> = audio
            .chunks_exact(WINDOW)
            .map(|w| s.predict(w.try_into().expect("256 samples")))
            .collect();
        assert_eq!(got.len(), expected.len());
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "largest difference {worst}");
        assert!(expected.iter().any(|p| *p > 0.9));
    }

    #[test]
    fn the_silero_engine_finds_the_speech_and_not_the_silence() {
        let mut v = Vad::new(VadConfig {
            engine: VadEngine::Silero,
            ..VadConfig::default()
        });
        let mut audio = crate::audio::g711::ulaw_silence(500);
        let clip_ms = std::fs::metadata(format!(
            "{}/tests/fixtures/speech/book_table.ulaw",
            env!("CARGO_MANIFEST_DIR")
        ))
        .map(|m| m.len() / 8)
        .unwrap_or_default();
        audio.extend(
            std::fs::read(format!(
                "{}/tests/fixtures/speech/book_table.ulaw",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap_or_default(),
        );
        audio.extend(crate::audio::g711::ulaw_silence(1000));
        let mut ev = Vec::new();
        for packet in audio.chunks(160) {
            ev.extend(v.push_ulaw(packet));
        }
        let Some(VadEvent::SpeechStart { onset_ms }) = ev.first().copied() else {
            panic!("no speech start: {ev:?}");
        };
        assert!((400..800).contains(&onset_ms), "{ev:?}");
        let Some(VadEvent::SpeechEnd { last_voiced_ms, .. }) = ev.last().copied() else {
            panic!("no speech end: {ev:?}");
        };
        assert!(
            last_voiced_ms + 400 > 500 + clip_ms && last_voiced_ms < 500 + clip_ms + 400,
            "{ev:?}"
        );
        assert!(!v.is_speaking());
    }
}
