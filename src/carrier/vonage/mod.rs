//! Vonage Voice API: everything patterd needs to speak to Vonage. Webhooks signed with an
//! HS256 JWT in `Authorization: Bearer …` (the account's signature secret; `iat` skew, `jti`
//! replay and the body's `payload_hash` checked, [`signature`]), the answer NCCO whose
//! `connect` action has a `websocket` endpoint ([`ncco`]), the media socket codec (binary
//! 16-bit little-endian L16 at 16 kHz ⇄ the core's μ-law 8 kHz, text JSON for control,
//! [`codec`]), the REST calls with an RS256 application JWT ([`rest`]), its
//! `[carriers.NAME]` keys ([`config`]) and its routes and [`crate::carrier::Carrier`]
//! implementation ([`routes`]).

pub mod codec;
pub mod config;
pub mod ncco;
pub mod rest;
pub mod routes;
pub mod signature;

pub(crate) use codec::VonageCodec;
pub use config::Config;
pub(crate) use rest::VonageRest;
pub use routes::build;

/// The media format patterd asks Vonage to stream in (both directions).
pub const CONTENT_TYPE: &str = "audio/l16;rate=16000";

/// Vonage has no number administration in patterd yet.
pub fn admin(_: &Config) -> Result<Box<dyn super::admin::NumberAdmin>, super::CarrierError> {
    Err(super::CarrierError::Unsupported {
        carrier: "vonage",
        what: "administer phone numbers (link the number to the application in Vonage's dashboard)",
    })
}
