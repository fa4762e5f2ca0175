//! Wire-level tests, one binary: the shared carrier vectors (G.711, signatures, answer
//! documents, REST bodies, media sessions), the provider clients against their fakes, the HTTP
//! server's limits and configuration loading. Nothing here places a whole call.

#[path = "../common/mod.rs"]
mod common;

mod carrier_vectors;
mod config;
mod providers;
mod server;
mod twilio;
