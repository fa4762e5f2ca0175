//! The `patter.toml` schema: plain serde structs with defaults, one per section. Key names are
//! the user-facing contract of `design/config.md`; every struct denies unknown keys so a typo is
//! an error (with a suggestion) rather than a silently ignored setting.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::carrier::{CarrierConfig, CarrierKind};
use crate::util::phone::normalize_e164;
pub use crate::util::secret::Secret;

mod kinds;
mod providers;
mod turn_model;
mod webhooks;
pub(crate) use kinds::{llm_kinds, stt_kinds, tts_kinds};
use providers::default_true;
pub use providers::*;
pub use turn_model::*;
pub use webhooks::*;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub log: LogConfig,
    pub llm: BTreeMap<String, LlmConfig>,
    pub stt: BTreeMap<String, SttConfig>,
    pub tts: BTreeMap<String, TtsConfig>,
    pub carriers: BTreeMap<String, CarrierConfig>,
    pub agents: BTreeMap<String, AgentConfig>,
    pub numbers: Vec<NumberConfig>,
    pub store: StoreConfig,
    pub cluster: ClusterConfig,
    pub outbound: OutboundConfig,
    pub pricing: PricingConfig,
    /// `[turn_model.NAME]`: end-of-turn models agents can use.
    pub turn_model: BTreeMap<String, TurnModelConfig>,
    /// `[[webhooks]]`: receivers of the calls' events (docs/integrations.md).
    pub webhooks: Vec<WebhookConfig>,
    /// `[webhook_delivery]`: how the outbox delivers them.
    pub webhook_delivery: WebhookDeliveryConfig,
    /// `[telemetry]`: OpenTelemetry traces (off unless `otlp_endpoint` is set).
    pub telemetry: TelemetryConfig,
}

/// `[telemetry]`: a call's trace (a span per call, per turn and per stage, tool calls and
/// transfers) exported over OTLP/HTTP with protobuf bodies (docs/integrations.md, "Tracing
/// with OpenTelemetry"). Off while `otlp_endpoint` is empty: nothing is exported and no
/// `traceparent` is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP URL (`http://collector:4318`): spans go to
    /// `<otlp_endpoint>/v1/traces` unless the URL has a path of its own, which is used as is.
    pub otlp_endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Extra request headers for the collector (an API key); never logged.
    pub headers: BTreeMap<String, Secret>,
    /// Spans waiting for export at most; more are dropped (counted).
    pub max_queued_spans: usize,
    /// How often queued spans are sent (a call's spans also go as soon as it ends).
    pub export_interval_ms: u64,
    /// How long one export may take before its spans count as dropped.
    pub export_timeout_ms: u64,
}

impl TelemetryConfig {
    /// True when spans are exported.
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.trim().is_empty()
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            service_name: "patterd".into(),
            headers: BTreeMap::new(),
            max_queued_spans: 4096,
            export_interval_ms: 2_000,
            export_timeout_ms: 5_000,
        }
    }
}

/// `[pricing]`: what each provider and carrier account charges, in US dollars, keyed by the
/// same names as `[stt.NAME]`, `[tts.NAME]`, `[llm.NAME]` and `[carriers.NAME]`. A call's cost
/// is its usage times these prices; a provider without a price counts as free (its usage is
/// still stored).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PricingConfig {
    pub stt: BTreeMap<String, PerMinutePrice>,
    pub tts: BTreeMap<String, TtsPrice>,
    pub llm: BTreeMap<String, LlmPrice>,
    pub carriers: BTreeMap<String, PerMinutePrice>,
}

/// `usd_per_minute`: speech-to-text audio streamed, or carrier minutes (answer to hang-up).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PerMinutePrice {
    pub usd_per_minute: f64,
}

/// `usd_per_1k_characters`: characters sent to text-to-speech.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TtsPrice {
    pub usd_per_1k_characters: f64,
}

