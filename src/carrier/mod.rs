//! Carriers: everything that speaks a carrier's protocol, and the registry the rest of the
//! daemon reaches carriers through.
//!
//! The carrier-neutral core is here: every carrier maps its media frames onto [`MediaEvent`]s
//! and [`MediaCommand`]s (the only thing the call actor sees) with a [`MediaCodec`]. Each
//! carrier is one folder (`twilio/`, `telnyx/`, `plivo/`, `web/`) holding its wire formats, its
//! `[carriers.NAME]` keys (`config.rs`) and its HTTP routes (`routes.rs`), and implements the
//! [`Carrier`] trait ([`registry`]); the folder is registered by one line in the
//! `carriers!` invocation below, which also makes the `kind = "…"` value of the tagged
//! [`CarrierConfig`] and the [`CarrierKind`]. Carrier routes reach the daemon (admission, media
//! tokens, the call store) only through the [`port::Host`] port; the outbound call lifecycle
//! they update is [`dial::Outbound`]. What every carrier's routes share is [`webhook`]; what their
//! codecs and answer documents share is [`codec_util`].

pub mod account;
pub mod admin;
pub(crate) mod codec_util;
pub mod dial;
pub mod leg;
pub mod messaging;
pub mod port;
pub(crate) mod registry;
pub(crate) mod rest_client;
pub mod transport;
pub mod webhook;

pub use account::AccountConfig;
pub use leg::Leg;
pub use registry::{Carrier, Registry};
pub use webhook::{public_request_url, public_ws_url};

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

/// Declares the carriers: each line `module => Variant` adds the folder `carrier/module/`
/// (which must export `Config`, its `[carriers.NAME]` keys, and `build`, which makes its
/// [`Carrier`] from the configured accounts), the [`CarrierKind`] variant and the
/// `kind = "module"` variant of [`CarrierConfig`].
macro_rules! carriers {
    ($($module:ident => $variant:ident),+ $(,)?) => {
        $(pub mod $module;)+

        /// Which carrier a call came through (`kind = "…"` of `[carriers.NAME]`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum CarrierKind {
            $($variant),+
        }

        impl CarrierKind {
            /// Every registered carrier.
            pub const ALL: &'static [CarrierKind] = &[$(CarrierKind::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(CarrierKind::$variant => stringify!($module)),+
                }
            }
        }

        /// `[carriers.NAME]`: one carrier account, tagged by `kind`; each variant holds that
        /// carrier's own keys. A carrier whose credentials are empty is *unconfigured* and its
        /// routes answer 503.
        ///
        /// Serialized as serde's internally tagged enum; deserialized by
        /// [`account::deserialize_tagged`], which reads every key at its own place (so an error
        /// names the key and its line, as for every other table) and then the variant's keys.
        #[derive(Debug, Clone, serde::Serialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        pub enum CarrierConfig {
            $($variant($module::Config)),+
        }

        impl<'de> serde::Deserialize<'de> for CarrierConfig {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                account::deserialize_tagged(d, |kind, keys| match kind {
                    $(CarrierKind::$variant => {
                        <$module::Config as serde::Deserialize>::deserialize(keys)
                            .map(CarrierConfig::$variant)
                    }),+
                })
            }
        }

        impl CarrierConfig {
            pub fn kind(&self) -> CarrierKind {
                match self {
                    $(CarrierConfig::$variant(_) => CarrierKind::$variant),+
                }
            }

            /// The account's number administration (credential check, wiring); needs the
            /// account's credentials.
            pub fn admin(&self) -> Result<Box<dyn admin::NumberAdmin>, CarrierError> {
                match self {
                    $(CarrierConfig::$variant(c) => $module::admin(c)),+
                }
            }

            /// The account's keys, carrier-neutrally.
            pub fn account(&self) -> &dyn AccountConfig {
                match self {
                    $(CarrierConfig::$variant(c) => c),+
                }
            }
        }

        /// One [`Carrier`] per registered kind, each with its configured accounts (possibly
        /// none: its routes then answer 503).
        fn build_all(configs: &BTreeMap<String, CarrierConfig>) -> Vec<Arc<dyn Carrier>> {
            vec![$({
                let accounts: Vec<(String, $module::Config)> = configs
                    .iter()
                    .filter_map(|(name, c)| match c {
                        CarrierConfig::$variant(c) => Some((name.clone(), c.clone())),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    })
                    .collect();
                $module::build(accounts)
            }),+]
        }
    };
}

