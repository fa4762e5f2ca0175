//! The browser phone: talk to an agent from a web page on this machine, without a phone
//! number. `GET /phone` serves one self-contained page ([`page`]: inline JS and CSS, two
//! AudioWorklets, no external assets) that captures the microphone, streams it over
//! `GET /phone/socket` ([`codec`]: JSON frames of μ-law 8 kHz, 20 ms) and plays the agent;
//! [`routes`] authenticates both (the control API's credentials or a signed, expiring,
//! single-use phone link from `patterd phone-link`, and a loopback or own `Origin`), admits the
//! call through the same admission and call actor as a phone call, and hands the socket to the
//! carrier-neutral media pump. The page also receives the call's progress (transcript and
//! timeline events) on the same socket. `config.rs` holds its (optional) `[carriers.NAME]` keys.

pub mod codec;
pub mod config;
pub mod page;
pub mod routes;

pub(crate) use codec::WebCodec;
pub use config::Config;
pub use routes::build;

/// The browser phone has no phone numbers to administer (no credential check, no wiring).
pub fn admin(_: &Config) -> Result<Box<dyn super::admin::NumberAdmin>, super::CarrierError> {
    Err(super::CarrierError::Unsupported {
        carrier: "web",
        what: "administer phone numbers (it has none)",
    })
}