/// `usd_per_1m_input_tokens` / `usd_per_1m_output_tokens`: the brain's prompt and completion
/// tokens, from its stream's `usage`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmPrice {
    pub usd_per_1m_input_tokens: f64,
    pub usd_per_1m_output_tokens: f64,
}

/// `[store]`: the call store (SQLite at `server.data_dir/patterd.db`, or a shared PostgreSQL).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite` (embedded, the default) or `postgres` (shared by several instances).
    pub backend: StoreBackend,
    /// PostgreSQL's URL (`postgres://user:password@host:5432/db`); a secret (`${VAR}`-able).
    pub url: Option<Secret>,
    /// Connections in the PostgreSQL read pool (the writer keeps one more of its own).
    pub pool: u32,
    /// Calls (with their turns and events) older than this many days are deleted; 0 keeps
    /// everything.
    pub retention_days: u32,
    /// Capacity of the store's write queue; writes beyond it are dropped and counted.
    pub queue: usize,
}

/// `[cluster]`: this instance among several sharing one `[store]` PostgreSQL. With the SQLite
/// store (a single instance) only `instance_name` means anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This instance's name, recorded as the owner of the calls it admits (default: the host
    /// name). Every instance sharing a database needs a name of its own that stays the same
    /// across restarts (a StatefulSet's pod name, a systemd host's name): a starting instance
    /// closes the calls its own name left open at once, and two live instances of one name are
    /// refused.
    pub instance_name: Option<String>,
    /// Where carriers reach *this* instance for a call's media socket and per-call callbacks
    /// (scheme + host, optional path prefix); default `server.public_url`. `"auto"`: the
    /// address the listener bound (loopback tests).
    pub advertise_url: Option<String>,
    /// Where peers reach this instance to forward an action on one of its calls, or a webhook
    /// it should take; default `http://` + the bound listen address (with `0.0.0.0`, the host
    /// name).
    pub internal_url: Option<String>,
    /// The credential peers send on forwarded requests; default `server.api_token`.
    pub token: Option<Secret>,
    /// How often this instance renews its lease in the database.
    pub heartbeat_ms: u64,
    /// An instance whose last heartbeat is older than this (on the database's clock) is lost:
    /// one peer closes its calls, hangs their legs up and frees its outbound slots.
    pub lease_ms: u64,
    /// How often the elected peer looks for lost instances.
    pub reaper_ms: u64,
    /// A forwarded request gets this long to answer (connecting gets at most 500 ms).
    pub forward_timeout_ms: u64,
    /// How often settings changed on another instance are polled for when no notification
    /// came (LISTEN/NOTIFY is the fast path).
    pub settings_poll_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            instance_name: None,
            advertise_url: None,
            internal_url: None,
            token: None,
            heartbeat_ms: 2_000,
            lease_ms: 10_000,
            reaper_ms: 2_000,
            forward_timeout_ms: 10_000,
            settings_poll_ms: 5_000,
        }
    }
}

impl ClusterConfig {
    /// The configured name, or the host name.
    pub fn instance_name(&self) -> String {
        self.instance_name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(crate::util::host_name)
    }
}

/// `[store] backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    #[default]
    Sqlite,
    Postgres,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sqlite,
            url: None,
            pool: 4,
            retention_days: 30,
            queue: 4096,
        }
    }
}

/// `[outbound]`: limits on calls the daemon places (REST `POST /v1/calls`, MCP `make_call`)
/// and on the text messages it sends (REST `POST /v1/messages`, MCP and in-call `send_sms`,
/// the agents' answers to inbound messages).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboundConfig {
    /// Outbound calls per UTC day, across all numbers.
    pub max_per_day: u32,
    /// Outbound calls live at once.
    pub max_concurrent: usize,
    /// Seconds to let the destination ring before giving up (Twilio `Timeout`).
    pub ring_timeout_s: u32,
    /// Text messages sent per UTC day, across all numbers (and, on PostgreSQL, all instances).
    pub max_sms_per_day: u32,
    /// The longest text message body, in characters (1 to 1600).
    pub max_sms_chars: usize,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            max_per_day: 100,
            max_concurrent: 5,
            ring_timeout_s: 30,
            max_sms_per_day: 100,
            max_sms_chars: 1600,
        }
    }
}

