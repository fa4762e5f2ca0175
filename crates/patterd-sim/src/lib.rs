//! `patterd_sim`: simulators of the peers patterd talks to — the Twilio, Telnyx and Plivo
//! carriers (webhooks signed as each carrier signs them, media streams in each dialect, REST
//! fakes), Deepgram, AssemblyAI, an OpenAI-compatible transcription server, ElevenLabs, a
//! Hermes Agent, the HTTP endpoints tools and `[[webhooks]]` call and an OpenTelemetry
//! collector's OTLP/HTTP receiver ([`otlp`]) — each speaking the documented wire protocol on
//! 127.0.0.1 (the
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
pub mod front;
pub mod hermes;
pub mod http;
pub mod openai_realtime;
pub mod openai_speech;
pub mod otlp;
pub mod plivo;
pub mod postgres;
pub mod sms;
pub mod stream;
pub mod telnyx;
pub mod tone;
pub mod tool_endpoint;
pub mod transcribe;
pub mod twilio;
pub mod vonage;
pub mod webhook_receiver;
pub mod words;
pub mod ws;
pub mod ws_conn;

/// Waits `d` before a fake's next chunk; no wait at all for zero. A zero `sleep` still goes
/// through the runtime's timer and wakes on its next timer turn — on a busy fakes thread
/// that stalled each chunk of a TTS reply by milliseconds to over 100 ms, gaps the real
/// services do not have (measured with the load generator at 1,000 calls).
pub(crate) async fn pause(d: std::time::Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_zero_pause_does_not_touch_the_timer() {
        // A runtime without a timer panics on any `sleep`, zero included.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(super::pause(Duration::ZERO));
    }
}
