//! Telnyx Call Control: everything patterd needs to speak to Telnyx. Ed25519 webhook signatures
//! ([`signature`]), the webhook envelope ([`webhook`]), Call Control REST commands — answer,
//! streaming_start, speak, reject, hangup, dial ([`rest`]) — the media streaming codec
//! ([`codec`]), text messages and number lookups ([`sms`]), its `[carriers.NAME]` keys
//! ([`config`]) and its routes and [`crate::carrier::Carrier`] implementation ([`routes`]).

pub mod codec;
pub mod config;
pub mod numbers;
pub mod rest;
pub mod routes;
pub mod signature;
pub mod sms;
pub mod webhook;

pub use config::Config;
pub use numbers::admin;
pub use routes::build;
pub use codec::TelnyxCodec;
pub use rest::StreamParams;
pub(crate) use rest::TelnyxRest;
pub use signature::{SignatureError, verify_webhook};
pub use webhook::{CallEvent, WebhookEnvelope, WebhookError};

/// Header carrying the base64 Ed25519 signature.
pub const SIGNATURE_HEADER: &str = "telnyx-signature-ed25519";
/// Header carrying the Unix timestamp that is part of the signed message.
pub(crate) const TIMESTAMP_HEADER: &str = "telnyx-timestamp";