/// `[server]`: the listener and daemon-wide limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the one HTTP listener binds (webhooks, media, API, MCP, metrics).
    pub listen: String,
    /// How carriers reach us (scheme + host, optional path prefix); used to build media
    /// stream URLs and to verify webhook signatures.
    pub public_url: String,
    /// Bearer token for `/v1/*`, `/mcp` and `/metrics`; required unless both `listen` and
    /// `public_url` are loopback (local development).
    pub api_token: Secret,
    /// `[[server.api_tokens]]`: more bearer tokens, each named and scoped (`operator`: what
    /// `api_token` may do; `read`: reads only). Needs `api_token`. A reload applies them.
    pub api_tokens: Vec<ApiTokenConfig>,
    /// Serve `/metrics` without the bearer token even when `api_token` is set (for a
    /// Prometheus that cannot send one). Default false.
    pub metrics_public: bool,
    /// Where the SQLite database and recordings live.
    pub data_dir: PathBuf,
    /// On SIGTERM, how long live calls may run on before the daemon exits anyway.
    pub drain_timeout_s: u64,
    /// Concurrent calls; beyond this a new call is refused politely (busy).
    pub max_calls: usize,
    /// Concurrent TCP connections (calls use one media socket each, plus webhooks).
    pub max_connections: usize,
    /// A client must send its request headers within this time.
    pub header_timeout_s: u64,
    /// Largest webhook / API request body accepted, in bytes.
    pub(crate) max_body_bytes: usize,
    /// Optional TLS; otherwise run behind a reverse proxy that terminates it.
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            public_url: "http://127.0.0.1:8080".into(),
            api_token: Secret::default(),
            api_tokens: Vec::new(),
            metrics_public: false,
            data_dir: PathBuf::from("/var/lib/patterd"),
            drain_timeout_s: 300,
            max_calls: 500,
            max_connections: 4096,
            header_timeout_s: 10,
            max_body_bytes: 64 * 1024,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// True when both `listen` and `public_url` are loopback: the only setting in which the
    /// API may run without `api_token` (nothing outside this machine can reach it, and no
    /// carrier or proxy forwards to it).
    pub(crate) fn api_is_local(&self) -> bool {
        let listen = self
            .listen
            .trim()
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        let public = url::Url::parse(&self.public_url).is_ok_and(|u| match u.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        });
        listen && public
    }
}

/// One `[[server.api_tokens]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenConfig {
    /// Who holds it, for the logs (never the token).
    pub name: String,
    pub token: Secret,
    pub scope: TokenScope,
}

/// What a configured token may do. (The third scope, `call`, is never configured: patterd
/// mints a call's token itself, `crate::security::call_token`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenScope {
    /// Everything `api_token` may do.
    Operator,
    /// Reads only: calls, transcripts, events, metrics, recordings, the pages.
    Read,
}

/// `[server.tls]`: PEM files for the listener.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[log]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A level (`info`) or a tracing filter (`patterd=debug,hyper=warn`).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Pretty,
            level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

/// `[agents.NAME] vad_engine`: earshot (built in, the default) or Silero (cargo feature
/// `silero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VadEngineName {
    #[default]
    Earshot,
    Silero,
}

