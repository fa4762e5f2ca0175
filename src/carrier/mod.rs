//! The carrier-neutral core. Every carrier module maps its webhooks and media frames onto the
//! types here, and the call actor only ever sees these: [`MediaEvent`]s in, [`MediaCommand`]s
//! out. Adding a carrier means one new submodule implementing [`MediaCodec`] and the webhook
//! handlers; the call actor does not change.

pub mod plivo;
pub mod rest_client;
pub mod telnyx;
pub mod twilio;

pub use twilio::webhook::{public_request_url, public_ws_url};

use std::collections::BTreeMap;

use bytes::Bytes;

/// Duration of one carrier audio frame.
pub const FRAME_MS: u64 = 20;
/// Bytes of 8 kHz G.711 in one 20 ms frame.
pub const FRAME_BYTES: usize = 160;

/// Which carrier a call came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CarrierKind {
    Twilio,
    Telnyx,
    Plivo,
}

impl CarrierKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CarrierKind::Twilio => "twilio",
            CarrierKind::Telnyx => "telnyx",
            CarrierKind::Plivo => "plivo",
        }
    }
}

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

/// Something the call actor wants the carrier to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaCommand {
    /// Agent audio: μ-law 8 kHz, normally one 20 ms frame.
    Audio(Bytes),
    /// Ask the carrier to tell us when everything queued so far has played.
    Mark(String),
    /// Drop all queued agent audio at once (barge-in).
    Clear,
    /// End the call (REST hang-up, then close the media socket).
    HangUp,
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
    #[error("binary frames are not part of this protocol")]
    Binary,
    #[error("field `{0}` has an invalid value")]
    InvalidField(&'static str),
    #[error("unsupported media format: {0}")]
    UnsupportedFormat(String),
}

/// A carrier REST call that failed. Messages say what to check, since they end up in logs and
/// `patterd doctor` output.
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
    },
    #[error("could not reach {carrier} at {url}: {message}; check network access or api_base_url")]
    Network {
        carrier: &'static str,
        url: String,
        message: String,
    },
    #[error("{carrier} is not configured correctly: {message}")]
    Config {
        carrier: &'static str,
        message: String,
    },
}

/// Translates one carrier's media WebSocket text frames to and from the neutral types.
pub trait MediaCodec: Send {
    /// Decodes one text frame. `Ok(None)` for frames that carry nothing for the actor
    /// (e.g. Twilio's `connected`).
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError>;
    /// Encodes one command as a text frame; `None` for commands that are not frames
    /// (hang-up goes through the carrier's REST API).
    fn encode(&mut self, cmd: &MediaCommand) -> Option<String>;
    /// True when the carrier ends a stream by closing the socket without a `stop` (Plivo): a
    /// clean close then counts as [`MediaEvent::Stop`].
    fn stop_on_close(&self) -> bool {
        false
    }
}
