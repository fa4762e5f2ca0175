//! Small HTTP helpers for handlers (carrier routes, the API edge, the server): the response
//! body types, plain, XML and JSON responses, and reading a request body under a size and time
//! limit.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Response;
use hyper::body::Incoming;

pub type Body = Full<Bytes>;

/// Any response body: buffered for most routes, streamed (SSE) for `/mcp`.
pub(crate) type AnyBody = BoxBody<Bytes, std::convert::Infallible>;

/// Time a client gets to send a whole request body.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn text(status: u16, body: &'static str) -> Response<Body> {
    respond(
        status,
        "text/plain; charset=utf-8",
        Bytes::from_static(body.as_bytes()),
    )
}

/// A plain-text response with an owned body.
pub(crate) fn text_owned(status: u16, body: String) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", Bytes::from(body))
}

/// A JSON response.
pub fn json(status: u16, v: &serde_json::Value) -> Response<Body> {
    respond(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

pub fn empty(status: u16) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r
}

pub fn xml(body: String) -> Response<Body> {
    respond(200, "text/xml; charset=utf-8", Bytes::from(body))
}

pub(crate) fn respond(status: u16, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body exceeds {0} bytes")]
    TooLarge(usize),
    #[error("request body was not sent within {0:?}")]
    Timeout(Duration),
    #[error("request body could not be read: {0}")]
    Read(String),
}

impl BodyError {
    pub fn response(&self) -> Response<Body> {
        match self {
            BodyError::TooLarge(_) => text(413, "request body too large\n"),
            BodyError::Timeout(_) => text(408, "request body timed out\n"),
            BodyError::Read(_) => text(400, "unreadable request body\n"),
        }
    }
}

/// Reads the whole body, refusing more than `limit` bytes or taking longer than
/// [`BODY_TIMEOUT`].
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    let fut = Limited::new(body, limit).collect();
    match tokio::time::timeout(BODY_TIMEOUT, fut).await {
        Err(_) => Err(BodyError::Timeout(BODY_TIMEOUT)),
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(BodyError::TooLarge(limit))
            } else {
                Err(BodyError::Read(e.to_string()))
            }
        }
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}
