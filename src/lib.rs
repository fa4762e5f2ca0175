//! patterd: a voice gateway daemon that gives an AI agent a phone line.
//!
//! The library crate holds every piece of the daemon so that integration tests and the
//! benchmark tools can drive them directly; `src/main.rs` is only the command line. The
//! simulators (`crates/patterd-sim`) and the load generator (`crates/patterd-loadgen`) are
//! separate workspace crates, so nothing here exists only for them.
//! `docs/ARCHITECTURE.md` is the map of these modules.
//!
//! Items are `pub(crate)` unless a target outside the library (the binary, the integration
//! tests, the benchmarks, the examples, the workspace crates) uses them; `unreachable_pub` keeps
//! it so.

#![warn(unreachable_pub)]

pub mod api;
pub mod app;
pub mod audio;
pub mod call;
pub mod carrier;
pub mod cli;
pub mod config;
pub mod logging;
pub mod mcp;
pub mod net;
pub mod ops;
pub mod provider;
pub mod security;
pub mod server;
pub mod store;
pub mod tools;
pub mod util;

#[cfg(test)]
mod layers;
