//! Pieces of a patterd configuration that point the daemon at the simulators.

/// Where the simulators listen and the credentials they check: the `[stt.deepgram]`,
/// `[tts.elevenlabs]` and `[carriers.twilio]` sections of a daemon configuration.
pub struct SimSections<'a> {
    /// Fake Deepgram's base URL and API key.
    pub deepgram: (&'a str, &'a str),
    /// Fake ElevenLabs' base URL and API key.
    pub elevenlabs: (&'a str, &'a str),
    /// Fake Twilio REST's base URL.
    pub twilio_rest: &'a str,
    pub account_sid: &'a str,
    pub auth_token: &'a str,
}

impl SimSections<'_> {
    /// The three sections as TOML (no trailing newline).
    pub fn toml(&self) -> String {
        let (dg, dg_key) = self.deepgram;
        let (el, el_key) = self.elevenlabs;
        format!(
            r#"[stt.deepgram]
kind = "deepgram"
api_key = "{dg_key}"
base_url = "{dg}"

[tts.elevenlabs]
kind = "elevenlabs"
api_key = "{el_key}"
voice_id = "voice123"
base_url = "{el}"

[carriers.twilio]
kind = "twilio"
account_sid = "{account_sid}"
auth_token = "{auth_token}"
api_base_url = "{rest}""#,
            rest = self.twilio_rest,
            account_sid = self.account_sid,
            auth_token = self.auth_token,
        )
    }
}
