//! patterd: a voice gateway daemon that gives an AI agent a phone line.
//!
//! The library crate holds every piece of the daemon so that integration tests and the
//! benchmark tools can drive them directly; `src/main.rs` is only the command line.
//! `docs/ARCHITECTURE.md` is the map of these modules.

pub mod api;
pub mod app;
pub mod audio;
pub mod call;
pub mod carrier;
pub mod cli;
pub mod config;
pub mod loadgen;
pub mod logging;
pub mod mcp;
pub mod net;
pub mod provider;
pub mod security;
pub mod server;
pub mod sim;
pub mod store;
pub mod util;

#[cfg(test)]
mod layers;
