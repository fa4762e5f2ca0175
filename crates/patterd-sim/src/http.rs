//! The small HTTP server every simulator runs on: hyper 1 HTTP/1.1 on 127.0.0.1:0 with
//! upgrades enabled, a channel-fed streaming response body (so a fake can notice that the
//! client went away: the body is dropped and [`mpsc::Sender::closed`] resolves), JSON helpers,
//! and a set of spawned tasks that die with the fake.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use patterd::util::TaskGuard;

/// The response body type of the simulators.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A body fed by a channel; ends when every sender is dropped.
pub struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// A streaming response: the sender feeds the body; it reports `closed()` once the client
/// has gone (hyper dropped the body).
pub fn streaming(status: u16, headers: &[(&str, &str)]) -> (Response<Body>, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(16);
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = b
        .body(ChannelBody(rx).boxed())
        .unwrap_or_else(|_| plain(500, "bad response"));
    (resp, tx)
}

pub fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(http_body_util::Full::new(body.into()).boxed())
        .unwrap_or_else(|_| plain(500, "bad response"))
}

pub fn json(status: u16, v: &serde_json::Value) -> Response<Body> {
    full(status, "application/json", v.to_string())
}

pub fn plain(status: u16, text: &'static str) -> Response<Body> {
    let mut r =
        Response::new(http_body_util::Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// Reads a request body up to `limit` bytes.
pub async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, String> {
    http_body_util::Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

/// The request's headers as (lower-case name, value) pairs.
pub fn header_pairs<B>(req: &Request<B>) -> Vec<(String, String)> {
    req.headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The request's query as decoded pairs.
pub fn query_pairs<B>(req: &Request<B>) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Tasks a fake spawned (WebSocket sessions, response writers); aborted when dropped.
#[derive(Default)]
pub struct Tasks(Mutex<Vec<AbortHandle>>);

impl Tasks {
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(fut).abort_handle();
        if let Ok(mut v) = self.0.lock() {
            v.retain(|h| !h.is_finished());
            v.push(h);
        }
    }
}

impl Tasks {
    /// Aborts every task (the fakes call this when dropped: their tasks hold the shared
    /// state, so waiting for the state's own drop would never end them).
    pub fn abort_all(&self) {
        if let Ok(mut v) = self.0.lock() {
            for h in v.drain(..) {
                h.abort();
            }
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// Serves `handler` on 127.0.0.1:0 until the guard is dropped.
pub async fn serve<H, F>(handler: H) -> std::io::Result<(SocketAddr, TaskGuard)>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    serve_on(
        "127.0.0.1:0".parse().expect("an address"),
        Arc::new(handler),
    )
    .await
}

/// Serves `handler` on `addr` until the guard is dropped (which closes the listener and cuts
/// every connection).
async fn serve_on<H, F>(
    addr: SocketAddr,
    handler: Arc<H>,
) -> std::io::Result<(SocketAddr, TaskGuard)>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + ?Sized + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let h = handler.clone();
            conns.spawn(async move {
                let svc = service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
            while conns.try_join_next().is_some() {}
        }
    });
    Ok((addr, TaskGuard::new(task)))
}

/// The shared state of a fake run by [`Server`]: it owns the tasks the fake spawned.
pub trait FakeState: Send + Sync + 'static {
    fn tasks(&self) -> &Tasks;
}

type Handler =
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync;

/// A fake's server on 127.0.0.1:0 and its shared state, handed to the handler with each
/// request. Dropping it stops the server and aborts the fake's tasks (they hold the shared
/// state, so waiting for the state's own drop would never end them). [`Server::stop`] and
/// [`Server::resume`] play a restart: the port refuses connections in between.
pub struct Server<S: FakeState> {
    pub addr: SocketAddr,
    pub shared: Arc<S>,
    handler: Arc<Handler>,
    server: Mutex<Option<TaskGuard>>,
}

impl<S: FakeState> Server<S> {
    pub async fn start<H, F>(shared: S, handle: H) -> std::io::Result<Self>
    where
        H: Fn(Arc<S>, Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let shared = Arc::new(shared);
        let s = shared.clone();
        let handler: Arc<Handler> = Arc::new(move |req| Box::pin(handle(s.clone(), req)));
        let (addr, server) =
            serve_on("127.0.0.1:0".parse().expect("an address"), handler.clone()).await?;
        Ok(Self {
            addr,
            shared,
            handler,
            server: Mutex::new(Some(server)),
        })
    }

    /// The server goes away as a crashed process does: the listener closes (new connections
    /// are refused), open connections are cut and the fake's tasks end.
    pub fn stop(&self) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(server);
        self.shared.tasks().abort_all();
    }

    /// The server is back on the same port (after [`Server::stop`]).
    pub async fn resume(&self) -> std::io::Result<()> {
        let (_, server) = serve_on(self.addr, self.handler.clone()).await?;
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
        Ok(())
    }
}

impl<S: FakeState> Drop for Server<S> {
    fn drop(&mut self) {
        self.shared.tasks().abort_all();
    }
}

/// Whether the request's (first) `Authorization` header is exactly `expected` (compared in
/// constant time, as patterd compares secrets).
pub fn authorized<B>(req: &Request<B>, expected: &str) -> bool {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| patterd::security::ct_eq(v.as_bytes(), expected.as_bytes()))
}

/// How long [`Recorder::wait_until`] waits before panicking.
pub const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A fake's observable record, with change notification (a tokio watch channel): tests wait
/// on a predicate instead of sleeping.
pub struct Recorder<T>(tokio::sync::watch::Sender<T>);

impl<T: Clone + Default + std::fmt::Debug> Default for Recorder<T> {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(T::default()))
    }
}

impl<T: Clone + std::fmt::Debug> Recorder<T> {
    pub fn modify(&self, f: impl FnOnce(&mut T)) {
        self.0.send_modify(f);
    }

    pub fn snapshot(&self) -> T {
        self.0.borrow().clone()
    }

    /// Waits up to `limit` until `pred` holds and returns that state; `None` after.
    pub async fn wait_within(
        &self,
        limit: std::time::Duration,
        mut pred: impl FnMut(&T) -> bool,
    ) -> Option<T> {
        let mut rx = self.0.subscribe();
        match tokio::time::timeout(limit, rx.wait_for(|t| pred(t))).await {
            Ok(Ok(r)) => Some(r.clone()),
            _ => None,
        }
    }

    /// Waits until `pred` holds and returns that state. Test helper: panics (with the current
    /// state) after [`WAIT_LIMIT`].
    pub async fn wait_until(&self, what: &str, pred: impl FnMut(&T) -> bool) -> T {
        self.wait_until_within(what, WAIT_LIMIT, pred).await
    }

    /// [`Recorder::wait_until`] with its own limit (for work that is slow by nature, such as
    /// a local speech decode on a loaded machine).
    pub async fn wait_until_within(
        &self,
        what: &str,
        limit: std::time::Duration,
        mut pred: impl FnMut(&T) -> bool,
    ) -> T {
        let mut rx = self.0.subscribe();
        match tokio::time::timeout(limit, rx.wait_for(|t| pred(t))).await {
            Ok(Ok(r)) => r.clone(),
            _ => panic!(
                "timed out after {limit:?} waiting until {what}; state: {:#?}",
                self.snapshot()
            ),
        }
    }
}
