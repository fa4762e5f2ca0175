//! In-repo simulators of the peers patterd talks to — a Twilio carrier, Deepgram, ElevenLabs and
//! a Hermes Agent — each speaking the documented wire protocol on 127.0.0.1. Integration tests
//! and the load generator drive whole calls through them; they are as strict as the real peers.

pub mod deepgram;
pub mod elevenlabs;
pub mod hermes;
pub mod http;
pub mod plivo;
pub mod stream;
pub mod telnyx;
pub mod tone;
pub mod twilio;
pub mod ws;
