//! `patterd_sim`: simulators of the peers patterd talks to — the Twilio, Telnyx and Plivo
//! carriers (webhooks signed as each carrier signs them, media streams in each dialect, REST
//! fakes), Deepgram, AssemblyAI, an OpenAI-compatible transcription server, ElevenLabs, a Hermes Agent and
//! the HTTP endpoints tools call — each speaking the documented wire protocol on 127.0.0.1 (the
//! carriers also decode in-band DTMF in the agent audio, [`dtmf`]). patterd's integration tests
//! (a dev-dependency) and the load generator drive
//! whole calls through them; they are as strict as the real peers. The daemon never depends on
//! this crate; it depends on the daemon for codecs and signature checks.

pub mod alignment;
pub mod assemblyai;
pub mod cartesia;
pub mod config;
pub mod deepgram;
pub mod dtmf;
pub mod elevenlabs;
mod elevenlabs_ws;
pub mod flux;
pub mod hermes;
pub mod http;
pub mod openai_realtime;
pub mod openai_speech;
pub mod plivo;
pub mod stream;
pub mod telnyx;
pub mod tone;
pub mod tool_endpoint;
pub mod transcribe;
pub mod twilio;
pub mod words;
pub mod ws;
pub mod ws_conn;
