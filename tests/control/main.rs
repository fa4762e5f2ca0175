//! The control surfaces, one binary: the REST API (`api`), outbound calls over every carrier
//! (`outbound`), MCP with the official Python client (`mcp`) and the daemon as a child process
//! (`daemon`), and issue 11's security holes across the daemon's edges (`security`).

#[path = "../common/mod.rs"]
mod common;

mod api;
mod daemon;
mod mcp;
mod outbound;
mod security;
