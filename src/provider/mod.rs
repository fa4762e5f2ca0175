//! Speech and language providers behind one small trait each: [`SttProvider`] (a streaming
//! speech-to-text session), [`TtsProvider`] (text to μ-law 8 kHz audio) and [`LlmProvider`]
//! (a streamed chat turn). One file per vendor; the call actor only sees these traits and the
//! events they produce. A stream is cancelled by dropping it. [`build_providers`] turns the
//! `[stt.*]`, `[tts.*]` and `[llm.*]` tables into shared provider objects, each through its
//! kind's entry in the registration lists (`kinds`).

pub mod alignment;
pub mod assemblyai;
pub mod cartesia;
pub mod chunker;
pub mod deepgram;
pub mod deepgram_flux;
pub mod elevenlabs;
pub mod elevenlabs_ws;
pub mod error;
pub mod fallback;
pub(crate) mod fallback_llm;
pub mod fallback_stt;
pub mod flite;
pub mod history;
pub(crate) mod kinds;
pub(crate) mod local_tts;
#[cfg(test)]
pub(crate) mod memory;
pub mod openai;
pub mod openai_realtime;
pub mod openai_speech;
pub mod openai_stt;
pub mod piper;
pub mod sse;
pub(crate) mod stt_session;
pub mod tools;
pub(crate) mod whisper;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::config::schema::{AgentConfig, Config};
use crate::util::TaskGuard;

pub use alignment::WordTiming;
pub use error::{LlmError, SetupError, TtsError};
pub(crate) use tools::ToolFuture;
pub use tools::{ToolCall, ToolOutput, ToolRunner, ToolSpec, Tools};

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
    /// The provider's turn model thinks the turn probably ended (Deepgram Flux
    /// `EagerEndOfTurn`): the brain may start speculatively on this text.
    EagerEndOfTurn(String),
    /// The caller went on after an [`SttEvent::EagerEndOfTurn`]: drop the speculation.
    TurnResumed,
    /// The provider's turn model ended the turn with this text (Flux `EndOfTurn`).
    EndOfTurn(String),
    /// Something went wrong; `fatal` means the session is gone.
    Error { message: String, fatal: bool },
    /// A fallback chain ([`fallback_stt`]) moved the session from `from` to `to`
    /// (`message`: what went wrong); `ends_turns` is [`SttProvider::ends_turns`] of `to`.
    Switched {
        from: String,
        to: String,
        reason: fallback_stt::SttSwitchReason,
        message: String,
        ends_turns: bool,
    },
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
    /// Set by a fallback chain ([`fallback_stt`]) when a next STT would take over if this one
    /// failed: a provider that cannot serve now (a full local decoder pool) then fails fast
    /// with a fatal error instead of degrading the call.
    pub fallback: bool,
}

pub trait SttProvider: Send + Sync {
    /// Starts opening a session at once (without waiting for the handshake).
    fn open(&self, ctx: &SttContext) -> SttStream;

    /// Silence the provider itself waits for before it marks an utterance final (Deepgram's
    /// `endpointing`). The endpointer counts it towards `min_endpointing_ms`, so a turn is not
    /// held for silence the provider has already observed. 0 when unknown.
    fn endpointing_ms(&self) -> u64 {
        0
    }

    /// True when the provider decides the end of each turn itself
    /// ([`SttEvent::EndOfTurn`]); our endpointer then only listens.
    fn ends_turns(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------- text to speech

/// What a synthesis reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TtsEvent {
    /// μ-law 8 kHz audio, any length.
    Audio(Bytes),
    /// When words of this text are spoken in its audio (ms from its first byte), in order;
    /// from services that return alignment (ElevenLabs, Cartesia), so an interruption can
    /// keep exactly the words the caller heard. Sent with or after the audio they describe.
    Words(Vec<WordTiming>),
    /// All audio for this text has been delivered.
    Done,
    /// The synthesis failed; no more audio follows.
    Error(String),
    /// The service could not be reached, did not answer or answered 5xx/429; no more audio
    /// follows. A chain ([`fallback`]) gives the same text to its next TTS.
    Unavailable(String),
    /// The first audio of this text arrived (the "TTS request → first audio byte" stage);
    /// sent by a chain, before that audio.
    FirstByte {
        provider: String,
        after: std::time::Duration,
    },
    /// A chain gave this text to its next TTS (`from` failed with `reason`).
    Switched {
        from: String,
        to: String,
        reason: String,
    },
}

/// One text's synthesis in progress. Dropping it cancels the request.
pub struct TtsStream {
    pub events: mpsc::Receiver<TtsEvent>,
    pub guard: TaskGuard,
}

impl TtsStream {
    /// Runs `work` as one text's synthesis task (aborted when the stream is dropped): the
    /// audio it sends goes out as it comes, then `Done`, or the failure's event
    /// ([`TtsError::final_event`]).
    pub fn spawn<F, Fut>(work: F) -> Self
    where
        F: FnOnce(mpsc::Sender<TtsEvent>) -> Fut,
        Fut: std::future::Future<Output = Result<(), TtsError>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(64);
        let work = work(tx.clone());
        let task = tokio::spawn(async move {
            if let Some(last) = TtsError::final_event(work.await) {
                let _ = tx.send(last).await;
            }
        });
        TtsStream {
            events: rx,
            guard: TaskGuard::new(task),
        }
    }
}

