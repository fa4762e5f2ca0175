//! Network plumbing shared by provider clients and simulators: the WebSocket client
//! ([`ws_client`]) over plain TCP or rustls, and full-duplex socket use ([`ws_pump`]).

pub mod ws_client;
pub mod ws_pump;