/// `[agents.NAME]`: a persona: which brain, ears and voice, and what it says when.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    #[serde(default)]
    pub system_prompt: String,
    /// Spoken as soon as the media stream starts (synthesised while the phone rings).
    #[serde(default)]
    pub first_message: String,
    /// A brain's `[llm.*]` name, or a fallback chain of them tried in order.
    pub llm: ProviderNames,
    /// A speech-to-text's `[stt.*]` name, or a fallback chain of them tried in order when
    /// opening the session fails.
    pub stt: ProviderNames,
    /// An STT of a chain whose session has not opened this long is given up for the next
    /// one (only with a chain).
    #[serde(default = "default_stt_connect_timeout_ms")]
    pub stt_connect_timeout_ms: u64,
    /// An STT of a chain that failed is skipped this long before it is tried again.
    #[serde(default = "default_tts_cooldown_s")]
    pub(crate) stt_cooldown_s: f64,
    pub tts: TtsChain,
    /// A TTS that sends no audio this long after a sentence was asked for is given up for
    /// that sentence, which the next TTS of the chain speaks (only with a chain).
    #[serde(default = "default_tts_first_byte_timeout_ms")]
    pub tts_first_byte_timeout_ms: u64,
    /// A TTS that failed is skipped this long before it is tried again.
    #[serde(default = "default_tts_cooldown_s")]
    pub tts_cooldown_s: f64,
    /// Filler spoken once per turn when the brain is slow.
    #[serde(default = "default_long_turn_message")]
    pub long_turn_message: String,
    #[serde(default = "default_long_turn_after")]
    pub long_turn_message_after_s: f64,
    /// Spoken when the brain fails before any reply audio of the turn.
    #[serde(default = "default_llm_error_message")]
    pub llm_error_message: String,
    /// How long a turn whose brain is unreachable, overloaded (429/502/503) or cut off before
    /// any reply is retried (with backoff, the filler spoken once) before the caller hears
    /// `llm_error_message`; 0: no retries.
    #[serde(default = "default_brain_retry_s")]
    pub brain_retry_s: f64,
    /// A brain that has answered nothing for this long (every turn failing) ends the call
    /// with `brain_down_message` instead of another apology; 0: never.
    #[serde(default = "default_brain_down_hangup_s")]
    pub brain_down_hangup_s: f64,
    /// The last line before that hang-up.
    #[serde(default = "default_brain_down_message")]
    pub brain_down_message: String,
    /// Seconds a brain of a fallback chain that failed is skipped before it is tried again.
    #[serde(default = "default_fallback_cooldown_s")]
    pub(crate) fallback_cooldown_s: u64,
    /// Longest a call may last before the agent hangs up.
    #[serde(default = "default_max_duration")]
    pub max_duration_s: u64,
    /// Records each call as a stereo WAV (caller left, agent right) at
    /// `data_dir/recordings/<call_id>.wav`, served by `GET /v1/calls/{id}/recording`.
    #[serde(default)]
    pub record: bool,

    // Conversation: voice activity, end of turn, barge-in, idle callers (docs/conversation.md).
    /// Which voice-activity network scores caller audio (`silero` needs the cargo feature).
    #[serde(default)]
    pub vad_engine: VadEngineName,
    /// Our voice-activity detector's voiced-frame threshold (0–1).
    #[serde(default = "default_vad_threshold")]
    pub vad_threshold: f64,
    /// Silence after the last voiced frame before the detector says speech ended.
    #[serde(default = "default_vad_stop_ms")]
    pub vad_stop_ms: u64,
    /// Silence after the caller's speech before a turn may be committed.
    #[serde(default = "default_min_endpointing_ms")]
    pub min_endpointing_ms: u64,
    /// Silence after which a turn is committed whatever the speech-to-text says.
    #[serde(default = "default_max_endpointing_ms")]
    pub max_endpointing_ms: u64,
    /// Silence after a phrase that looks unfinished ("I need to…") before the turn may end.
    #[serde(default = "default_unfinished_hold_ms")]
    pub unfinished_hold_ms: u64,
    /// The country whose phone numbers callers read to this agent (ISO 3166 alpha-2; none:
    /// NANP): a number read in groups short of one holds the turn.
    #[serde(default)]
    pub(crate) phone_country: Option<String>,
    /// Lengths (digits) of the order, account or booking numbers callers read to this agent,
    /// besides those its system prompt names ("a 6-digit reference").
    #[serde(default)]
    pub(crate) expected_number_lengths: Vec<u64>,
    /// How long our detector may keep saying "speech" after the speech-to-text's end of
    /// utterance (with no new words) before that end commits the turn; 0: no bound.
    #[serde(default = "default_stt_eou_override_ms")]
    pub stt_eou_override_ms: u64,
    /// A `[turn_model.NAME]` judging the caller's pauses (none: silence and the
    /// speech-to-text's signals decide).
    #[serde(default)]
    pub turn_model: Option<String>,
    /// Whether the caller can interrupt the agent.
    #[serde(default = "default_true")]
    pub barge_in: bool,
    /// Whether the greeting can be interrupted (only with `barge_in`).
    #[serde(default = "default_true")]
    pub greeting_interruptible: bool,
    /// Caller speech (voiced audio) over the agent that stops it.
    #[serde(default = "default_barge_in_min_speech_ms")]
    pub barge_in_min_speech_ms: u64,
    /// Voiced caller audio over the agent that stops sending new agent audio (no `clear`) until
    /// the stop or the end of the burst; 0 turns the hold off.
    #[serde(default = "default_barge_in_hold_ms")]
    pub(crate) barge_in_hold_ms: u64,
    /// Whether caller audio the agent's own echo explains is kept from stopping it (the
    /// echo check compares the caller's audio with what was played 0–800 ms before).
    #[serde(default = "default_true")]
    pub barge_in_echo_check: bool,
    /// How long after stopping the agent we wait for words before resuming it.
    #[serde(default = "default_barge_in_confirm_ms")]
    pub barge_in_confirm_ms: u64,
    /// Longest the agent's audio is held back (the barge-in hold, a stop no turn has
    /// followed) before the agent resumes or the caller's turn is taken.
    #[serde(default = "default_hold_max_ms")]
    pub(crate) hold_max_ms: u64,
    /// Non-backchannel words that make an interruption real.
    #[serde(default = "default_barge_in_min_words")]
    pub barge_in_min_words: u64,
    /// Words that only acknowledge ("mm-hmm") and never interrupt.
    #[serde(default = "default_backchannel_words")]
    pub backchannel_words: Vec<String>,
    /// Seconds of caller silence after the agent finished before a nudge; 0 disables.
    #[serde(default = "default_idle_nudge_after")]
    pub idle_nudge_after_s: f64,
    #[serde(default = "default_idle_nudge_message")]
    pub idle_nudge_message: String,
    /// Nudges before the goodbye.
    #[serde(default = "default_idle_max_nudges")]
    pub idle_max_nudges: u64,
    /// Spoken before hanging up on a silent caller.
    #[serde(default = "default_idle_goodbye_message")]
    pub idle_goodbye_message: String,

    // The keypad and the brain's history (docs/configuration.md, "Keypad and history").
    /// Keys without another key this long end the caller's keypad turn.
    #[serde(default = "default_dtmf_inter_digit_ms")]
    pub dtmf_inter_digit_ms: u64,
    /// Keys collected into one keypad turn at most (`#` ends one sooner).
    #[serde(default = "default_dtmf_max_digits")]
    pub dtmf_max_digits: u64,
    /// Keys per second a caller may press; more are counted and not acted on.
    #[serde(default = "default_dtmf_max_per_s")]
    pub dtmf_max_per_s: u64,
    /// Caller turns of history sent to the brain at most (the oldest go first; the system
    /// prompt always stays).
    #[serde(default = "default_max_history_turns")]
    pub max_history_turns: u64,
    /// Bytes of history (the messages as sent) sent to the brain at most; the oldest turns
    /// go first, the newest is always sent.
    #[serde(default = "default_max_history_bytes")]
    pub max_history_bytes: u64,

    // Actions on the call (docs/configuration.md, "Agent actions").
    /// Numbers (E.164) or prefixes (`+` then digits) the agent may transfer a call to; empty
    /// means transfers are refused.
    #[serde(default)]
    pub transfer_allowed: Vec<String>,
    /// Spoken to the caller before a transfer is handed to the carrier.
    #[serde(default = "default_transfer_message")]
    pub transfer_message: String,

    // Tools (docs/agents.md; the types are in `config::tools`).
    /// Built-in tools the model may call (`end_call`, `transfer_call`, `send_dtmf`).
    #[serde(default)]
    pub tools: Vec<super::tools::BuiltinTool>,
    /// Tool rounds per caller turn before the model must answer in words.
    #[serde(default = "super::tools::default_max_tool_rounds")]
    pub max_tool_rounds: u32,
    /// `[agents.X.consult]`: hand hard requests to a back-office agent.
    #[serde(default)]
    pub consult: Option<super::tools::ConsultConfig>,
    /// `[[agents.X.webhook_tools]]`: tools served over HTTP.
    #[serde(default)]
    pub webhook_tools: Vec<super::tools::WebhookToolConfig>,
    /// `[agents.X.summary]`: after each call, a brain summarises it (and fills a schema).
    #[serde(default)]
    pub summary: Option<SummaryConfig>,
}