pub trait TtsProvider: Send + Sync {
    /// Starts synthesising `text` as μ-law 8 kHz.
    fn synthesize(&self, text: &str) -> TtsStream;

    /// A provider of its own for one call, when this kind keeps per-call state (the ElevenLabs
    /// WebSocket: one socket per call, opened on the first sentence, closed when the call's
    /// providers are dropped). `None` (the default): the call shares `self`.
    fn for_call(&self) -> Option<std::sync::Arc<dyn TtsProvider>> {
        None
    }
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
    /// The caller's E.164 number, when it is one (`crate::util::phone::known_number`; for
    /// `session_key_from = "caller_hash"`).
    pub caller: Option<String>,
    pub system_prompt: String,
    /// The conversation so far, ending with the new caller message. A stateless brain gets it
    /// all; Hermes keeps its own transcript and gets only the last message.
    pub history: Vec<ChatMessage>,
    /// How much of `history` a request may carry ([`history::bound`]).
    pub history_limits: history::HistoryLimits,
    /// The tools the model may call this turn (never sent to kind `hermes`, which runs its
    /// own); `None` for none.
    pub tools: Option<Tools>,
    /// The call's own API token (scope `call`: this call only), for a brain that acts on the
    /// call through patterd's MCP or REST API; sent in `X-Patterd-Call-Token` where the
    /// brain's `[llm.*] send_call_token` says so.
    pub call_token: Option<crate::util::secret::Secret>,
    /// The span this turn belongs to (the call's turn span, or a consult's tool span), sent
    /// as `traceparent` so the brain's own trace joins the call's; `None` without
    /// `[telemetry]`.
    pub trace: Option<crate::util::traceparent::TraceParent>,
}

/// What a streamed chat turn reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmEvent {
    /// Speakable reply text.
    Delta(String),
    /// The brain is running a tool (Hermes `hermes.tool.progress`); never spoken as such.
    ToolProgress(String),
    /// The model called a tool (about to run).
    ToolCall(ToolCall),
    /// A tool finished; `content` is what the model is told.
    ToolResult {
        id: String,
        name: String,
        ok: bool,
        content: String,
    },
    /// A line to speak now, outside the model's reply text (a consult's reassurance or
    /// fallback line).
    Say(String),
    /// A fallback chain's brain failed before its first token; `to` answers this turn.
    Switched {
        from: String,
        to: String,
        reason: String,
    },
    /// The reply is complete.
    Done,
    /// The turn failed; nothing from the error is ever spoken.
    Error(String),
    /// The turn failed in a way that may pass: the brain could not be reached, the
    /// connection broke before the reply ended (a restart), or it answered 429, 502 or 503
    /// (`retry_after`: its `Retry-After`). Like [`LlmEvent::Error`] it ends the stream and
    /// nothing from it is spoken; a turn that had no reply content yet is retried by the call
    /// within the agent's `brain_retry_s` (`call::policy`, `retry.rs`).
    Unavailable {
        message: String,
        retry_after: Option<std::time::Duration>,
    },
    /// What the turn cost in tokens (the stream's `usage`, requested with
    /// `stream_options.include_usage`); a later report for the same turn replaces an earlier one.
    Usage(TokenUsage),
}

/// Tokens one brain turn used, as the server reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// A chat turn in flight. Dropping it drops the HTTP stream (cancels the turn).
pub struct LlmStream {
    pub events: mpsc::Receiver<LlmEvent>,
    pub guard: TaskGuard,
}

pub trait LlmProvider: Send + Sync {
    fn stream(&self, turn: ChatTurn) -> LlmStream;
    /// True when the server keeps the conversation itself (Hermes sessions): only the newest
    /// user message reaches it, so history corrections must travel inside that message.
    fn keeps_history(&self) -> bool {
        false
    }
}

/// The providers an agent uses, resolved from the configuration.
#[derive(Clone)]
pub struct AgentProviders {
    /// The agent's STT, or its chain ([`fallback_stt`]) for `stt = [..]`.
    pub stt: Arc<dyn SttProvider>,
    /// The agent's TTS chain ([`fallback::Chain`]; one member for `tts = "NAME"`).
    pub tts: Arc<dyn TtsProvider>,
    pub llm: Arc<dyn LlmProvider>,
}

