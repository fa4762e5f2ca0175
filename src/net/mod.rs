//! Network plumbing shared by provider clients and simulators: the WebSocket client
//! ([`ws_client`]) over plain TCP or rustls.

pub mod ws_client;
