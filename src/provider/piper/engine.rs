//! One Piper worker: the voice's onnxruntime session and its own espeak-ng process. A piece of
//! text becomes each clause's phonemes (espeak-ng), the model's ids ([`super::voice`]), one
//! inference (`input` int64 [1, N], `input_lengths` [1], `scales` [noise, length, noise_w]),
//! and float PCM at the voice's rate from `output`, with each word's weight for the timing
//! estimate (the usual Piper export has no durations output, so word timings are estimated
//! from phoneme counts, `local_tts::spread`). Blocking; runs on the blocking pool.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorRef;

use super::espeak::{Espeak, EspeakError};
use super::voice::{Voice, clause_phonemes, word_weights};
use crate::provider::local_tts::{Piece, pieces};

/// Longest wait for espeak-ng's answer about one clause.
const ESPEAK_TIMEOUT: Duration = Duration::from_secs(5);

/// A piece's audio and its words with their weights.
pub(crate) struct PieceAudio {
    pub(crate) samples: Vec<f32>,
    pub(crate) words: Vec<(String, f32)>,
}

/// Why a piece could not be synthesised.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EngineError {
    #[error(transparent)]
    Espeak(#[from] EspeakError),
    #[error("the voice's inference failed: {0}")]
    Inference(String),
}

pub(crate) struct Engine {
    session: Session,
    espeak: Espeak,
    voice: Arc<Voice>,
}

impl Engine {
    /// Loads the model into a session of its own and starts its espeak-ng.
    pub(crate) fn load(
        env: &'static ort::environment::Environment,
        model: &Path,
        voice: Arc<Voice>,
        program: &str,
        threads: usize,
    ) -> Result<Self, String> {
        let err = |e: ort::Error| format!("cannot load the voice {}: {e}", model.display());
        let session = Session::builder(env)
            .map_err(err)?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(|e| err(e.into()))?
            .with_intra_threads(threads)
            .map_err(|e| err(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| err(e.into()))?
            // Threads that spin between runs take a core from other calls on a small machine.
            .with_intra_op_spinning(false)
            .map_err(|e| err(e.into()))?
            .commit_from_file(model)
            .map_err(err)?;
        let espeak = Espeak::start(program, &voice.espeak_voice, ESPEAK_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let mut engine = Self {
            session,
            espeak,
            voice,
        };
        // The first run of a session is several times slower (allocations, kernel choice):
        // spend it here, where it also proves the model, rather than on a caller's greeting.
        let length_scale = engine.voice.length_scale;
        for piece in pieces("Hello there.") {
            let audio = engine
                .synthesize(&piece, length_scale)
                .map_err(|e| format!("the voice {} failed its first run: {e}", model.display()))?;
            if audio.samples.is_empty() {
                return Err(format!(
                    "the voice {} said nothing on its first run",
                    model.display()
                ));
            }
        }
        Ok(engine)
    }

    /// The audio of `piece` (empty when it holds nothing to say), at `length_scale`.
    pub(crate) fn synthesize(
        &mut self,
        piece: &Piece,
        length_scale: f32,
    ) -> Result<PieceAudio, EngineError> {
        let mut phonemes = String::new();
        let mut words = Vec::new();
        for clause in &piece.clauses {
            let lines = self.espeak.phonemize(&clause.text)?;
            let said = clause_phonemes(&lines, clause.terminator);
            let texts: Vec<&str> = clause.words().collect();
            let weights = word_weights(&self.voice, &texts, &said);
            words.extend(texts.iter().map(|w| w.to_string()).zip(weights));
            phonemes.push_str(&said);
        }
        let (ids, missing) = self.voice.ids(phonemes.trim_end());
        if missing > 0 {
            tracing::debug!(missing, "phonemes the voice has no id for were dropped");
        }
        if !self.voice.has_phonemes(&ids) {
            return Ok(PieceAudio {
                samples: Vec::new(),
                words,
            });
        }
        let samples = self.infer(&ids, length_scale)?;
        Ok(PieceAudio { samples, words })
    }

    fn infer(&mut self, ids: &[i64], length_scale: f32) -> Result<Vec<f32>, EngineError> {
        let fail = |e: ort::Error| EngineError::Inference(e.to_string());
        let lengths = [ids.len() as i64];
        let scales = [self.voice.noise_scale, length_scale, self.voice.noise_w];
        let input = TensorRef::from_array_view(([1usize, ids.len()], ids)).map_err(fail)?;
        let input_lengths = TensorRef::from_array_view(([1usize], &lengths[..])).map_err(fail)?;
        let scales = TensorRef::from_array_view(([3usize], &scales[..])).map_err(fail)?;
        let outputs = self
            .session
            .run(ort::inputs![
                "input" => input,
                "input_lengths" => input_lengths,
                "scales" => scales,
            ])
            .map_err(fail)?;
        let (_, audio) = outputs["output"]
            .try_extract_tensor::<f32>()
            .map_err(fail)?;
        Ok(audio.to_vec())
    }
}
