//! Speech and language providers behind one small trait each: [`SttProvider`] (a streaming
//! speech-to-text session), [`TtsProvider`] (text to μ-law 8 kHz audio) and [`LlmProvider`]
//! (a streamed chat turn). One file per vendor; the call actor only sees these traits and the
//! events they produce. A stream is cancelled by dropping it.

pub mod chunker;

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::util::TaskGuard;

// ---------------------------------------------------------------- speech to text

/// What the call actor feeds a speech-to-text session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SttInput {
    /// Caller audio, μ-law 8 kHz (one carrier frame).
    Audio(Bytes),
    /// Flush: we decided the caller is done; return finals now.
    Finalize,
    /// Graceful end of the session (hang-up).
    Close,
}

/// What a speech-to-text session reports.
#[derive(Debug, Clone, PartialEq)]
pub enum SttEvent {
    /// The provider accepted the session (handshake done).
    Connected,
    /// The provider heard speech begin (a hint only).
    SpeechStarted,
    /// A partial transcript that later results replace.
    Interim(String),
    /// A stable segment. `speech_final` marks the provider's end of utterance.
    Final {
        text: String,
        speech_final: bool,
        from_finalize: bool,
    },
    /// The provider's word-gap end-of-utterance signal.
    UtteranceEnd,
    /// Something went wrong; `fatal` means the session is gone.
    Error { message: String, fatal: bool },
    /// The session ended.
    Closed,
}

/// An open (or opening) speech-to-text session. Audio sent before the handshake finishes is
/// queued. Dropping it closes the session.
pub struct SttStream {
    pub input: mpsc::Sender<SttInput>,
    pub events: mpsc::Receiver<SttEvent>,
    pub guard: TaskGuard,
}

/// Facts about the call a speech-to-text session may use.
#[derive(Debug, Clone, Default)]
pub struct SttContext {
    pub call_id: String,
}

pub trait SttProvider: Send + Sync {
    /// Starts opening a session at once (without waiting for the handshake).
    fn open(&self, ctx: &SttContext) -> SttStream;
}

// ---------------------------------------------------------------- text to speech

/// What a synthesis reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TtsEvent {
    /// μ-law 8 kHz audio, any length.
    Audio(Bytes),
    /// All audio for this text has been delivered.
    Done,
    /// The synthesis failed; no more audio follows.
    Error(String),
}

/// One text's synthesis in progress. Dropping it cancels the request.
pub struct TtsStream {
    pub events: mpsc::Receiver<TtsEvent>,
    pub guard: TaskGuard,
}

pub trait TtsProvider: Send + Sync {
    /// Starts synthesising `text` as μ-law 8 kHz.
    fn synthesize(&self, text: &str) -> TtsStream;
}

// ---------------------------------------------------------------- language model

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

/// One turn to send to the brain.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    /// The carrier's call id; Hermes' session id is derived from it.
    pub call_id: String,
    /// The caller's E.164 number, when known (for `session_key_from = "caller_hash"`).
    pub caller: Option<String>,
    pub system_prompt: String,
    /// The conversation so far, ending with the new caller message. A stateless brain gets it
    /// all; Hermes keeps its own transcript and gets only the last message.
    pub history: Vec<ChatMessage>,
}

/// What a streamed chat turn reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmEvent {
    /// Speakable reply text.
    Delta(String),
    /// The brain is running a tool (Hermes `hermes.tool.progress`); never spoken as such.
    ToolProgress(String),
    /// The reply is complete.
    Done,
    /// The turn failed; nothing from the error is ever spoken.
    Error(String),
}

/// A chat turn in flight. Dropping it drops the HTTP stream (cancels the turn).
pub struct LlmStream {
    pub events: mpsc::Receiver<LlmEvent>,
    pub guard: TaskGuard,
}

pub trait LlmProvider: Send + Sync {
    fn stream(&self, turn: ChatTurn) -> LlmStream;
}

/// The providers an agent uses, resolved from the configuration.
#[derive(Clone)]
pub struct AgentProviders {
    pub stt: Arc<dyn SttProvider>,
    pub tts: Arc<dyn TtsProvider>,
    pub llm: Arc<dyn LlmProvider>,
}