impl AgentConfig {
    /// Whether this agent may transfer a call to `to` (any spelling): only numbers matching a
    /// `transfer_allowed` entry after E.164 normalisation; none when the list is empty.
    /// Returns the normalised number.
    pub(crate) fn transfer_target(&self, to: &str) -> Result<String, TransferRefusal> {
        if self.transfer_allowed.is_empty() {
            return Err(TransferRefusal::NoTransfers);
        }
        let Some(number) = normalize_e164(to) else {
            return Err(TransferRefusal::NotANumber);
        };
        if self
            .transfer_allowed
            .iter()
            .any(|prefix| number.starts_with(prefix.as_str()))
        {
            Ok(number)
        } else {
            Err(TransferRefusal::NotAllowed)
        }
    }
}

/// Why [`AgentConfig::transfer_target`] refused a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TransferRefusal {
    #[error("this agent may not transfer calls (its transfer_allowed list is empty)")]
    NoTransfers,
    #[error("that is not a phone number; give the full international number, e.g. +14155551234")]
    NotANumber,
    #[error("that number is not one this agent may transfer to (transfer_allowed)")]
    NotAllowed,
}

fn default_dtmf_inter_digit_ms() -> u64 {
    1500
}
fn default_dtmf_max_digits() -> u64 {
    20
}
fn default_dtmf_max_per_s() -> u64 {
    10
}
fn default_max_history_turns() -> u64 {
    40
}
fn default_max_history_bytes() -> u64 {
    64 * 1024
}

