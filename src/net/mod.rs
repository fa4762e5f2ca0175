//! Network plumbing shared by provider clients, carrier routes and simulators: the WebSocket
//! client ([`ws_client`]) over plain TCP or rustls, full-duplex socket use ([`ws_pump`]), and
//! the server-side HTTP helpers every handler uses ([`http`]: response bodies, bounded body
//! reads), and the SSRF guard for URLs called on a tool's behalf ([`ssrf`]).

pub mod http;
pub(crate) mod ssrf;
pub mod ws_client;
pub mod ws_pump;