/// Every configured provider, by its table name (a fallback chain by its names joined
/// with `,`).
#[derive(Clone, Default)]
pub struct Providers {
    pub stt: BTreeMap<String, Arc<dyn SttProvider>>,
    pub tts: BTreeMap<String, Arc<dyn TtsProvider>>,
    pub llm: BTreeMap<String, Arc<dyn LlmProvider>>,
    /// Each `[tts.NAME]`'s health, shared by every chain naming it (cool-downs).
    pub(crate) tts_health: BTreeMap<String, Arc<fallback::Health>>,
    /// Each `[stt.NAME]`'s health, shared by every chain naming it (cool-downs).
    pub(crate) stt_health: BTreeMap<String, Arc<fallback::Health>>,
    /// STT chain switches (the typed count per reason is `patterd_stt_switches_total`,
    /// derived from the calls' `stt_switched` events).
    pub stt_switches: Arc<std::sync::atomic::AtomicU64>,
    /// TTS chain switches (`patterd_tts_fallbacks_total`).
    pub tts_fallbacks: Arc<std::sync::atomic::AtomicU64>,
    /// Switches to a backup brain, over every chain (`/metrics`).
    pub llm_switches: Arc<std::sync::atomic::AtomicU64>,
}

impl Providers {
    /// The providers an agent names, if all exist.
    pub fn for_agent(&self, agent: &AgentConfig) -> Option<AgentProviders> {
        Some(AgentProviders {
            stt: self.stt_chain(agent)?,
            tts: self.tts_chain(agent)?,
            llm: self.llm.get(&agent.llm.key())?.clone(),
        })
    }

    /// The agent's `stt`: the provider itself for one name, else a chain made for one call
    /// (it remembers a member that dropped mid-call for the reopen).
    fn stt_chain(&self, agent: &AgentConfig) -> Option<Arc<dyn SttProvider>> {
        let names = agent.stt.names();
        if let [one] = names.as_slice() {
            return self.stt.get(one).cloned();
        }
        let mut members = Vec::new();
        for name in &names {
            members.push(fallback::Member {
                name: name.clone(),
                provider: self.stt.get(name)?.clone(),
                health: self.stt_health.get(name).cloned().unwrap_or_default(),
            });
        }
        if members.is_empty() {
            return None;
        }
        Some(Arc::new(fallback::Chain::new(
            members,
            std::time::Duration::from_secs_f64(agent.stt_cooldown_s.max(0.0)),
            std::time::Duration::from_millis(agent.stt_connect_timeout_ms),
            self.stt_switches.clone(),
        )))
    }

    /// The agent's `tts` names as one chain, made for one call ([`TtsProvider::for_call`]).
    fn tts_chain(&self, agent: &AgentConfig) -> Option<Arc<dyn TtsProvider>> {
        let mut members = Vec::new();
        for name in agent.tts.names() {
            members.push(fallback::Member {
                name: name.clone(),
                provider: {
                    let shared = self.tts.get(name)?;
                    shared.for_call().unwrap_or_else(|| shared.clone())
                },
                health: self.tts_health.get(name).cloned().unwrap_or_default(),
            });
        }
        if members.is_empty() {
            return None;
        }
        Some(Arc::new(fallback::Chain::new(
            members,
            std::time::Duration::from_secs_f64(agent.tts_cooldown_s.max(0.0)),
            std::time::Duration::from_millis(agent.tts_first_byte_timeout_ms),
            self.tts_fallbacks.clone(),
        )))
    }
}

/// Builds every `[stt.*]`, `[tts.*]` and `[llm.*]` entry, each by its kind (`kinds`), and the
/// agents' brain fallback chains.
pub fn build_providers(config: &Config) -> Result<Providers, SetupError> {
    let mut p = Providers::default();
    for (name, c) in &config.stt {
        let s = kinds::build_stt(c).map_err(|e| e.within("stt", name))?;
        p.stt.insert(name.clone(), s);
        p.stt_health.insert(name.clone(), Default::default());
    }
    for (name, c) in &config.tts {
        let t = kinds::build_tts(c).map_err(|e| e.within("tts", name))?;
        p.tts.insert(name.clone(), t);
        p.tts_health.insert(name.clone(), Default::default());
    }
    for (name, c) in &config.llm {
        let l = kinds::build_llm(c).map_err(|e| e.within("llm", name))?;
        p.llm.insert(name.clone(), l);
    }
    for agent in config.agents.values() {
        let names = agent.llm.names();
        if names.len() < 2 || p.llm.contains_key(&agent.llm.key()) {
            continue;
        }
        let chain: Option<Vec<_>> = names
            .iter()
            .map(|n| p.llm.get(n).map(|l| (n.clone(), l.clone())))
            .collect();
        if let Some(chain) = chain {
            let cooldown = std::time::Duration::from_secs(agent.fallback_cooldown_s);
            let l = fallback_llm::FallbackLlm::new(chain, cooldown, p.llm_switches.clone());
            p.llm.insert(agent.llm.key(), Arc::new(l));
        }
    }
    Ok(p)
}