// The registered carriers: a new carrier is its folder plus one line here.
carriers! {
    twilio => Twilio,
    telnyx => Telnyx,
    plivo => Plivo,
    web => Web,
    vonage => Vonage,
}

impl CarrierConfig {
    /// The REST API root, or the carrier's public default.
    #[cfg(test)]
    pub(crate) fn api_base(&self) -> &str {
        self.account().api_base()
    }

    /// `api_base_url` as written, if set.
    pub fn api_base_url(&self) -> Option<&str> {
        self.account().api_base_url()
    }

    /// The carrier's public REST API root.
    pub(crate) fn default_api_base(&self) -> &'static str {
        self.account().default_api_base()
    }

    /// Names of the credentials this account still lacks (empty when configured).
    pub(crate) fn missing_credentials(&self) -> Vec<&'static str> {
        self.account().missing_credentials()
    }

    /// Why this account cannot place outbound calls, if it cannot (the end of a sentence
    /// starting "… through [carriers.NAME], ").
    pub(crate) fn outbound_problem(&self) -> Option<String> {
        self.account().outbound_problem()
    }
}

/// Duration of one carrier audio frame.
pub const FRAME_MS: u64 = 20;
/// Bytes of 8 kHz G.711 in one 20 ms frame.
pub const FRAME_BYTES: usize = 160;

/// The media stream has started: what the carrier told us about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamStart {
    /// The carrier's call id (Twilio `CallSid`, Telnyx `call_control_id`, Plivo `CallUUID`).
    pub call_id: String,
    /// The carrier's id for this media stream (sent back on every outgoing frame).
    pub stream_id: String,
    /// Parameters we attached to the stream in the answer document (e.g. the media token).
    pub custom_parameters: BTreeMap<String, String>,
}

/// Something the carrier's media socket told us, in carrier-neutral form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaEvent {
    Start(StreamStart),
    /// Caller audio: μ-law 8 kHz, normally one 20 ms frame (160 bytes).
    Audio(Bytes),
    /// The caller pressed a key (`0-9`, `*`, `#`, `A-D`).
    Dtmf(char),
    /// The carrier has played (or, after a clear, dropped) everything before this mark.
    MarkPlayed(String),
    /// The stream ended (caller hung up or the carrier stopped it).
    Stop,
}

/// The carrier's answer to a REST command the call actor ran on its [`Leg`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionResult {
    /// The carrier accepted it.
    Done,
    /// The carrier has no command for this while streaming: send the DTMF as in-band tones
    /// on the media stream.
    InBand,
    /// The carrier refused or could not be reached (the message says why).
    Failed(String),
}

/// A cold transfer of a live call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    /// Where to (E.164, already allowed by the agent's policy).
    pub to: String,
    /// The caller id shown to `to` (our number on this call).
    pub(crate) caller_id: String,
    /// `server.public_url`, for carriers that fetch the transfer's document from us (Plivo);
    /// filled in by the [`Leg`].
    pub public_url: String,
}

/// How a carrier delivers DTMF on a live, streaming call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtmfDelivery {
    /// The carrier's own command sent the digits.
    Sent,
    /// The carrier has no such command while streaming: send in-band tones on the stream.
    InBand,
}

