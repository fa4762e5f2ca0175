//! Network plumbing shared by provider clients, carrier routes and simulators: the WebSocket
//! client ([`ws_client`]) over plain TCP or rustls, full-duplex socket use ([`ws_pump`]), and
//! the server-side HTTP helpers every handler uses ([`http`]: response bodies, bounded body
//! reads).

pub mod http;
pub mod ws_client;
pub mod ws_pump;
