//! The HTTP client this instance uses to reach its peers: a request on a call another instance
//! owns goes to that owner's `internal_url` (`{internal_url}/v1/calls/{id}/…`, the same method,
//! query and JSON body) with the cluster credential (`Authorization: Bearer <[cluster] token>`)
//! and `X-Patterd-Forwarded-By: <this instance's name>`, which tells the owner never to forward
//! it again. Connections are kept alive per peer and set `TCP_NODELAY` (without it a keep-alive
//! request waits out Nagle and delayed ACKs, ≈ 40 ms a hop); connecting gets 500 ms, the whole
//! request `[cluster] forward_timeout_ms`, so a dead or paused owner costs a bounded wait, never
//! a hang. What the owner answers — status, JSON body, `Retry-After` — comes back untouched;
//! what it means for the caller of the API is `crate::api::forward`'s business.

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use serde_json::Value;

use crate::store::postgres::owner::PeerRef;
use crate::util::secret::Secret;

/// The header naming the instance that forwarded a request (its presence is the loop guard).
pub(crate) const FORWARDED_BY: &str = "x-patterd-forwarded-by";
/// The header carrying a call token this instance could not check (it was minted by the
/// call's owner): the owner checks it and narrows the forwarded request to that call.
pub(crate) const FORWARDED_CALL_TOKEN: &str = "x-patterd-forwarded-call-token";

/// How long connecting to a peer may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The largest answer read back from a peer (a long call's transcript or events fit easily).
const MAX_ANSWER_BYTES: usize = 32 << 20;

/// Why a forwarded request got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// Connecting failed, timed out, or the connection broke before a whole answer came.
    #[error("instance `{peer}` at {url} did not answer: {reason}")]
    Unreachable {
        peer: String,
        url: String,
        reason: String,
        /// False when no connection was made (nothing reached the owner); true when the
        /// request may have reached it and the answer was lost (its outcome is unknown).
        maybe_delivered: bool,
    },
    /// The owner answered, but not with patterd's JSON (a proxy's page, a cut body).
    #[error("instance `{peer}` answered HTTP {status} without a JSON body")]
    BadAnswer { peer: String, status: u16 },
    /// The HTTP client could not be built (no TLS provider); nothing was sent.
    #[error("the peer HTTP client could not be built: {0}")]
    Client(String),
}

/// The owner's answer, as it sent it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
    /// Its `Retry-After` (seconds), when it sent one.
    pub(crate) retry_after_s: Option<u64>,
}

/// What a forwarded request carries besides the cluster credential.
pub(crate) struct Outgoing<'a> {
    pub(crate) method: &'a Method,
    /// The path under the peer's root, with `/v1` and the query (`/v1/calls/CA1/say?x=y`).
    pub(crate) path_and_query: &'a str,
    pub(crate) body: Option<&'a Value>,
    /// A call token to hand on for the owner to check ([`FORWARDED_CALL_TOKEN`]).
    pub(crate) call_token: Option<&'a Secret>,
}

/// The peer client: one keep-alive pool for API requests (bounded by the forward timeout) and
/// one for streamed downloads (bounded per read, so a long recording is not cut).
pub(crate) struct Peers {
    /// This instance's name, sent in [`FORWARDED_BY`].
    name: String,
    token: Secret,
    api: Result<reqwest::Client, String>,
    stream: Result<reqwest::Client, String>,
}

fn client(timeout: Duration, whole_request: bool) -> Result<reqwest::Client, String> {
    crate::util::init_tls();
    let b = reqwest::Client::builder()
        // The cluster credential travels in the Authorization header: never follow a redirect.
        .redirect(reqwest::redirect::Policy::none())
        // Peers are reached directly on their internal URLs, never through a proxy.
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(32);
    let b = if whole_request {
        b.timeout(timeout)
    } else {
        b.read_timeout(timeout)
    };
    b.build().map_err(|e| e.to_string())
}

impl Peers {
    /// The client of instance `name`, sending `token`, giving each request `timeout`.
    pub(crate) fn new(name: &str, token: Secret, timeout: Duration) -> Self {
        Self {
            name: name.to_string(),
            token,
            api: client(timeout, true),
            stream: client(timeout, false),
        }
    }

    /// The keep-alive client for whole requests to peers (the drain hand-off's too), unless it
    /// could not be built.
    pub(crate) fn api_client(&self) -> Option<&reqwest::Client> {
        self.api.as_ref().ok()
    }