/// Something the call actor sends on the media stream (a leg's REST commands go through its
/// [`Leg`] instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaCommand {
    /// Agent audio: μ-law 8 kHz, normally one 20 ms frame.
    Audio(Bytes),
    /// Ask the carrier to tell us when everything queued so far has played.
    Mark(String),
    /// Drop all queued agent audio at once (barge-in).
    Clear,
}

/// A frame the codec refused, with why. Counted and logged by the media socket; never fatal on
/// its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("frame is not valid JSON: {0}")]
    BadJson(String),
    #[error("frame is missing field `{0}`")]
    MissingField(&'static str),
    #[error("media payload is not valid base64")]
    BadBase64,
    #[error("unknown event `{0}`")]
    UnknownEvent(String),
    #[error("frame of {0} bytes exceeds the 64 KiB limit")]
    TooLarge(usize),
    #[error("an audio frame of {0} bytes is not 20 to 60 ms (160 to 480 bytes of μ-law 8 kHz)")]
    AudioFrameSize(usize),
    #[error("binary frames are not part of this protocol")]
    Binary,
    #[error("field `{0}` has an invalid value")]
    InvalidField(&'static str),
    #[error("unsupported media format: {0}")]
    UnsupportedFormat(String),
}

/// A carrier REST call that failed. Messages say what to check, since they end up in logs and
/// API errors; transport failures keep their cause as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum CarrierError {
    #[error(
        "{carrier} rejected our credentials (HTTP {status}); check the carrier's account_sid / \
         auth_token (or api_key) in the config"
    )]
    Unauthorized { carrier: &'static str, status: u16 },
    #[error("{carrier} does not know {what} (HTTP 404); the call may already have ended")]
    NotFound { carrier: &'static str, what: String },
    #[error("{carrier} answered HTTP {status}: {message}")]
    Http {
        carrier: &'static str,
        status: u16,
        message: String,
    },
    #[error(
        "{carrier} did not answer within {seconds} s; check network access to {url} or the \
         api_base_url setting"
    )]
    Timeout {
        carrier: &'static str,
        seconds: u64,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "could not reach {carrier} at {url}: {}; check network access or api_base_url",
        chain(.source)
    )]
    Network {
        carrier: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{carrier} is not configured correctly: {message}")]
    Config {
        carrier: &'static str,
        message: String,
    },
    #[error("{carrier}: could not build the HTTP client: {}", chain(.source))]
    Client {
        carrier: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{carrier} calls cannot {what} (not supported by patterd for this carrier yet)")]
    Unsupported {
        carrier: &'static str,
        what: &'static str,
    },
    #[error(
        "{carrier} cannot {what} through patterd; text messages and number lookups go through a \
         Twilio, Telnyx or Plivo account"
    )]
    NoMessaging {
        carrier: &'static str,
        what: &'static str,
    },
}

/// An error and its causes, `: `-separated (what a log line or API message should show).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// The largest media WebSocket message any carrier ever sends us (a Twilio, Telnyx or Plivo
/// JSON frame with a 20 ms payload is under 1 KiB; Vonage's binary L16 frames are 640 bytes).
/// The media socket caps each message at this while its fragments are read, and the codecs
/// refuse a payload over it.
pub const MAX_MEDIA_MESSAGE: usize = 64 * 1024;

/// One media WebSocket message, as a codec sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaMessage<'a> {
    /// A text message (JSON for every carrier so far).
    Text(&'a str),
    /// A binary message (raw audio for Vonage's L16 socket).
    Binary(&'a [u8]),
}

/// Which kind of WebSocket message a codec's encoded commands are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Text,
    Binary,
}

