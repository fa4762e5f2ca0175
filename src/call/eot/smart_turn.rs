//! Smart Turn v3.2 (feature `smart_turn`): pipecat's Whisper-tiny based end-of-turn model
//! (BSD-2-Clause, © Daily) run through onnxruntime, which is loaded at run time from the
//! operator's `libonnxruntime.so` (`ort` with `load-dynamic`; nothing is downloaded at build
//! time). Input `input_features` [1, 80, 800] is the Whisper log-mel of the last 8 s
//! ([`crate::audio::whisper_mel`]); output `logits` [1, 1] is already the probability that
//! the turn is complete. One session, one intra-op thread, owned by the worker thread.

use std::path::Path;

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorRef;

use super::{EndOfTurnModel, EotError};
use crate::audio::whisper_mel::{FRAMES, N_MELS, WhisperMel};

/// Loading the library or the model failed.
#[derive(Debug, thiserror::Error)]
pub enum SmartTurnError {
    #[error(
        "cannot load onnxruntime from {path}: {message}; point [turn_model.smart_turn] library \
         at libonnxruntime.so.1.32.0 from the onnxruntime 1.32.0 wheel (docs/configuration.md, \
         \"Smart Turn\")"
    )]
    Library { path: String, message: String },
    #[error("onnxruntime 1.32 was loaded from {loaded}, not {path}: one library per process")]
    OtherLibrary { path: String, loaded: String },
    #[error(
        "cannot load the Smart Turn model {path}: {message}; use smart-turn-v3.2-cpu.onnx from \
         the pipecat-ai 1.14.0 wheel (docs/configuration.md, \"Smart Turn\")"
    )]
    Model { path: String, message: String },
}

fn load_library(path: &Path) -> Result<&'static Environment, SmartTurnError> {
    use crate::util::onnxruntime::{OnnxRuntimeError, environment};
    environment(path).map_err(|e| match e {
        OnnxRuntimeError::Load { path, message } => SmartTurnError::Library { path, message },
        OnnxRuntimeError::OtherLibrary { path, loaded } => {
            SmartTurnError::OtherLibrary { path, loaded }
        }
    })
}

/// The model with its session and feature extractor.
pub struct SmartTurn {
    session: Session,
    mel: WhisperMel,
}

impl SmartTurn {
    /// Loads onnxruntime from `library` (once per process) and the model from `model`.
    pub fn load(library: &Path, model: &Path) -> Result<Self, SmartTurnError> {
        let env = load_library(library)?;
        let err = |e: ort::Error| SmartTurnError::Model {
            path: model.display().to_string(),
            message: e.to_string(),
        };
        let session = Session::builder(env)
            .map_err(err)?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(|e| err(e.into()))?
            .with_intra_threads(1)
            .map_err(|e| err(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| err(e.into()))?
            .commit_from_file(model)
            .map_err(err)?;
        Ok(Self {
            session,
            mel: WhisperMel::new(),
        })
    }

    /// The model's probability for precomputed features (`[N_MELS][FRAMES]`).
    pub fn run_features(&mut self, features: &[f32]) -> Result<f32, EotError> {
        let fail = |e: ort::Error| EotError::Inference(e.to_string());
        let input =
            TensorRef::from_array_view(([1usize, N_MELS, FRAMES], features)).map_err(fail)?;
        let outputs = self
            .session
            .run(ort::inputs!["input_features" => input])
            .map_err(fail)?;
        let (_, p) = outputs["logits"]
            .try_extract_tensor::<f32>()
            .map_err(fail)?;
        p.first()
            .copied()
            .ok_or_else(|| EotError::Inference("the model returned no probability".into()))
    }

    pub fn features(&self, audio: &[f32]) -> Vec<f32> {
        self.mel.features(audio)
    }
}

impl EndOfTurnModel for SmartTurn {
    fn complete_probability(&mut self, audio: &[f32]) -> Result<f32, EotError> {
        let features = self.mel.features(audio);
        self.run_features(&features)
    }
}
