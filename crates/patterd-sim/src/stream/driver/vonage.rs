//! The Vonage dialect of the stream driver: binary L16 16 kHz agent audio and the JSON control
//! messages (`notify` for marks, `clear`), checked as strictly as the other dialects.

use serde_json::Value;

use super::Driver;

impl Driver {
    /// Vonage agent audio: binary L16 16 kHz, whole 20 ms frames; played as μ-law 8 kHz.
    pub(super) fn on_vonage_audio(&mut self, pcm: &[u8]) {
        if !pcm.len().is_multiple_of(4) || pcm.len() > 64 * 1024 {
            self.protocol_error(format!("binary L16 16 kHz message of {} bytes", pcm.len()));
            return;
        }
        let ulaw: Vec<u8> = pcm
            .chunks_exact(4)
            .map(|b| patterd::audio::g711::linear_to_ulaw(i16::from_le_bytes([b[0], b[1]])))
            .collect();
        self.on_agent_audio(&ulaw);
    }

    /// Vonage control messages: `{"action":"notify","payload":{…}}` and `{"action":"clear"}`.
    pub(super) async fn on_vonage_frame(&mut self, v: &Value, short: &str) -> bool {
        match v.get("action").and_then(Value::as_str).unwrap_or("") {
            "notify" => match v.pointer("/payload/mark").and_then(Value::as_str) {
                Some(name) => self.on_mark(name.to_string()).await,
                None => {
                    self.protocol_error(format!("notify without payload.mark: {short}"));
                    true
                }
            },
            "clear" => self.on_clear().await,
            other => {
                self.protocol_error(format!("unknown or missing action `{other}`: {short}"));
                true
            }
        }
    }
}
