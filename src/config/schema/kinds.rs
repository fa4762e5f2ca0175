//! The registration lists of the provider kinds, as `carriers!` is for carriers: one entry per
//! `kind = "..."` of `[stt.NAME]` ([`stt_kinds!`]), `[tts.NAME]` ([`tts_kinds!`]) and
//! `[llm.NAME]` ([`llm_kinds!`]). An entry is the kind's variant, its name in `patter.toml`
//! (also its metrics label), its defaults, and the provider type under `src/provider/` that
//! serves it.
//!
//! Each list is a macro that hands its entries to a callback, so every layer expands the same
//! list into what it owns: here the kind enums (`SttKind`, `TtsKind`, `LlmKind`: serde's
//! `kind` mapping, `ALL`, `as_str` and the per-kind defaults); in `provider::kinds` the build of
//! each provider and the doctor's credential request; `app::metrics` labels by `as_str`. The
//! provider types are only names here: they resolve where `provider::kinds` expands the list,
//! so `config` still imports nothing of `provider`.

/// Speech-to-text kinds: `Variant = "kind" { url: default base_url, model: default model
/// (empty: required), key: required | optional } => provider type (under `provider/`)`.
macro_rules! stt_kinds {
    ($then:ident) => {
        $then! {
            Deepgram = "deepgram" { url: "wss://api.deepgram.com", model: "nova-3", key: required } => deepgram::DeepgramStt,
            /// Deepgram Flux (`/v2/listen`): the model ends turns (`EndOfTurn`), optionally early
            /// (`EagerEndOfTurn`, a speculative brain request).
            DeepgramFlux = "deepgram_flux" { url: "wss://api.deepgram.com", model: "flux-general-en", key: required } => deepgram_flux::DeepgramFluxStt,
            /// Per-utterance file transcription (`POST {base_url}/audio/transcriptions`): OpenAI,
            /// speaches / faster-whisper, whisper.cpp's server (speaches' default address).
            OpenaiCompatible = "openai_compatible" { url: "http://127.0.0.1:8000/v1", model: "", key: optional } => openai_stt::OpenAiFileStt,
            /// AssemblyAI Universal-Streaming v3 (`/v3/ws`): the model ends turns (`Turn` with
            /// `end_of_turn`), steered by `eot_threshold` and `eot_timeout_ms`.
            Assemblyai = "assemblyai" { url: "wss://streaming.assemblyai.com", model: "universal-streaming-english", key: required } => assemblyai::AssemblyAiStt,
            /// OpenAI Realtime transcription (`/v1/realtime?intent=transcription`): μ-law in, the
            /// server's VAD (or our `Finalize` as a commit) segments, each item's final transcript.
            OpenaiRealtime = "openai_realtime" { url: "wss://api.openai.com/v1", model: "gpt-4o-transcribe", key: required } => openai_realtime::OpenAiRealtimeStt,
            /// Whisper in-process (whisper.cpp, cargo feature `whisper`): our VAD cuts each
            /// utterance, a bounded pool of decoder threads transcribes it (`model_path`).
            Whisper = "whisper" { url: "", model: "tiny.en", key: optional } => whisper::WhisperStt,
        }
    };
}
pub(crate) use stt_kinds;

/// Text-to-speech kinds: `Variant = "kind" { voice, model, url: the defaults of `voice_id`,
/// `model`, `base_url`; key: required | optional } => provider type`. The first is the default.
/// `url: ""` marks an engine that runs on this machine (no service, no key, no URL).
macro_rules! tts_kinds {
    ($then:ident) => {
        $then! {
            Elevenlabs = "elevenlabs" { voice: "EXAVITQu4vr4xnSDxMaL", model: "eleven_flash_v2_5", url: "https://api.elevenlabs.io", key: required } => elevenlabs::ElevenLabsTts,
            /// OpenAI `POST /v1/audio/speech`, 24 kHz PCM resampled to 8 kHz.
            Openai = "openai" { voice: "alloy", model: "gpt-4o-mini-tts", url: "https://api.openai.com/v1", key: required } => openai_speech::OpenAiSpeech,
            /// Kokoro-FastAPI / speaches `POST /v1/audio/speech` (self-hosted), resampled like `openai`.
            OpenaiCompatible = "openai_compatible" { voice: "af_heart", model: "kokoro", url: "http://127.0.0.1:8880/v1", key: optional } => openai_speech::OpenAiSpeech,
            /// Cartesia Sonic over its WebSocket, μ-law 8 kHz.
            Cartesia = "cartesia" { voice: "a0e99841-438c-4a64-b679-ae501e7d6091", model: "sonic-3", url: "wss://api.cartesia.ai", key: required } => cartesia::CartesiaTts,
            /// A Piper voice run here (cargo feature `piper`): phonemes from the `espeak-ng`
            /// program, the voice on onnxruntime, 22.05 kHz resampled to μ-law 8 kHz.
            Piper = "piper" { voice: "", model: "", url: "", key: optional } => piper::PiperTts,
            /// CMU flite run here (the `flite` program), 16 kHz resampled to μ-law 8 kHz.
            Flite = "flite" { voice: "rms", model: "", url: "", key: optional } => flite::FliteTts,
        }
    };
}
pub(crate) use tts_kinds;

