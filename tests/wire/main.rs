//! Wire-level tests, one binary: the shared carrier vectors (G.711, signatures, answer
//! documents, REST bodies, media sessions), the provider clients against their fakes, the HTTP
//! server's limits and configuration loading, Plivo's signature replay and V2 refusals, and
//! the parsers under random input (`parsers`, proptest). Nothing here places a whole call.

#[path = "../common/mod.rs"]
mod common;

mod carrier_vectors;
mod config;
mod k8s;
mod parsers;
mod plivo_signature;
mod providers;
mod server;
mod speech_cartesia;
mod speech_openai;
mod stt_openai_realtime;
mod tts_alignment;
mod twilio;
mod twilio_sim;
