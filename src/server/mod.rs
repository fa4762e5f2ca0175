//! The HTTP server: one hyper listener serving carrier webhooks, carrier media WebSockets,
//! health and metrics; limits on connections, header size and time, and body size; and the
//! graceful drain on SIGTERM. It knows routes and limits, not any carrier's wire format: the
//! carrier glue lives in [`twilio`], [`telnyx`] and [`plivo`] (with the shared call admission in
//! [`admission`]) and the carrier-neutral media socket pump in [`media`].

pub mod admission;
pub mod http;
pub mod media;
pub mod metrics;
pub mod plivo;
pub mod rest;
pub mod telnyx;
pub mod twilio;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::{debug, error, info, warn};

use crate::api::inbound::{Overrides, SETTING_KEY};
use crate::api::outbound::OutboundCall;
use crate::call::CallRegistry;
use crate::config::{Config, LoadedConfig};
use crate::provider::Providers;
use crate::security::token::MediaTokens;
use crate::store::Store;
use http::{Body, text};

/// Lifetime of a per-call media token.
pub const MEDIA_TOKEN_TTL: Duration = Duration::from_secs(60);

/// Shared, read-mostly state of the daemon. Everything mutable is behind its own small owner
/// (the call registry, the token store, atomics).
pub struct App {
    pub config: Arc<Config>,
    pub providers: Providers,
    pub tokens: MediaTokens,
    pub calls: Arc<CallRegistry>,
    pub metrics: metrics::Metrics,
    pub twilio: twilio::TwilioCarriers,
    pub telnyx: telnyx::TelnyxCarriers,
    pub plivo: plivo::PlivoCarriers,
    /// The call store (`data_dir/patterd.db`).
    pub store: Store,
    /// Live outbound calls we placed, by carrier call id.
    outbound: Mutex<HashMap<String, OutboundCall>>,
    /// Runtime inbound overrides (`configure_inbound`), persisted in the store.
    pub inbound: RwLock<Overrides>,
    /// The MCP endpoint (`/mcp`).
    pub mcp: crate::mcp::http::McpHttp,
    draining: watch::Sender<bool>,
    pub started: Instant,
}

impl App {
    pub fn new(config: Config) -> Result<Arc<Self>, ServerError> {
        crate::util::init_tls();
        let providers =
            crate::provider::build_providers(&config).map_err(ServerError::Providers)?;
        let twilio = twilio::TwilioCarriers::from_config(&config);
        let telnyx = telnyx::TelnyxCarriers::from_config(&config);
        let plivo = plivo::PlivoCarriers::from_config(&config);
        let store = Store::open(
            &config.server.data_dir,
            config.store.retention_days,
            config.store.queue,
        )
        .map_err(|e| ServerError::Store(e.to_string()))?;
        let inbound: Overrides = store
            .setting_blocking(SETTING_KEY)
            .map_err(|e| ServerError::Store(e.to_string()))?
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        Ok(Arc::new_cyclic(|app| Self {
            mcp: crate::mcp::http::McpHttp::new(&config, app.clone()),
            config: Arc::new(config),
            providers,
            tokens: MediaTokens::new(MEDIA_TOKEN_TTL),
            calls: Arc::new(CallRegistry::new()),
            metrics: metrics::Metrics::default(),
            twilio,
            telnyx,
            plivo,
            store,
            outbound: Mutex::new(HashMap::new()),
            inbound: RwLock::new(inbound),
            draining: watch::channel(false).0,
            started: Instant::now(),
        }))
    }

    /// True once a drain has begun: new calls are refused politely.
    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// The REST control of the `[carriers.NAME]` account, for hanging calls up.
    pub fn carrier_control(&self, account: &str) -> Option<Arc<dyn media::CarrierControl>> {
        if let Some(a) = self.twilio.account(account) {
            return Some(a.rest.clone() as Arc<dyn media::CarrierControl>);
        }
        if let Some(a) = self.telnyx.account(account) {
            return Some(a.rest.clone() as Arc<dyn media::CarrierControl>);
        }
        self.plivo
            .account(account)
            .map(|a| a.rest.clone() as Arc<dyn media::CarrierControl>)
    }

