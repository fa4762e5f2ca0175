//! A load balancer in miniature for the cluster tests and the cluster benchmark: an HTTP/1.1 proxy on 127.0.0.1 that
//! sends each request to the next of its backends, round robin, among those whose `/readyz`
//! last answered 200 (polled every 20 ms; any other answer or a refused connection takes a
//! backend out at once, three probes in a row without an answer in 200 ms do too — a
//! readiness probe's `failureThreshold`, so a loaded machine does not empty the pool) — what a
//! Kubernetes Service with a readiness probe does for the shared `public_url`. A backend that refuses the connection is
//! skipped for that request (nothing was sent yet); one that accepted and then failed gives
//! 502, as a real balancer would. Media sockets never pass here: the answer documents send
//! them to the owner's `advertise_url`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use tokio::net::TcpListener;

/// Probes in a row without an answer that take a backend out.
const MISSES: u32 = 3;

struct Backend {
    addr: SocketAddr,
    /// Its last probe answered 200 (and fewer than [`MISSES`] went unanswered since).
    ready: bool,
    /// Probes in a row that got no answer in time.
    misses: u32,
    /// Requests this backend was sent.
    hits: usize,
}

struct Shared {
    backends: Mutex<Vec<Backend>>,
    next: AtomicUsize,
    client: reqwest::Client,
}

/// The running front (stops when dropped).
pub struct Front {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Front {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

impl Front {
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Front> {
        let shared = Arc::new(Shared {
            backends: Mutex::new(
                backends
                    .into_iter()
                    .map(|addr| Backend {
                        addr,
                        ready: false,
                        misses: 0,
                        hits: 0,
                    })
                    .collect(),
            ),
            next: AtomicUsize::new(0),
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_millis(300))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(std::io::Error::other)?,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let probe = tokio::spawn(probe_loop(shared.clone()));
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let s = s.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(forward(&s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Ok(Front {
            addr,
            shared,
            tasks: vec![probe, accept],
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until at least `n` backends are ready; false if they are not within `timeout`.
    pub async fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.ready().len() < n {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// The backends that get requests now.
    pub fn ready(&self) -> Vec<SocketAddr> {
        let b = self
            .shared
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        b.iter().filter(|b| b.ready).map(|b| b.addr).collect()
    }

    /// Points backend `i` at a new address (an instance restarted on another port).
    pub fn replace(&self, i: usize, addr: SocketAddr) {
        let mut b = self
            .shared
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        b[i] = Backend {
            addr,
            ready: false,
            misses: 0,
            hits: 0,
        };
    }

    /// Requests sent to each backend, in the order given.
    pub fn hits(&self) -> Vec<usize> {
        let b = self
            .shared
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        b.iter().map(|b| b.hits).collect()
    }
}

async fn probe_loop(s: Arc<Shared>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap_or_default();
    loop {
        let addrs: Vec<SocketAddr> = s
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|b| b.addr)
            .collect();
        for addr in addrs {
            let answer = client.get(format!("http://{addr}/readyz")).send().await;
            let mut b = s.backends.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(b) = b.iter_mut().find(|b| b.addr == addr) {
                match answer {
                    Ok(r) => {
                        b.ready = r.status().as_u16() == 200;
                        b.misses = 0;
                    }
                    Err(e) if e.is_timeout() => {
                        b.misses += 1;
                        b.ready &= b.misses < MISSES;
                    }
                    Err(_) => b.ready = false,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next ready backend after `skip` tries, round robin.
fn pick(s: &Shared, tried: &[SocketAddr]) -> Option<SocketAddr> {
    let mut b = s.backends.lock().unwrap_or_else(|e| e.into_inner());
    let n = b.len();
    for _ in 0..n {
        let i = s.next.fetch_add(1, Ordering::Relaxed) % n;
        if b[i].ready && !tried.contains(&b[i].addr) {
            b[i].hits += 1;
            return Some(b[i].addr);
        }
    }
    None
}

fn plain(status: u16, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(
            Full::new(Bytes::from(text.to_string()))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("response")
}

async fn forward(s: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return plain(400, "front: the request body could not be read");
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut tried = Vec::new();
    loop {
        let Some(addr) = pick(s, &tried) else {
            return plain(503, "front: no ready backend");
        };
        tried.push(addr);
        let mut out = s
            .client
            .request(parts.method.clone(), format!("http://{addr}{path}"))
            .body(body.clone());
        for (k, v) in &parts.headers {
            if !matches!(
                k.as_str(),
                "connection" | "content-length" | "transfer-encoding" | "keep-alive"
            ) {
                out = out.header(k, v);
            }
        }
        match out.send().await {
            Ok(resp) => {
                let mut b = Response::builder().status(resp.status());
                for (k, v) in resp.headers() {
                    if !matches!(
                        k.as_str(),
                        "connection" | "transfer-encoding" | "keep-alive"
                    ) {
                        b = b.header(k, v);
                    }
                }
                // Streamed through (an MCP answer is an event stream).
                let (tx, rx) = tokio::sync::mpsc::channel(16);
                let mut resp = resp;
                tokio::spawn(async move {
                    loop {
                        let item = match resp.chunk().await {
                            Ok(Some(c)) => Ok(c),
                            Ok(None) => break,
                            Err(e) => Err(std::io::Error::other(e)),
                        };
                        let stop = item.is_err();
                        if tx.send(item).await.is_err() || stop {
                            break;
                        }
                    }
                });
                return b
                    .body(BodyExt::boxed(Chunks(rx)))
                    .unwrap_or_else(|e| plain(502, &format!("front: {e}")));
            }
            // Refused before anything was sent: another backend may take it.
            Err(e) if e.is_connect() => continue,
            Err(e) => return plain(502, &format!("front: {e}")),
        }
    }
}

/// A response body fed chunk by chunk from the backend's response.
struct Chunks(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}