    fn request(
        &self,
        client: &reqwest::Client,
        peer: &PeerRef,
        out: &Outgoing<'_>,
    ) -> reqwest::RequestBuilder {
        let url = format!(
            "{}{}",
            peer.internal_url.trim_end_matches('/'),
            out.path_and_query
        );
        let mut r = client
            .request(out.method.clone(), url)
            .bearer_auth(self.token.expose())
            .header(FORWARDED_BY, &self.name);
        if let Some(t) = out.call_token {
            r = r.header(FORWARDED_CALL_TOKEN, t.expose());
        }
        if let Some(body) = out.body {
            r = r.json(body);
        } else if out.method == Method::POST || out.method == Method::PUT {
            // The owner's edge wants JSON on every POST, as any client's.
            r = r
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body("{}");
        }
        r
    }

    fn unreachable(peer: &PeerRef, e: &reqwest::Error) -> ForwardError {
        let (reason, maybe_delivered) = if e.is_connect() {
            ("connection failed", false)
        } else if e.is_timeout() {
            ("timed out", true)
        } else {
            ("the connection broke", true)
        };
        ForwardError::Unreachable {
            peer: peer.name.clone(),
            url: peer.internal_url.clone(),
            reason: reason.to_string(),
            maybe_delivered,
        }
    }

    /// Sends `out` to `peer` and reads its whole JSON answer.
    pub(crate) async fn send(
        &self,
        peer: &PeerRef,
        out: &Outgoing<'_>,
    ) -> Result<Answer, ForwardError> {
        let client = self
            .api
            .as_ref()
            .map_err(|e| ForwardError::Client(e.clone()))?;
        let mut resp = self
            .request(client, peer, out)
            .send()
            .await
            .map_err(|e| Self::unreachable(peer, &e))?;
        let status = resp.status().as_u16();
        let retry_after_s = retry_after(resp.headers());
        let bad = || ForwardError::BadAnswer {
            peer: peer.name.clone(),
            status,
        };
        let mut buf = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| Self::unreachable(peer, &e))?
        {
            if buf.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(bad());
            }
            buf.extend_from_slice(&chunk);
        }
        let body = serde_json::from_slice::<Value>(&buf).map_err(|_| bad())?;
        Ok(Answer {
            status,
            body,
            retry_after_s,
        })
    }

    /// Sends `out` (a download: a recording) to `peer` and returns the response as it starts,
    /// its body still to be read ([`relay_body`]).
    pub(crate) async fn open(
        &self,
        peer: &PeerRef,
        out: &Outgoing<'_>,
    ) -> Result<reqwest::Response, ForwardError> {
        let client = self
            .stream
            .as_ref()
            .map_err(|e| ForwardError::Client(e.clone()))?;
        self.request(client, peer, out)
            .send()
            .await
            .map_err(|e| Self::unreachable(peer, &e))
    }
}

/// `Retry-After` in seconds, when present and a number.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A peer's response body as a response body of ours, passed on chunk by chunk as it arrives
/// (never whole in memory). A broken peer connection ends the body early; the relayed
/// `Content-Length` tells the client it was cut.
pub(crate) struct RelayBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

/// Starts passing `resp`'s body on.
pub(crate) fn relay_body(mut resp: reqwest::Response) -> RelayBody {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "a relayed download broke off; the response is cut short");
                    return;
                }
            }
        }
    });
    RelayBody { rx }
}

impl hyper::body::Body for RelayBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peer `p1` listening (or not) at `addr`.
    fn p1_at(addr: std::net::SocketAddr) -> PeerRef {
        PeerRef {
            name: "p1".into(),
            internal_url: format!("http://{addr}"),
        }
    }

    /// A peer that accepts nothing (a closed port) is reported unreachable within the connect
    /// timeout, with its name; nothing hangs.
    #[tokio::test]
    async fn a_closed_port_is_unreachable_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let peers = Peers::new("p0", Secret::new("t"), Duration::from_secs(5));
        let peer = p1_at(addr);
        let started = std::time::Instant::now();
        let e = peers
            .send(
                &peer,
                &Outgoing {
                    method: &Method::POST,
                    path_and_query: "/v1/calls/CA1/hangup",
                    body: None,
                    call_token: None,
                },
            )
            .await
            .expect_err("nobody listens");
        assert!(
            matches!(
                &e,
                ForwardError::Unreachable { peer, maybe_delivered: false, .. } if peer == "p1"
            ),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// A peer that accepts but never answers costs the forward timeout, not more.
    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let peers = Peers::new("p0", Secret::new("t"), Duration::from_millis(300));
        let peer = p1_at(addr);
        let started = std::time::Instant::now();
        let e = peers
            .send(
                &peer,
                &Outgoing {
                    method: &Method::GET,
                    path_and_query: "/v1/calls/CA1",
                    body: None,
                    call_token: None,
                },
            )
            .await
            .expect_err("silent");
        assert!(
            matches!(
                &e,
                ForwardError::Unreachable { reason, maybe_delivered: true, .. }
                    if reason == "timed out"
            ),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
