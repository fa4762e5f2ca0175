//! A failed API operation: [`ApiError`] (an HTTP status, a stable [`ErrorCode`] and a message
//! that says what to do) and its JSON body `{"error": {"code", "message"}}`. The codes are one
//! list (`error_codes!`): each line is a variant and the string clients see, so the enum, its
//! serde names and [`ErrorCode::as_str`] cannot disagree. docs/api.md lists them by status.

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};

use crate::store::StoreError;

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The stable, machine-readable part of an [`ApiError`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        pub enum ErrorCode {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl ErrorCode {
            /// Every code, for exhaustive tests.
            pub const ALL: [ErrorCode; [$(ErrorCode::$variant),*].len()] =
                [$(ErrorCode::$variant),*];

            /// The code as clients see it (snake_case).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                }
            }
        }
    };
}

error_codes! {
    /// The request's query or body is not what the operation takes.
    InvalidRequest = "invalid_request",
    /// The body could not be read (too large, or the connection failed).
    BadBody = "bad_body",
    /// A number is not a valid phone number.
    InvalidNumber = "invalid_number",
    /// A number is not one of patterd's numbers.
    UnknownNumber = "unknown_number",
    /// No or a wrong bearer token.
    Unauthorized = "unauthorized",
    /// Token-less local mode: the `Host` is not a loopback name.
    ForbiddenHost = "forbidden_host",
    /// Token-less local mode: the peer is not a loopback address.
    ForbiddenPeer = "forbidden_peer",
    /// Token-less local mode: the request came through a proxy.
    ProxiedRequest = "proxied_request",
    /// The `Origin` is not `public_url`'s.
    ForbiddenOrigin = "forbidden_origin",
    /// The token's scope does not cover the request (a `read` token acting, a `call` token
    /// on another call).
    ForbiddenScope = "forbidden_scope",
    /// Too many failed authentications from this peer: wait `Retry-After` seconds.
    TooManyFailures = "too_many_failures",
    /// A `POST`/`PUT` without `Content-Type: application/json`.
    UnsupportedMediaType = "unsupported_media_type",
    /// No call (or number) by that name.
    NotFound = "not_found",
    /// No such API route.
    UnknownRoute = "unknown_route",
    /// The route exists, the method does not.
    MethodNotAllowed = "method_not_allowed",
    /// The call was not recorded, or its recording is not complete.
    NoRecording = "no_recording",
    /// The recording exists but could not be read.
    RecordingUnreadable = "recording_unreadable",
    /// No webhook delivery by that id.
    NoDelivery = "no_delivery",
    /// Only a dead-lettered webhook delivery can be retried by hand.
    DeliveryNotDead = "delivery_not_dead",
    /// The call has ended.
    CallNotLive = "call_not_live",
    /// The call runs on another instance of the cluster, which did not answer in time; retry
    /// after `Retry-After` seconds (it is closed once that instance is declared lost).
    OwnerUnreachable = "owner_unreachable",
    /// The call's actor is not taking requests right now.
    CallBusy = "call_busy",
    /// The agent's policy refused the action.
    ActionRefused = "action_refused",
    /// The carrier or the call could not carry the action out.
    ActionFailed = "action_failed",
    /// The `from` number may not place calls.
    OutboundDisabled = "outbound_disabled",
    /// The destination is not in the `from` number's `allowed_destinations`.
    DestinationNotAllowed = "destination_not_allowed",
    /// The concurrent outbound cap is reached.
    ConcurrentLimit = "concurrent_limit",
    /// The daily outbound cap is reached.
    DailyLimit = "daily_limit",
    /// `[outbound] max_sms_per_day` is reached.
    SmsDailyLimit = "sms_daily_limit",
    /// A text message body is longer than `[outbound] max_sms_chars`.
    BodyTooLong = "body_too_long",
    /// The account's carrier cannot send text messages or look numbers up.
    MessagingUnsupported = "messaging_unsupported",
    /// The cluster's outbound caps could not be checked in the store (fail closed).
    CapsUnavailable = "caps_unavailable",
    /// The agent or its providers cannot take a call.
    AgentUnavailable = "agent_unavailable",
    /// The daemon is draining.
    Draining = "draining",
    /// The daemon is at `max_calls`.
    Busy = "busy",
    /// The carrier gave a call id that is already live.
    Duplicate = "duplicate",
    /// The request went away while the carrier was dialling (the call was cancelled).
    Abandoned = "abandoned",
    /// The number's carrier is not configured.
    CarrierUnconfigured = "carrier_unconfigured",
    /// The carrier refused or failed the request.
    CarrierError = "carrier_error",
    /// The store's queue is full.
    StoreBusy = "store_busy",
    /// The store failed.
    StoreError = "store_error",
    /// The daemon is stopping (in-process MCP).
    Stopping = "stopping",
    /// `patterd mcp --stdio` cannot reach the daemon.
    DaemonUnreachable = "daemon_unreachable",
    /// `patterd mcp --stdio`: the daemon answered with an error.
    RemoteError = "remote_error",
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed API operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for a `Retry-After` header (a 429).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, ErrorCode::InvalidRequest, message)
    }

    pub fn not_found(call_id: &str) -> Self {
        Self::new(
            404,
            ErrorCode::NotFound,
            format!(
                "call `{}` not found; list calls with GET /v1/calls (get_calls)",
                call_id.escape_default()
            ),
        )
    }

    /// The headers this error's status calls for: `WWW-Authenticate` on 401, `Retry-After`
    /// when it says how long to wait.
    pub(crate) fn add_headers(&self, headers: &mut hyper::HeaderMap) {
        if self.status == 401 {
            headers.insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer realm=\"patterd\""),
            );
        }
        if let Some(s) = self.retry_after_s {
            headers.insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from(s),
            );
        }
    }

    /// The JSON error body: `{"error": {"code", "message"}}`.
    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Busy => ApiError::new(503, ErrorCode::StoreBusy, e.to_string()),
            e => ApiError::new(500, ErrorCode::StoreError, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_serialises_as_its_name() {
        let mut names = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(names.insert(c.as_str()), "duplicate code {c}");
            assert_eq!(json!(c), json!(c.as_str()));
            assert!(
                c.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{c}"
            );
        }
    }

    #[test]
    fn the_body_is_unchanged() {
        let e = ApiError::new(409, ErrorCode::CallNotLive, "call CA1 has already ended");
        assert_eq!(
            e.body().to_string(),
            r#"{"error":{"code":"call_not_live","message":"call CA1 has already ended"}}"#
        );
    }
}