    fn outbound_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, OutboundCall>> {
        self.outbound.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live outbound calls we placed.
    pub fn outbound_live(&self) -> usize {
        self.outbound_map().len()
    }

    pub fn register_outbound(&self, call_id: &str, call: OutboundCall) {
        self.outbound_map().insert(call_id.to_string(), call);
    }

    pub fn forget_outbound(&self, call_id: &str) {
        self.outbound_map().remove(call_id);
    }

    /// The outbound call `call_id`, if we placed it and it is live.
    pub fn outbound_call(&self, call_id: &str) -> Option<OutboundCall> {
        self.outbound_map().get(call_id).cloned()
    }

    pub fn start_drain(&self) {
        self.draining.send_replace(true);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source} (is another process using the port?)")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("`server.listen = \"{0}\"` is not an address:port")]
    BadListen(String),
    #[error("providers: {0}")]
    Providers(#[from] crate::provider::SetupError),
    #[error("[server.tls]: {0}")]
    Tls(String),
    #[error("{0}")]
    Store(String),
}

/// A bound, serving daemon.
pub struct Running {
    pub local_addr: SocketAddr,
    pub app: Arc<App>,
    accept: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting connections (live connections and calls go on).
    pub fn stop_accepting(&self) {
        self.accept.abort();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Binds `server.listen` and starts serving.
pub async fn bind(config: Config) -> Result<Running, ServerError> {
    let addr: SocketAddr = config
        .server
        .listen
        .parse()
        .map_err(|_| ServerError::BadListen(config.server.listen.clone()))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Bind {
            addr: addr.to_string(),
            source: e,
        })?;
    let local_addr = listener.local_addr().map_err(|e| ServerError::Bind {
        addr: addr.to_string(),
        source: e,
    })?;
    let tls = match &config.server.tls {
        Some(t) => Some(tls_acceptor(&t.cert, &t.key)?),
        None => None,
    };
    let app = App::new(config)?;
    let accept = tokio::spawn(accept_loop(listener, app.clone(), tls));
    Ok(Running {
        local_addr,
        app,
        accept,
    })
}

/// Builds the TLS acceptor from PEM files.
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    crate::util::init_tls();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServerError::Tls(format!("cannot read cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServerError::Tls(format!(
            "no certificate found in {}",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ServerError::Tls(format!("cannot read key {}: {e}", key.display())))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(format!("certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn accept_loop(listener: TcpListener, app: Arc<App>, tls: Option<tokio_rustls::TlsAcceptor>) {
    let limit = Arc::new(Semaphore::new(app.config.server.max_connections.max(1)));
    let header_timeout = Duration::from_secs(app.config.server.header_timeout_s.max(1));
    loop {
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, peer, header_timeout).await,
                Some(acceptor) => {
                    match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => serve_connection(s, app, peer, header_timeout).await,
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
}

async fn serve_connection<I>(io: I, app: Arc<App>, peer: SocketAddr, header_timeout: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let app = app.clone();
        async move { Ok::<_, Infallible>(route_any(app, peer, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    if let Err(e) = conn.await {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Any response body: buffered for most routes, streamed (SSE) for `/mcp`.
pub type AnyBody = BoxBody<bytes::Bytes, Infallible>;

async fn route_any(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<AnyBody> {
    let path = req.uri().path();
    if path == "/mcp" || path == "/mcp/" {
        let method = req.method().clone();
        let resp = app.mcp.handle(&app, req).await;
        debug!(%peer, %method, path = "/mcp", status = resp.status().as_u16(), "request");
        return resp;
    }
    route(app, peer, req).await.map(|b| b.boxed())
}

async fn route(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let resp = match (method.clone(), path.as_str()) {
        (Method::GET, "/healthz") => text(200, "ok\n"),
        (Method::GET, "/readyz") => {
            if app.is_draining() {
                text(503, "draining\n")
            } else {
                text(200, "ready\n")
            }
        }
        (Method::GET, "/metrics") => app.metrics.render(&app),
        (Method::POST, "/twilio/voice") => twilio::voice(app, req).await,
        (Method::POST, "/twilio/status") => twilio::status(app, req).await,
        (Method::POST, "/twilio/outbound") => twilio::outbound_answer(app, req).await,
        (_, p) if p == "/v1" || p.starts_with("/v1/") => rest::handle(app, peer, req).await,
        (Method::GET, "/twilio/media") => twilio::media(app, req).await,
        (Method::POST, "/telnyx/webhook") => telnyx::webhook(app, req).await,
        (Method::GET, p) if p.starts_with("/telnyx/media/") => telnyx::media(app, req).await,
        (Method::POST | Method::GET, "/plivo/answer") => plivo::answer(app, req).await,
        (Method::POST | Method::GET, "/plivo/hangup") => plivo::hangup(app, req).await,
        (Method::GET, p) if p.starts_with("/plivo/media/") => plivo::media(app, req).await,
        (
            _,
            "/healthz" | "/readyz" | "/metrics" | "/twilio/voice" | "/twilio/status"
            | "/twilio/outbound" | "/telnyx/webhook" | "/plivo/answer" | "/plivo/hangup",
        ) => text(405, "method not allowed\n"),
        _ => text(404, "not found\n"),
    };
    debug!(%peer, %method, %path, status = resp.status().as_u16(), "request");
    resp
}

/// Runs the daemon until a signal: the first SIGTERM/SIGINT drains (no new calls, live calls
/// run on for up to `drain_timeout_s`), a second one exits at once. Returns the exit code.
pub async fn run(loaded: LoadedConfig) -> i32 {
    let started = Instant::now();
    for w in &loaded.warnings {
        warn!("{w}");
    }
    let drain_timeout = Duration::from_secs(loaded.config.server.drain_timeout_s);
    let running = match bind(loaded.config).await {
        Ok(r) => r,
        Err(e) => {
            error!("{e}");
            return 1;
        }
    };
    info!(
        listen = %running.local_addr,
        startup_ms = started.elapsed().as_millis() as u64,
        version = env!("CARGO_PKG_VERSION"),
        "patterd is serving"
    );
    let mut signals = match shutdown_signals() {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot install signal handlers");
            return 1;
        }
    };
    signals.recv().await;
    let app = running.app.clone();
    app.start_drain();
    let live = app.calls.len();
    info!(
        live_calls = live,
        drain_timeout_s = drain_timeout.as_secs(),
        "draining: refusing new calls, waiting for live calls to end"
    );
    tokio::select! {
        _ = app.calls.wait_empty() => {
            info!("all calls ended; exiting");
        }
        _ = tokio::time::sleep(drain_timeout) => {
            let left = app.calls.handles();
            warn!(live_calls = left.len(), "drain timeout passed; hanging up the remaining calls");
            for h in left {
                let _ = h.hang_up("daemon shutting down");
            }
            let _ = tokio::time::timeout(Duration::from_secs(3), app.calls.wait_empty()).await;
        }
        _ = signals.recv() => {
            warn!("second signal: exiting now");
            return 130;
        }
    }
    running.stop_accepting();
    // Calls that ended during the drain must be stored as ended, not found open (and closed as
    // failed) by the next start.
    match app.store.tx.flush_within(STORE_FLUSH_LIMIT).await {
        Ok(()) => info!("call store flushed"),
        Err(e) => warn!(error = %e, "call store not flushed before exit"),
    }
    0
}

/// The longest wait for the call store's last writes at exit.
const STORE_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// SIGTERM and SIGINT as one stream.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

fn shutdown_signals() -> std::io::Result<Signals> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok(Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
    })
}
