//! The control surfaces, one binary: the REST API (`api`), outbound calls over every carrier
//! (`outbound`), the outbound caps under a race (`outbound_caps`), MCP with the official Python
//! client (`mcp`), the daemon as a child process (`daemon`), the caller's keypad against it
//! (`keypad`), voicemail after the beep (`voicemail`), the security holes across the daemon's
//! edges (`security`), the API tokens' scopes (`scopes`) and text messages and number lookups
//! over every SMS carrier (`sms`).

#[path = "../common/mod.rs"]
mod common;

mod api;
mod daemon;
mod keypad;
mod mcp;
mod ops;
mod outbound;
mod outbound_caps;
mod phone_view;
mod reload;
mod scopes;
mod security;
mod sms;
mod systemd;
mod voicemail;
mod web;