/// Brain kinds: `Variant = "kind" { url: default base_url (a preset's comes first), model:
/// default model (empty: required), timeout_s: default whole-turn budget } => provider type`.
macro_rules! llm_kinds {
    ($then:ident) => {
        $then! {
            /// Hermes' API server on 8642 (tools run, so a longer turn budget).
            Hermes = "hermes" { url: "http://127.0.0.1:8642/v1", model: "hermes-agent", timeout_s: 120 } => openai::OpenAiChat,
            OpenaiCompatible = "openai_compatible" { url: "http://127.0.0.1:8642/v1", model: "", timeout_s: 60 } => openai::OpenAiChat,
            /// OpenClaw's Gateway on 18789 (its `/v1/chat/completions`,
            /// docs.openclaw.ai/gateway/openai-http-api; served by the OpenAI-compatible client),
            /// its default agent `openclaw:main`.
            Openclaw = "openclaw" { url: "http://127.0.0.1:18789/v1", model: "openclaw:main", timeout_s: 60 } => openai::OpenAiChat,
        }
    };
}
pub(crate) use llm_kinds;

/// Shared by the enum callbacks: the enum, serde's `kind` names, `ALL` and `as_str`.
macro_rules! kind_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $kind:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $kind)] $variant),+
        }

        impl $name {
            /// Every kind, in the order of its registration list.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The `kind = "..."` name (also the kind's metrics label).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $kind),+
                }
            }
        }
    };
}

macro_rules! stt_kind_enum {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal {
        url: $url:literal, model: $model:literal, key: $key:ident
    } => $($imp:ident)::+),+ $(,)?) => {
        kind_enum!(
            /// `[stt.NAME] kind` (the `stt_kinds!` list).
            SttKind { $($(#[$vm])* $variant = $kind),+ }
        );

        impl SttKind {
            /// `base_url` when the table leaves it out.
            pub fn default_base_url(self) -> &'static str {
                match self {
                    $(SttKind::$variant => $url),+
                }
            }

            /// `model` when the table leaves it out (empty: the table must name one).
            pub fn default_model(self) -> &'static str {
                match self {
                    $(SttKind::$variant => $model),+
                }
            }

            /// Whether the service works without an `api_key` (self-hosted servers).
            pub fn key_optional(self) -> bool {
                match self {
                    $(SttKind::$variant => key_is!($key, optional)),+
                }
            }
        }
    };
}

macro_rules! tts_kind_enum {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal {
        voice: $voice:literal, model: $model:literal, url: $url:literal, key: $key:ident
    } => $($imp:ident)::+),+ $(,)?) => {
        kind_enum!(
            /// `[tts.NAME] kind` (the `tts_kinds!` list; the first is the default).
            TtsKind { $($(#[$vm])* $variant = $kind),+ }
        );

        impl Default for TtsKind {
            fn default() -> Self {
                TtsKind::ALL[0]
            }
        }

        impl TtsKind {
            pub fn default_voice(self) -> &'static str {
                match self {
                    $(TtsKind::$variant => $voice),+
                }
            }
            pub fn default_model(self) -> &'static str {
                match self {
                    $(TtsKind::$variant => $model),+
                }
            }
            pub fn default_base_url(self) -> &'static str {
                match self {
                    $(TtsKind::$variant => $url),+
                }
            }
            /// Whether the service needs an `api_key` (self-hosted servers usually do not).
            pub fn needs_key(self) -> bool {
                match self {
                    $(TtsKind::$variant => key_is!($key, required)),+
                }
            }
            /// Whether the engine runs on this machine rather than behind a URL (`url: ""`).
            pub fn is_local(self) -> bool {
                self.default_base_url().is_empty()
            }
        }
    };
}

macro_rules! llm_kind_enum {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal {
        url: $url:literal, model: $model:literal, timeout_s: $timeout:literal
    } => $($imp:ident)::+),+ $(,)?) => {
        kind_enum!(
            /// `[llm.NAME] kind` (the `llm_kinds!` list).
            LlmKind { $($(#[$vm])* $variant = $kind),+ }
        );

        impl LlmKind {
            /// `base_url` when neither the table nor its preset gives one.
            pub fn default_base_url(self) -> &'static str {
                match self {
                    $(LlmKind::$variant => $url),+
                }
            }
            /// `model` when the table leaves it out (empty: the table must name one).
            pub fn default_model(self) -> &'static str {
                match self {
                    $(LlmKind::$variant => $model),+
                }
            }
            /// `timeout_s` when the table leaves it out.
            pub fn default_timeout_s(self) -> u64 {
                match self {
                    $(LlmKind::$variant => $timeout),+
                }
            }
        }
    };
}

/// `key: required` / `key: optional` as a bool for the asked-for word (anything else fails to
/// compile).
macro_rules! key_is {
    (required, required) => {
        true
    };
    (optional, optional) => {
        true
    };
    (required, optional) => {
        false
    };
    (optional, required) => {
        false
    };
}

stt_kinds!(stt_kind_enum);
tts_kinds!(tts_kind_enum);
llm_kinds!(llm_kind_enum);
