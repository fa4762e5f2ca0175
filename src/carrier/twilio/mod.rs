//! Twilio: everything patterd needs to speak to Twilio Programmable Voice. Webhook signature
//! checks ([`signature`]), webhook form parsing and public-URL reconstruction ([`webhook`]),
//! TwiML answer documents ([`twiml`]), the Media Streams codec ([`codec`]), the REST client
//! that places and hangs up calls ([`rest`]), text messages and number lookups ([`sms`]), its
//! `[carriers.NAME]` keys ([`config`]) and its routes and [`crate::carrier::Carrier`]
//! implementation ([`routes`]).

pub mod codec;
pub mod config;
pub mod numbers;
pub mod rest;
pub mod routes;
pub mod signature;
pub mod sms;
pub mod twiml;
pub mod webhook;

pub use config::Config;
pub use numbers::admin;
pub use routes::build;
pub use codec::TwilioCodec;
pub use rest::TwilioRest;
pub use signature::{
    SignatureAlgorithm, compute_signature, string_to_sign, validate_signature,
    validate_signature_json,
};
pub use twiml::{twiml_connect_stream, twiml_hangup, twiml_reject, twiml_say_hangup};
pub use webhook::{VoiceWebhook, WebhookError, parse_form, public_request_url, public_ws_url};

/// Header carrying the webhook signature.
pub const SIGNATURE_HEADER: &str = "X-Twilio-Signature";
