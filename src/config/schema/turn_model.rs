//! `[turn_model.NAME]`: an end-of-turn model agents can use (`[agents.X] turn_model = "NAME"`),
//! judging the caller's pauses from their last 8 s of audio (docs/configuration.md, "Smart
//! Turn"). The one kind is `smart_turn` (Smart Turn v3.2 through onnxruntime, cargo feature
//! `smart_turn`): the operator supplies the onnxruntime library and the model file.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnModelKind {
    /// pipecat's Smart Turn v3.2 (`smart-turn-v3.2-cpu.onnx`).
    SmartTurn,
}

/// `[turn_model.NAME]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnModelConfig {
    pub kind: TurnModelKind,
    /// Path to `libonnxruntime.so` (1.32 or newer), e.g. from the `onnxruntime` 1.32.0 wheel.
    pub library: PathBuf,
    /// Path to the model, e.g. `smart-turn-v3.2-cpu.onnx` from the `pipecat-ai` 1.14.0 wheel.
    pub model: PathBuf,
    /// A probability of at least this says the turn is complete.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Pauses that may wait for the one inference thread; more are judged by silence.
    #[serde(default = "default_queue")]
    pub queue: u64,
    /// Longest a call waits for the model's answer before silence decides the pause.
    #[serde(default = "default_answer_timeout_ms")]
    pub answer_timeout_ms: u64,
    /// After "complete" and `min_endpointing_ms`, longest wait for the speech-to-text's final
    /// words before the turn is committed with what there is.
    #[serde(default = "default_finalize_grace_ms")]
    pub(crate) finalize_grace_ms: u64,
    /// Silence after the caller's speech a pause judged "incomplete" is held before the
    /// silence rules decide it (at most `max_endpointing_ms`; a phrase that looks unfinished
    /// still waits `unfinished_hold_ms`).
    #[serde(default = "default_incomplete_hold_ms")]
    pub incomplete_hold_ms: u64,
}

fn default_threshold() -> f64 {
    0.5
}

fn default_queue() -> u64 {
    4
}

fn default_answer_timeout_ms() -> u64 {
    250
}

fn default_finalize_grace_ms() -> u64 {
    200
}

fn default_incomplete_hold_ms() -> u64 {
    1500
}
