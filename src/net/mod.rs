//! Network plumbing shared by provider clients, carrier routes and simulators: the WebSocket
//! client ([`ws_client`]) over plain TCP or rustls, full-duplex socket use ([`ws_pump`]), and
//! the server-side HTTP helpers every handler uses ([`http`]: response bodies, bounded body
//! reads), the SSRF guard for URLs called on a tool's behalf ([`ssrf`]) and the Standard Webhooks
//! signatures of the webhooks patterd sends ([`webhook_sign`]).

pub mod http;
pub(crate) mod ssrf;
pub(crate) mod webhook_sign;
pub mod ws_client;
pub mod ws_pump;