/// Translates one carrier's media WebSocket messages to and from the neutral types.
///
/// A text codec implements [`Self::decode`] and [`Self::encode`] (or [`Self::encode_into`] on
/// the hot path); a codec whose socket also carries binary messages implements
/// [`Self::decode_binary`], and one whose outgoing messages are binary says so in
/// [`Self::encodes`] and implements [`Self::encode_into`].
pub trait MediaCodec: Send {
    /// Decodes one text message. `Ok(None)` for messages that carry nothing for the actor
    /// (e.g. Twilio's `connected`).
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError>;
    /// Decodes one binary message; carriers whose protocol has none refuse it.
    fn decode_binary(&mut self, _frame: &[u8]) -> Result<Option<MediaEvent>, CodecError> {
        Err(CodecError::Binary)
    }
    /// Decodes one message of either kind.
    fn decode_message(
        &mut self,
        message: MediaMessage<'_>,
    ) -> Result<Option<MediaEvent>, CodecError> {
        match message {
            MediaMessage::Text(text) => self.decode(text),
            MediaMessage::Binary(bytes) => self.decode_binary(bytes),
        }
    }
    /// The kind of message [`Self::encode_into`] writes.
    fn encodes(&self) -> MessageKind {
        MessageKind::Text
    }
    /// The kind of message [`Self::encode_into`] writes for `cmd`: [`Self::encodes`] unless
    /// the socket mixes kinds (Vonage: binary audio, text control messages).
    fn encodes_command(&self, _cmd: &MediaCommand) -> MessageKind {
        self.encodes()
    }
    /// Encodes one command as a text message; `None` for commands this protocol has no
    /// message for. Binary codecs leave it `None` and
    /// implement [`Self::encode_into`].
    fn encode(&mut self, _cmd: &MediaCommand) -> Option<String> {
        None
    }
    /// Encodes one command into `out` (cleared first; a message of [`Self::encodes`]'s kind),
    /// which the media pump reuses for every frame; false when the command is not a message.
    /// Codecs on the hot path override it to build the frame without allocating.
    fn encode_into(&mut self, cmd: &MediaCommand, out: &mut Vec<u8>) -> bool {
        out.clear();
        match self.encode(cmd) {
            Some(text) => {
                out.extend_from_slice(text.as_bytes());
                true
            }
            None => false,
        }
    }
    /// True when the carrier ends a stream by closing the socket without a `stop` (Plivo): a
    /// clean close then counts as [`MediaEvent::Stop`].
    fn stop_on_close(&self) -> bool {
        false
    }
    /// True when the other end shows the call's progress (the browser phone): the media pump
    /// then sends it [`CallProgress`] updates through [`Self::encode_progress`].
    fn wants_progress(&self) -> bool {
        false
    }
    /// How much of the call's progress the other end may see (only with
    /// [`Self::wants_progress`]).
    fn progress_view(&self) -> ProgressView {
        ProgressView::Caller
    }
    /// Encodes one progress update as a text frame.
    fn encode_progress(&mut self, _progress: &CallProgress) -> Option<String> {
        None
    }
}

/// Who watches a call's progress, and so how much of it they get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressView {
    /// The caller (a phone link, or a page opened without the API token): the transcript,
    /// the agent's state and the turn latencies, never tool arguments, tool results or
    /// provider errors.
    #[default]
    Caller,
    /// Someone with control access (the API token): the whole timeline.
    Full,
}

/// What a call's watcher (the browser phone's page) is told as the call goes, from the call's
/// own timeline and transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallProgress {
    /// A timeline event: its stored name (`turn_end`, `reply_first_frame`, …) and detail.
    Event {
        t_ms: u64,
        kind: String,
        detail: String,
    },
    /// A transcript entry, new or changed (the agent's heard text grows as marks come back).
    Transcript {
        index: usize,
        agent: bool,
        text: String,
        heard: String,
        interrupted: bool,
    },
}

/// A [`MediaCodec`] that can copy itself as it stands (the media pump encodes with a copy taken
/// after `start`, which knows the stream id). Every `Clone` codec is one.
pub trait SharedCodec: MediaCodec {
    fn clone_box(&self) -> Box<dyn SharedCodec>;
}

impl<C: MediaCodec + Clone + 'static> SharedCodec for C {
    fn clone_box(&self) -> Box<dyn SharedCodec> {
        Box::new(self.clone())
    }
}
