//! The provider sections of `patter.toml`: `[llm.NAME]` brains (kinds, presets), `[stt.NAME]`
//! and `[tts.NAME]` (kinds with their per-kind defaults), and an agent's TTS chain. Re-exported
//! by [`super`] (`config::schema`), whose names the rest of the daemon uses.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use super::kinds::{LlmKind, SttKind, TtsKind};
use crate::util::secret::Secret;

/// `[llm.NAME]`: a brain an agent can use.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    pub kind: LlmKind,
    /// `openai_compatible` only: a local server whose defaults to use (its URL, no key).
    #[serde(default)]
    pub preset: Option<LlmPreset>,
    /// Base URL up to and including `/v1`; `/chat/completions` is appended. Empty: the
    /// kind's or preset's default ([`LlmConfig::effective_base_url`]).
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub api_key: Secret,
    /// Empty: the kind's default ([`LlmConfig::effective_model`]; `openai_compatible` needs one).
    #[serde(default)]
    pub model: String,
    /// Whole-turn budget; defaults to 120 s for Hermes (tools run) and 60 s otherwise.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Budget for the first streamed token; past it the turn fails.
    #[serde(default = "default_first_token_timeout")]
    pub first_token_timeout_s: u64,
    #[serde(default = "default_connect_timeout")]
    pub(crate) connect_timeout_s: u64,
    /// Hermes memory scope: `caller_hash` derives `X-Hermes-Session-Key` from the caller's
    /// number (an HMAC under `session_key_secret`). Mutually exclusive with `session_key`.
    #[serde(default)]
    pub session_key_from: Option<SessionKeyFrom>,
    /// The per-deployment secret of `caller_hash` keys; empty: no per-caller key is sent.
    #[serde(default)]
    pub session_key_secret: Secret,
    /// A fixed `X-Hermes-Session-Key`.
    #[serde(default)]
    pub session_key: Option<String>,
    #[serde(default)]
    pub(crate) temperature: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Send the call's own API token (scope `call`) in `X-Patterd-Call-Token`, for a brain
    /// that acts on the call through patterd's MCP or REST API. Default: true for kind
    /// `hermes`, false otherwise (a hosted model needs no patterd credential).
    #[serde(default)]
    pub send_call_token: Option<bool>,
}

impl LlmConfig {
    /// Whether this brain gets `X-Patterd-Call-Token` ([`Self::send_call_token`]).
    pub fn sends_call_token(&self) -> bool {
        self.send_call_token.unwrap_or(self.kind == LlmKind::Hermes)
    }
}

/// Local OpenAI-compatible servers with known defaults (`[llm.NAME] preset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmPreset {
    /// Ollama's OpenAI-compatible API on its default port 11434.
    Ollama,
    /// vLLM's `vllm serve` on its default port 8000.
    Vllm,
    /// LM Studio's local server on its default port 1234.
    LmStudio,
}

impl LlmConfig {
    /// `base_url`, or the preset's or kind's default: Hermes' API server on 8642, OpenClaw's
    /// Gateway on 18789 (its `/v1/chat/completions`, docs.openclaw.ai/gateway/openai-http-api),
    /// Ollama 11434, vLLM 8000, LM Studio 1234.
    pub(crate) fn effective_base_url(&self) -> &str {
        if !self.base_url.trim().is_empty() {
            return &self.base_url;
        }
        match self.preset {
            Some(LlmPreset::Ollama) => "http://127.0.0.1:11434/v1",
            Some(LlmPreset::Vllm) => "http://127.0.0.1:8000/v1",
            Some(LlmPreset::LmStudio) => "http://127.0.0.1:1234/v1",
            None => self.kind.default_base_url(),
        }
    }

    /// `model`, or the kind's default: `hermes-agent` for Hermes, `openclaw:main` (the
    /// Gateway's default agent) for OpenClaw; empty for `openai_compatible` (required).
    pub fn effective_model(&self) -> &str {
        if !self.model.trim().is_empty() {
            return &self.model;
        }
        self.kind.default_model()
    }

    /// This table with its defaults filled in (what the client is built from).
    pub fn resolved(&self) -> LlmConfig {
        let mut c = self.clone();
        c.base_url = self.effective_base_url().to_string();
        c.model = self.effective_model().to_string();
        c
    }

    pub(crate) fn effective_timeout_s(&self) -> u64 {
        self.timeout_s.unwrap_or(self.kind.default_timeout_s())
    }
}