fn default_transfer_message() -> String {
    "Please hold while I transfer your call.".into()
}

fn default_tts_first_byte_timeout_ms() -> u64 {
    2000
}
fn default_stt_connect_timeout_ms() -> u64 {
    3000
}
fn default_tts_cooldown_s() -> f64 {
    30.0
}
fn default_fallback_cooldown_s() -> u64 {
    30
}
fn default_brain_retry_s() -> f64 {
    8.0
}
fn default_brain_down_hangup_s() -> f64 {
    30.0
}
fn default_brain_down_message() -> String {
    "I'm sorry, I can't help right now because of a technical problem. Please call back in \
     a few minutes. Goodbye."
        .into()
}

/// `llm = "hermes"` or `llm = ["hermes", "backup"]`: one provider or a fallback chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProviderNames {
    One(String),
    Chain(Vec<String>),
}

impl ProviderNames {
    pub fn names(&self) -> Vec<String> {
        match self {
            ProviderNames::One(n) => vec![n.clone()],
            ProviderNames::Chain(v) => v.clone(),
        }
    }

    /// The key of the (chained) provider in [`crate::provider::Providers`].
    pub fn key(&self) -> String {
        self.names().join(",")
    }
}

impl std::fmt::Display for ProviderNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key())
    }
}

