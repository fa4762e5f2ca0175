//! Typed provider errors. Setting a provider up ([`SetupError`]) and running one turn of a brain
//! ([`LlmError`]) or one synthesis ([`TtsError`]) fail in ways a caller can match on, and each
//! keeps its underlying `reqwest` error as its `source()`. Their `Display` texts are what the
//! call timeline records (`llm_error` / `tts_error` details) and what logs show, so they say what
//! to check.

use std::time::Duration;

use super::openai::describe_reqwest;

/// A provider could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("could not build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("stt base_url `{0}` must start with wss://, ws://, https:// or http://")]
    SttBaseUrl(String),
    /// Names the `[section.name]` table the error came from.
    #[error("[{section}.{name}]: {source}")]
    In {
        section: &'static str,
        name: String,
        #[source]
        source: Box<SetupError>,
    },
}

impl SetupError {
    /// Places this error in the `[section.name]` table it came from.
    pub fn within(self, section: &'static str, name: &str) -> Self {
        SetupError::In {
            section,
            name: name.to_string(),
            source: Box::new(self),
        }
    }
}

/// One brain turn failed. The caller hears `llm_error_message`; this text goes on the timeline.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("no first token within {0:?}")]
    NoFirstToken(Duration),
    #[error("no complete reply within {0:?}")]
    NoCompleteReply(Duration),
    #[error("request failed: {}", describe_reqwest(.0))]
    Request(#[source] reqwest::Error),
    #[error("HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("stream failed: {}", describe_reqwest(.0))]
    Stream(#[source] reqwest::Error),
    #[error(
        "the brain's stream broke the limits of Server-Sent Events we accept (a line over {} bytes or an event over {} bytes)",
        super::sse::MAX_LINE_BYTES,
        super::sse::MAX_EVENT_BYTES
    )]
    Oversized,
    #[error("truncated: the stream ended before a finish_reason")]
    Truncated,
    #[error("the brain reported an error: {0}")]
    Reported(String),
    #[error("Hermes run failed: {0}")]
    HermesFailed(String),
    #[error("the brain finished with an error")]
    FinishedWithError,
    #[error("the turn was abandoned")]
    Abandoned,
}

/// One synthesis failed. The sentence is skipped; this text goes on the timeline.
#[derive(Debug, thiserror::Error)]
pub enum TtsError {
    #[error("ElevenLabs did not answer within {0:?}")]
    NoAnswer(Duration),
    #[error("ElevenLabs request failed: {}", describe_reqwest(.0))]
    Request(#[source] reqwest::Error),
    #[error("ElevenLabs HTTP {status} ({content_type}): {message}{hint}")]
    Http {
        status: u16,
        content_type: String,
        message: String,
        /// What to check for this status (`""` when there is nothing specific).
        hint: &'static str,
    },
    #[error("ElevenLabs audio stalled for {0:?}")]
    Stalled(Duration),
    #[error("ElevenLabs stream failed: {}", describe_reqwest(.0))]
    Stream(#[source] reqwest::Error),
    #[error("ElevenLabs sent more than {0} bytes of audio for one piece of text; cut")]
    TooMuchAudio(usize),
    #[error("synthesis abandoned")]
    Abandoned,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_errors_name_their_table_and_keep_the_source() {
        let e = SetupError::SttBaseUrl("ftp://x".into()).within("stt", "deepgram");
        assert_eq!(
            e.to_string(),
            "[stt.deepgram]: stt base_url `ftp://x` must start with wss://, ws://, https:// or http://"
        );
        let src = std::error::Error::source(&e).expect("source");
        assert!(src.to_string().starts_with("stt base_url"));
    }

    #[test]
    fn turn_errors_read_as_before() {
        assert_eq!(
            LlmError::Http {
                status: 401,
                message: "bad key".into()
            }
            .to_string(),
            "HTTP 401: bad key"
        );
        assert_eq!(
            TtsError::Http {
                status: 404,
                content_type: "application/json".into(),
                message: "voice not found".into(),
                hint: " (check [tts] voice_id)",
            }
            .to_string(),
            "ElevenLabs HTTP 404 (application/json): voice not found (check [tts] voice_id)"
        );
    }
}