fn default_first_token_timeout() -> u64 {
    60
}
fn default_connect_timeout() -> u64 {
    10
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKeyFrom {
    CallerHash,
}

/// `[stt.NAME]`: a speech-to-text service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SttConfig {
    pub kind: SttKind,
    #[serde(default)]
    pub api_key: Secret,
    /// Empty: the kind's default ([`SttConfig::effective_model`]).
    #[serde(default)]
    pub model: String,
    #[serde(default = "default_language")]
    pub language: String,
    /// Empty: the kind's default ([`SttConfig::effective_base_url`]).
    #[serde(default)]
    pub base_url: String,
    /// Silence (ms) after which Deepgram marks `speech_final`; for `openai_compatible`, the
    /// silence after which our voice-activity detector cuts the utterance and uploads it.
    #[serde(default = "default_endpointing")]
    pub endpointing_ms: u32,
    /// Word-gap (ms) for Deepgram's `UtteranceEnd`; 0 disables it.
    #[serde(default = "default_utterance_end")]
    pub utterance_end_ms: u32,
    #[serde(default = "default_true")]
    pub smart_format: bool,
    /// Nova-3 key terms to boost (names, products).
    #[serde(default)]
    pub keyterms: Vec<String>,
    /// A `KeepAlive` is sent after this long without audio (Deepgram closes after 10 s).
    #[serde(default = "default_keepalive_ms")]
    pub keepalive_ms: u64,
    /// `deepgram_flux`: end-of-turn confidence that ends a turn (0.5–0.9; Deepgram's default
    /// 0.7 when unset).
    #[serde(default)]
    pub eot_threshold: Option<f32>,
    /// `deepgram_flux`: confidence for an early `EagerEndOfTurn` that starts the brain
    /// speculatively (0.3–0.9, at most `eot_threshold`; unset: no speculation).
    #[serde(default)]
    pub eager_eot_threshold: Option<f32>,
    /// `deepgram_flux`: silence after which a turn ends whatever the model says (500–10000;
    /// Deepgram's default 5000 when unset).
    #[serde(default)]
    pub eot_timeout_ms: Option<u32>,
    /// `whisper`: the whisper.cpp (ggml) model file, e.g. the `PATTERD_WHISPER_MODEL` path
    /// scripts/setup/whisper.sh prints.
    #[serde(default)]
    pub model_path: String,
    /// `whisper`: decoder threads, each decoding one utterance at a time (1–64; unset: one
    /// per core).
    #[serde(default)]
    pub threads: Option<u32>,
    /// `whisper`: utterances that may wait for a busy decoder before one is refused (0–1000;
    /// unset: twice `threads`).
    #[serde(default)]
    pub queue: Option<u32>,
}

fn default_keepalive_ms() -> u64 {
    3000
}

fn default_language() -> String {
    "en".into()
}
fn default_endpointing() -> u32 {
    300
}
fn default_utterance_end() -> u32 {
    1000
}
pub(super) fn default_true() -> bool {
    true
}

impl SttConfig {
    /// `base_url`, or the kind's default.
    pub(crate) fn effective_base_url(&self) -> &str {
        if self.base_url.trim().is_empty() {
            self.kind.default_base_url()
        } else {
            &self.base_url
        }
    }

    /// `model`, or the kind's default.
    pub fn effective_model(&self) -> &str {
        if self.model.trim().is_empty() {
            self.kind.default_model()
        } else {
            &self.model
        }
    }
}

