//! Typed provider errors. Setting a provider up ([`SetupError`]) and running one turn of a brain
//! ([`LlmError`]) or one synthesis ([`TtsError`]) fail in ways a caller can match on, and each
//! keeps its underlying `reqwest` error as its `source()`. Their `Display` texts are what the
//! call timeline records (`llm_error` / `tts_error` details) and what logs show, so they say what
//! to check.

use std::time::Duration;

use super::LlmEvent;
use super::openai::describe_reqwest;

/// A provider could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("could not build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("stt base_url `{0}` must start with wss://, ws://, https:// or http://")]
    SttBaseUrl(String),
    #[error("{0}")]
    Resampler(#[from] crate::audio::resample::ResampleError),
    /// An engine that runs on this machine (`piper`, `flite`, `whisper`) cannot start (its
    /// model file, its program, its build); the text says what to install or fix.
    #[error("{0}")]
    Engine(String),
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
    Http {
        status: u16,
        message: String,
        /// The response's `Retry-After`, when it had one we could read.
        retry_after: Option<Duration>,
    },
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

impl LlmError {
    /// Whether the brain may be back soon rather than refusing this request: it could not be
    /// reached or the connection broke before the reply ended (a restart), or it answered
    /// 429, 502 or 503 (busy, or a proxy in front of a brain that is down). A timeout is not:
    /// the request may still be running there.
    pub fn unavailable(&self) -> bool {
        match self {
            LlmError::Request(e) => !e.is_builder() && !e.is_timeout(),
            LlmError::Stream(_) | LlmError::Truncated => true,
            LlmError::Http { status, .. } => matches!(status, 429 | 502 | 503),
            _ => false,
        }
    }

    /// The event a brain sends for this failure: [`LlmEvent::Unavailable`] (with the
    /// server's `Retry-After`) when [`LlmError::unavailable`], else [`LlmEvent::Error`].
    pub(crate) fn event(&self) -> LlmEvent {
        if !self.unavailable() {
            return LlmEvent::Error(self.to_string());
        }
        let retry_after = match self {
            LlmError::Http { retry_after, .. } => *retry_after,
            _ => None,
        };
        LlmEvent::Unavailable {
            message: self.to_string(),
            retry_after,
        }
    }
}

/// A `Retry-After` value (RFC 9110: delay-seconds or an HTTP-date) as a wait from `now`;
/// `None` when it is neither. A date in the past is no wait.
pub(crate) fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// One synthesis failed. The sentence is skipped (or, in a chain, spoken by the next TTS when
/// [`TtsError::switchable`]); this text goes on the timeline. `vendor` names the service.
#[derive(Debug, thiserror::Error)]
pub enum TtsError {
    #[error("{vendor} did not answer within {after:?}")]
    NoAnswer {
        vendor: &'static str,
        after: Duration,
    },
    #[error("{vendor} request failed: {}", describe_reqwest(.source))]
    Request {
        vendor: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{vendor} HTTP {status} ({content_type}): {message}{hint}")]
    Http {
        vendor: &'static str,
        status: u16,
        content_type: String,
        message: String,
        /// What to check for this status (`""` when there is nothing specific).
        hint: &'static str,
    },
    #[error("{vendor} audio stalled for {after:?}")]
    Stalled {
        vendor: &'static str,
        after: Duration,
    },
    #[error("{vendor} stream failed: {}", describe_reqwest(.source))]
    Stream {
        vendor: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{vendor} sent more than {limit} bytes of audio for one piece of text; cut")]
    TooMuchAudio { vendor: &'static str, limit: usize },
    /// A WebSocket vendor could not be reached or refused the socket.
    #[error("{vendor} connection failed: {message}")]
    Connect {
        vendor: &'static str,
        message: String,
    },
    /// A WebSocket vendor reported an error or closed the socket.
    #[error("{vendor} error: {message}")]
    Reported {
        vendor: &'static str,
        message: String,
        /// The vendor's status (HTTP-style) when it sent one.
        status: Option<u16>,
    },
    /// An engine that runs on this machine failed on this piece of text (its program died
    /// or hung, the model failed); another TTS in a chain may speak it.
    #[error("{vendor} failed: {message}")]
    Engine {
        vendor: &'static str,
        message: String,
    },
    #[error("synthesis abandoned")]
    Abandoned,
}

impl TtsError {
    /// Whether another TTS should speak the sentence instead: the service could not be
    /// reached, did not answer, or answered 5xx or 429 (a busy or broken service, not a
    /// request it will refuse wherever it is sent).
    pub fn switchable(&self) -> bool {
        match self {
            TtsError::NoAnswer { .. } | TtsError::Connect { .. } | TtsError::Engine { .. } => true,
            // No response at all: refused, reset, TLS or timeout (a request we built badly
            // would fail the same way anywhere).
            TtsError::Request { source, .. } => !source.is_builder(),
            TtsError::Http { status, .. } => *status == 429 || *status >= 500,
            TtsError::Reported { status, .. } => status.is_some_and(|s| s == 429 || s >= 500),
            _ => false,
        }
    }

    /// The last event of a synthesis that ended with `result`: `Done`, the failure's event
    /// (logged), or none when the stream was abandoned (nobody is listening).
    pub(crate) fn final_event(result: Result<(), TtsError>) -> Option<super::TtsEvent> {
        match result {
            Ok(()) => Some(super::TtsEvent::Done),
            Err(TtsError::Abandoned) => None,
            Err(e) => {
                tracing::warn!(error = %e, "speech synthesis failed");
                Some(e.event())
            }
        }
    }

    /// The event a provider sends for this failure.
    pub fn event(&self) -> super::TtsEvent {
        if self.switchable() {
            super::TtsEvent::Unavailable(self.to_string())
        } else {
            super::TtsEvent::Error(self.to_string())
        }
    }
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
    fn brain_failures_a_retry_may_fix_are_unavailable() {
        let http = |status| LlmError::Http {
            status,
            message: "x".into(),
            retry_after: Some(Duration::from_secs(2)),
        };
        for status in [429, 502, 503] {
            assert_eq!(
                http(status).event(),
                LlmEvent::Unavailable {
                    message: format!("HTTP {status}: x"),
                    retry_after: Some(Duration::from_secs(2)),
                }
            );
        }
        for status in [400, 401, 404, 500, 504] {
            assert!(
                matches!(http(status).event(), LlmEvent::Error(_)),
                "{status}"
            );
        }
        assert!(LlmError::Truncated.unavailable());
        assert!(!LlmError::NoFirstToken(Duration::from_secs(1)).unavailable());
        assert!(!LlmError::HermesFailed("x".into()).unavailable());
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn turn_errors_read_as_before() {
        assert_eq!(
            LlmError::Http {
                status: 401,
                message: "bad key".into(),
                retry_after: None,
            }
            .to_string(),
            "HTTP 401: bad key"
        );
        assert_eq!(
            TtsError::Http {
                vendor: "ElevenLabs",
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
