//! Small HTTP helpers for handlers (carrier routes, the API edge, the server): the response
//! body types, plain, XML and JSON responses, and reading a request body under a size and time
//! limit; on the client side, [`with_traceparent`] for a request made on a traced call's
//! behalf.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Response;
use hyper::body::Incoming;

pub type Body = Full<Bytes>;

/// Adds the W3C `traceparent` header for `trace` (nothing for `None`): what an outgoing
/// request made for a traced call (a tool, a consult, a webhook delivery) carries so the
/// receiver's trace joins the call's.
pub fn with_traceparent(
    req: reqwest::RequestBuilder,
    trace: Option<&crate::util::traceparent::TraceParent>,
) -> reqwest::RequestBuilder {
    match trace {
        Some(tp) => req.header(crate::util::traceparent::TRACEPARENT, tp.header_value()),
        None => req,
    }
}

/// Any response body: buffered for most routes, streamed (SSE) for `/mcp`.
pub(crate) type AnyBody = BoxBody<Bytes, std::convert::Infallible>;

/// A file served as it is read, in chunks of [`FileBody::CHUNK`] (a call's recording: never
/// whole in memory). A read error ends the body early; the response's `Content-Length` (its
/// exact size hint) tells the client it was cut.
pub(crate) struct FileBody {
    file: tokio::fs::File,
    left: u64,
    buf: Vec<u8>,
}

impl FileBody {
    /// Bytes read and sent at a time.
    pub(crate) const CHUNK: usize = 64 * 1024;

    /// Serves the `len` bytes of `file` from where it stands.
    pub(crate) fn new(file: tokio::fs::File, len: u64) -> Self {
        Self {
            file,
            left: len,
            buf: Vec::new(),
        }
    }
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.left).map_or(Self::CHUNK, |l| l.min(Self::CHUNK));
        this.buf.resize(want, 0);
        let mut read = tokio::io::ReadBuf::new(&mut this.buf[..want]);
        match tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut this.file), cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => {
                tracing::warn!(error = %e, "a file being served could not be read; the response is cut short");
                this.left = 0;
                Poll::Ready(None)
            }
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                this.left = 0;
                Poll::Ready(None)
            }
            Poll::Ready(Ok(())) => {
                let chunk = Bytes::copy_from_slice(read.filled());
                this.left = this.left.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Body as _;

    /// A file goes out chunk by chunk as it is read, each chunk at most
    /// [`FileBody::CHUNK`], all of it in order, with its exact size known up front.
    #[tokio::test]
    async fn a_file_body_streams_the_file_in_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f.wav");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let file = tokio::fs::File::open(&path).await.expect("open");
        let mut body = FileBody::new(file, data.len() as u64);
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let mut got = Vec::new();
        let mut chunks = 0;
        while let Some(frame) = body.frame().await {
            let chunk = frame.expect("frame").into_data().expect("data");
            assert!(chunk.len() <= FileBody::CHUNK);
            got.extend_from_slice(&chunk);
            chunks += 1;
        }
        assert_eq!(chunks, data.len().div_ceil(FileBody::CHUNK));
        assert!(got == data, "the file, in order");
        assert!(body.is_end_stream());
    }
}