/// `[tts.NAME]`: a text-to-speech service. `voice_id`, `model` and `base_url` left out take
/// the defaults of the `kind` ([`TtsKind::default_voice`] and friends), filled in by
/// [`TtsConfig::fill_kind_defaults`] right after loading.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtsConfig {
    pub kind: TtsKind,
    #[serde(default)]
    pub api_key: Secret,
    #[serde(default)]
    pub voice_id: String,
    #[serde(default)]
    pub model: String,
    /// ElevenLabs and Cartesia: the scheme and host; OpenAI-style: up to and including `/v1`.
    #[serde(default)]
    pub base_url: String,
    /// ElevenLabs `optimize_streaming_latency` (0–4).
    #[serde(default)]
    pub optimize_streaming_latency: Option<u8>,
    #[serde(default)]
    pub speed: Option<f32>,
    /// `openai`: the style prompt (`instructions`, gpt-4o-mini-tts only).
    #[serde(default)]
    pub instructions: Option<String>,
    /// `openai_compatible`: the PCM rate to ask for (speaches' `sample_rate`, 8000–48000). Unset:
    /// nothing is asked and 24 kHz is expected (Kokoro-FastAPI's fixed rate).
    #[serde(default)]
    pub sample_rate: Option<u32>,
    /// `elevenlabs`: `http` (one streaming request per sentence, the default) or `websocket`
    /// (one multi-context socket per call carrying every sentence).
    #[serde(default)]
    pub transport: TtsTransport,
    /// `elevenlabs` and `cartesia`: ask for word timings with the audio (ElevenLabs HTTP
    /// `…/stream/with-timestamps`, Cartesia `add_timestamps`; the ElevenLabs WebSocket sends
    /// them anyway) so an interrupted reply keeps exactly the words the caller heard. `false`:
    /// plain audio, and history keeps whole sentences (docs/conversation.md).
    #[serde(default = "default_true")]
    pub word_timestamps: bool,
    /// `piper`: the voice, an `.onnx` file with its `.onnx.json` beside it. Unset: the voice
    /// scripts/setup/piper.sh installs ([`TtsConfig::piper_voice`]).
    #[serde(default)]
    pub voice_path: Option<PathBuf>,
    /// `piper`: onnxruntime's library (`libonnxruntime.so.1.32.0`, shared with Smart Turn).
    /// Unset: [`TtsConfig::onnxruntime_library`].
    #[serde(default)]
    pub library: Option<PathBuf>,
    /// The program a local kind runs: `piper` its phonemizer (default `espeak-ng`), `flite` the
    /// synthesiser (default `flite`); a bare name is looked up on `PATH`.
    #[serde(default)]
    pub program: Option<String>,
    /// `piper`: onnxruntime threads per synthesis (default 1).
    #[serde(default)]
    pub threads: Option<u32>,
    /// `piper` and `flite`: sentence pieces synthesised at once over every call (default 1
    /// for `piper`, one voice loaded per worker; 2 for `flite`); more wait their turn.
    #[serde(default)]
    pub workers: Option<u32>,
}

/// Where scripts/setup/piper.sh and tests/models/setup.sh put their files:
/// `$PATTERD_MODELS_DIR`, else `~/.cache/patterd-models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PATTERD_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/patterd-models")
}

/// The settings file of a Piper voice: `<voice>.json` beside `<voice>` (`x.onnx.json`).
pub fn piper_voice_json(voice: &std::path::Path) -> PathBuf {
    let mut name = voice.as_os_str().to_os_string();
    name.push(".json");
    PathBuf::from(name)
}

/// A path from the environment variable `var` when set, else `name` in [`models_dir`].
fn installed(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| models_dir().join(name))
}

/// How an `elevenlabs` TTS reaches the vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TtsTransport {
    /// `POST …/stream` per sentence.
    #[default]
    Http,
    /// `…/multi-stream-input`: one socket per call, one context per sentence.
    Websocket,
}

impl TtsConfig {
    /// `piper`'s voice: `voice_path`, else `$PATTERD_PIPER_VOICE`, else
    /// `en_US-joe-medium.onnx` in [`models_dir`] (what scripts/setup/piper.sh installs).
    pub fn piper_voice(&self) -> PathBuf {
        self.voice_path
            .clone()
            .unwrap_or_else(|| installed("PATTERD_PIPER_VOICE", "en_US-joe-medium.onnx"))
    }

    /// onnxruntime's library: `library`, else `$PATTERD_ORT_LIBRARY`, else
    /// `libonnxruntime.so.1.32.0` in [`models_dir`] (what tests/models/setup.sh installs).
    pub fn onnxruntime_library(&self) -> PathBuf {
        self.library
            .clone()
            .unwrap_or_else(|| installed("PATTERD_ORT_LIBRARY", "libonnxruntime.so.1.32.0"))
    }

    /// The program a local kind runs: `program`, else `default`.
    pub fn program_or(&self, default: &str) -> String {
        self.program
            .clone()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| default.to_string())
    }

    /// Fills `voice_id`, `model` and `base_url` left empty with the kind's defaults.
    pub fn fill_kind_defaults(&mut self) {
        if self.voice_id.is_empty() {
            self.voice_id = self.kind.default_voice().into();
        }
        if self.model.is_empty() {
            self.model = self.kind.default_model().into();
        }
        if self.base_url.is_empty() {
            self.base_url = self.kind.default_base_url().into();
        }
    }
}

/// An agent's text-to-speech chain: one `[tts.NAME]` (`tts = "elevenlabs"`) or several tried in
/// order (`tts = ["elevenlabs", "cartesia"]`, docs/configuration.md "Fallback chains").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TtsChain {
    One(String),
    Many(Vec<String>),
}

impl TtsChain {
    /// The names in order (at least one once validated).
    pub fn names(&self) -> &[String] {
        match self {
            TtsChain::One(n) => std::slice::from_ref(n),
            TtsChain::Many(v) => v,
        }
    }
}

impl From<&str> for TtsChain {
    fn from(s: &str) -> Self {
        TtsChain::One(s.to_string())
    }
}
