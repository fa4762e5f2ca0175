//! Plivo: everything patterd needs to speak to Plivo Voice. `X-Plivo-Signature-V3` webhook
//! signatures, single-use nonces, V2 refused ([`signature`]), answer XML with a bidirectional `<Stream>`
//! ([`xml`]), the audio stream codec including L16 ⇄ μ-law ([`codec`]), the REST calls
//! ([`rest`]), text messages and number lookups with the V2-signed message webhook
//! ([`sms`]), its `[carriers.NAME]` keys ([`config`]) and its routes and
//! [`crate::carrier::Carrier`] implementation ([`routes`]).

pub mod codec;
pub mod config;
pub mod numbers;
pub mod rest;
pub mod routes;
pub mod signature;
pub mod sms;
pub mod xml;

pub use config::Config;
pub use numbers::admin;
pub use routes::build;
pub use codec::PlivoCodec;
pub use rest::PlivoRest;
pub use signature::{Nonces, string_to_sign_v3, validate_request};
pub use xml::{speak_hangup_xml, stream_xml};
pub(crate) use xml::{dial_xml, hangup_xml};

/// The WebSocket subprotocol Plivo's media client asks for; the handshake fails unless we
/// select it.
pub const SUBPROTOCOL: &str = "audio.drachtio.org";
/// Content type patterd asks Plivo to stream in (μ-law passes straight through to STT).
pub const CONTENT_TYPE: &str = "audio/x-mulaw;rate=8000";