fn default_vad_threshold() -> f64 {
    0.5
}
fn default_vad_stop_ms() -> u64 {
    160
}
fn default_min_endpointing_ms() -> u64 {
    300
}
fn default_max_endpointing_ms() -> u64 {
    3000
}
fn default_unfinished_hold_ms() -> u64 {
    2000
}
fn default_stt_eou_override_ms() -> u64 {
    1500
}
fn default_barge_in_min_speech_ms() -> u64 {
    200
}
fn default_barge_in_hold_ms() -> u64 {
    100
}
fn default_hold_max_ms() -> u64 {
    1200
}
fn default_barge_in_confirm_ms() -> u64 {
    1000
}
fn default_barge_in_min_words() -> u64 {
    2
}
/// Acknowledgements that never interrupt the agent (compared per word, case- and
/// punctuation-insensitively; "mm hmm" and "mm-hmm" both match).
pub(crate) fn default_backchannel_words() -> Vec<String> {
    [
        "mm-hmm", "mhm", "mm", "hmm", "uh-huh", "uh", "huh", "um", "yeah", "yep", "yes", "okay",
        "ok", "right", "sure", "alright", "oh", "ah", "aha",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}
fn default_idle_nudge_after() -> f64 {
    6.0
}
fn default_idle_nudge_message() -> String {
    "Are you still there?".into()
}
fn default_idle_max_nudges() -> u64 {
    2
}
fn default_idle_goodbye_message() -> String {
    "I haven't heard from you, so I'll hang up now. Goodbye!".into()
}

fn default_long_turn_message() -> String {
    "One moment, let me check that.".into()
}
fn default_long_turn_after() -> f64 {
    4.0
}
fn default_llm_error_message() -> String {
    "Sorry, I'm having trouble right now. Please try again in a moment.".into()
}
fn default_max_duration() -> u64 {
    3600
}

/// `[[numbers]]`: a phone number we answer, and who answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumberConfig {
    /// E.164, e.g. `+15550001234`.
    pub number: String,
    pub carrier: String,
    pub agent: String,
    /// Callers allowed to reach this number (E.164); empty means everyone.
    #[serde(default)]
    pub allowed_callers: Vec<String>,
    /// Destinations this number may call out to and text (E.164 numbers or prefixes); empty
    /// means outbound calls and messages are refused (an in-call `send_sms` may still text
    /// the caller of that call).
    #[serde(default)]
    pub allowed_destinations: Vec<String>,
    /// Text messages to this number start a turn of its agent, answered by text message (one
    /// conversation per pair of numbers). Off: they are only stored.
    #[serde(default)]
    pub sms: bool,
}

impl Config {
    /// The `[[numbers]]` entry for `number` (E.164; other spellings are normalized first).
    pub fn number(&self, number: &str) -> Option<&NumberConfig> {
        self.numbers
            .iter()
            .find(|n| n.number == number)
            .or_else(|| {
                let normalized = normalize_e164(number)?;
                self.numbers.iter().find(|n| n.number == normalized)
            })
    }

    /// The agent called `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.get(name)
    }

    /// The carrier account called `name`.
    pub fn carrier(&self, name: &str) -> Option<&CarrierConfig> {
        self.carriers.get(name)
    }
}

impl NumberConfig {
    /// Whether `caller` may call this number: everyone when `allowed_callers` is empty.
    pub fn allows_caller(&self, caller: &str) -> bool {
        if self.allowed_callers.is_empty() {
            return true;
        }
        let Some(caller) = normalize_e164(caller) else {
            return false;
        };
        self.allowed_callers.contains(&caller)
    }

    /// Whether this number may call `destination`: only destinations matching an
    /// `allowed_destinations` entry (a number or a prefix); none when the list is empty.
    pub fn allows_destination(&self, destination: &str) -> bool {
        let Some(destination) = normalize_e164(destination) else {
            return false;
        };
        self.allowed_destinations
            .iter()
            .any(|prefix| destination.starts_with(prefix.as_str()))
    }
}
