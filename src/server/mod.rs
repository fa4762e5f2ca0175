//! The HTTP server: one hyper listener, its limits (connections, header size and time, body
//! size) and the graceful drain on SIGTERM. It only routes: `/healthz`, `/readyz`,
//! `/metrics` ([`metrics`]) itself, `/v1/*` to the API ([`rest`] around [`crate::api`]),
//! `/mcp` to [`crate::mcp::http`], and every other path to the carrier whose route it is, as
//! the carrier registry ([`crate::carrier::Registry`]) resolves it — 404 for unknown paths and
//! 405 for known paths with another method, derived from the same routes. It knows no
//! carrier's name or wire format; the daemon's state is [`crate::app::App`]. Under systemd
//! (`Type=notify`) it sends `READY=1` once the listener is up, `WATCHDOG=1` from the runtime
//! at half of `WATCHDOG_USEC`, and `STOPPING=1` when the drain begins.

pub mod metrics;
pub mod pages;
mod prefix;
pub mod rest;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, error, info, warn};

use crate::app::{App, AppError};
use crate::carrier::port::Host;
use crate::carrier::registry::{Resolved, RoutePath, serve};
use crate::config::{Config, LoadedConfig};
use crate::mcp::http::McpHttp;
pub(crate) use crate::net::http::AnyBody;
use crate::net::http::{Body, text};
use crate::util::sd_notify::{self, Notify};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source} (is another process using the port?)")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("`server.listen = \"{0}\"` is not an address:port")]
    BadListen(String),
    #[error("[server.tls]: {message}")]
    Tls {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error(transparent)]
    App(#[from] AppError),
    /// The instance could not register in the cluster (`app::cluster::join`).
    #[error("{0}")]
    Cluster(String),
}

/// What the accept loop serves: the daemon's state and the MCP endpoint on it.
struct Served {
    app: Arc<App>,
    mcp: McpHttp,
    /// The path of `[cluster] advertise_url` (else of `public_url`), stripped from requests
    /// that carry it.
    advertise_prefix: Option<String>,
}

/// A bound, serving daemon.
pub struct Running {
    pub local_addr: SocketAddr,
    pub app: Arc<App>,
    accept: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting connections (live connections and calls go on).
    pub(crate) fn stop_accepting(&self) {
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
    let mut config = config;
    crate::app::cluster::resolve_urls(&mut config, local_addr);
    let app = App::new(config)?;
    // Registered before the accept loop starts: `/readyz` is never 200 before.
    crate::app::cluster::join(&app)
        .await
        .map_err(ServerError::Cluster)?;
    crate::app::cluster::start_sync(&app);
    crate::app::webhooks::start(&app);
    let served = Arc::new(Served {
        advertise_prefix: prefix::of(Host::callback_base(app.as_ref())),
        mcp: McpHttp::new(&app.config(), Arc::downgrade(&app)),
        app: app.clone(),
    });
    let accept = tokio::spawn(accept_loop(listener, served, tls));
    Ok(Running {
        local_addr,
        app,
        accept,
    })
}

fn tls_error(message: String, e: impl std::error::Error + Send + Sync + 'static) -> ServerError {
    ServerError::Tls {
        message,
        source: Some(Box::new(e)),
    }
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
        .map_err(|e| tls_error(format!("cannot read cert {}: {e}", cert.display()), e))?;
    if certs.is_empty() {
        return Err(ServerError::Tls {
            message: format!(
                "no certificate found in {}; give a PEM file with the certificate chain",
                cert.display()
            ),
            source: None,
        });
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| tls_error(format!("cannot read key {}: {e}", key.display()), e))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls_error(format!("certificate and key do not fit: {e}"), e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn accept_loop(
    listener: TcpListener,
    served: Arc<Served>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let server = &served.app.config().server;
    let limit = Arc::new(Semaphore::new(server.max_connections.max(1)));
    let header_timeout = Duration::from_secs(server.header_timeout_s.max(1));
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
        let app = served.clone();
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

async fn serve_connection<I>(io: I, app: Arc<Served>, peer: SocketAddr, header_timeout: Duration)
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

/// The server's own routes.
#[derive(Clone, Copy)]
enum Own {
    Health,
    Ready,
    Metrics,
}

const OWN_ROUTES: &[(Method, RoutePath, Own)] = &[
    (Method::GET, RoutePath::Exact("/healthz"), Own::Health),
    (Method::GET, RoutePath::Exact("/readyz"), Own::Ready),
    (Method::GET, RoutePath::Exact("/metrics"), Own::Metrics),
];

async fn route_any(
    served: Arc<Served>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<AnyBody> {
    let mut req = req;
    if let Some(p) = &served.advertise_prefix
        && let Some(uri) = prefix::strip(req.uri(), p)
    {
        *req.uri_mut() = uri;
    }
    let path = req.uri().path();
    if path == "/mcp" || path == "/mcp/" {
        let method = req.method().clone();
        let resp = served.mcp.handle(&served.app, peer, req).await;
        debug!(%peer, %method, path = "/mcp", status = resp.status().as_u16(), "request");
        return resp;
    }
    if let Some(resp) = rest::recording(&served.app, peer, &req).await {
        return resp;
    }
    route(served.app.clone(), peer, req)
        .await
        .map(|b| b.boxed())
}

async fn route(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let own = OWN_ROUTES.iter().filter(|(_, p, _)| p.matches(&path));
    let resp = if path == "/v1" || path.starts_with("/v1/") {
        rest::handle(app, peer, req).await
    } else if own.clone().next().is_some() {
        let mut own = own;
        match own.find(|(m, _, _)| *m == method).map(|r| r.2) {
            Some(Own::Health) => health(req.uri().query()),
            Some(Own::Ready) if app.is_draining() => text(503, "draining\n"),
            Some(Own::Ready) if app.is_fenced() => text(503, "fenced\n"),
            Some(Own::Ready) => text(200, "ready\n"),
            Some(Own::Metrics) => metrics_guarded(&app, peer, req.headers()),
            None => text(405, "method not allowed\n"),
        }
    } else {
        match app.carriers.resolve(&method, &path) {
            Resolved::Route(carrier, r) => {
                let (carrier, r) = (carrier.clone(), r.clone());
                let mut req = req;
                let access = crate::api::auth::Access {
                    peer,
                    method: &method,
                    headers: req.headers(),
                };
                // Opening calls without a carrier signature is an operator's (never a read or
                // call token's); failures here are not counted (carriers send no token).
                let ok = crate::api::auth::check_caller(
                    &app.config().server,
                    access,
                    crate::api::auth::NO_CALL_TOKENS,
                )
                .is_ok_and(|g| g.scope == crate::api::Scope::Operator);
                req.extensions_mut()
                    .insert(crate::carrier::port::ControlAccess(ok));
                serve(&carrier, &r, app as Arc<dyn Host>, req).await
            }
            Resolved::MethodNotAllowed => text(405, "method not allowed\n"),
            Resolved::NotFound => text(404, "not found\n"),
        }
    };
    let path = crate::api::auth::for_log(&path, 64);
    debug!(%peer, %method, %path, status = resp.status().as_u16(), "request");
    resp
}

/// `/healthz`: `ok`, plus `X-Patterd-Instance`; a `nonce` query parameter (1–64 of
/// `A-Za-z0-9_-`) is echoed in `X-Patterd-Nonce` (doctor's round trip through `public_url`).
/// Without the parameter the answer is what it always was.
fn health(query: Option<&str>) -> Response<Body> {
    let mut resp = text(200, "ok\n");
    let headers = resp.headers_mut();
    if let Ok(v) = hyper::header::HeaderValue::from_str(crate::util::instance_id()) {
        headers.insert("x-patterd-instance", v);
    }
    let nonce = query.into_iter().flat_map(|q| q.split('&')).find_map(|kv| {
        kv.strip_prefix("nonce=").filter(|n| {
            (1..=64).contains(&n.len())
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
    });
    if let Some(v) = nonce.and_then(|n| hyper::header::HeaderValue::from_str(n).ok()) {
        headers.insert("x-patterd-nonce", v);
    }
    resp
}

/// `/metrics`: with `api_token` set it needs a token that may read (an operator or `read`
/// token; failures count against the peer), unless `server.metrics_public = true`. In
/// token-less local mode it takes `/v1`'s local check (loopback peer and `Host`, no proxy
/// headers: DNS rebinding); with `metrics_public`, the `Host` check alone.
fn metrics_guarded(app: &App, peer: SocketAddr, headers: &hyper::HeaderMap) -> Response<Body> {
    use crate::api::auth;
    let config = app.config();
    let server = &config.server;
    let checked = if server.api_token.is_empty() {
        let access = auth::Access {
            peer,
            method: &Method::GET,
            headers,
        };
        if server.metrics_public {
            auth::check_local_host(headers)
        } else {
            auth::check_caller(server, access, auth::NO_CALL_TOKENS).map(|_| ())
        }
    } else if server.metrics_public {
        Ok(())
    } else {
        auth::admit_request(app, peer, headers, |server, calls| {
            auth::check_bearer(server, headers, calls)
        })
        .and_then(|g| g.permits(crate::api::Permission::ReadAll, None))
    };
    match checked {
        Ok(()) => metrics::render(app),
        Err(e) => rest::error(&e),
    }
}

/// Runs the daemon until a signal: the first SIGTERM/SIGINT drains (no new calls, live calls
/// run on for up to `drain_timeout_s`), a second one exits at once. Returns the exit code.
///
/// SIGHUP re-reads `config_path` ([`reload`]).
pub async fn run(loaded: LoadedConfig, config_path: Option<std::path::PathBuf>) -> i32 {
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
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot install the SIGHUP handler");
            return 1;
        }
    };
    systemd(Notify::Ready);
    let _watchdog = watchdog();
    loop {
        tokio::select! {
            _ = signals.recv() => break,
            _ = hangups.recv() => reload(&running.app, config_path.as_deref()),
        }
    }
    systemd(Notify::Stopping);
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
    if let Some(t) = &app.telemetry
        && !t.flush(TRACE_FLUSH_LIMIT).await
    {
        warn!("the calls' last spans were not all exported before exit");
    }
    // After the flush: a stopped instance is never reaped, so its calls' ends must be in.
    crate::app::cluster::leave(&app).await;
    0
}

/// SIGHUP: re-reads the configuration file and applies it to new calls ([`App::reload`]);
/// live calls keep theirs. An invalid file is refused, logged, and changes nothing. Counted in
/// `patterd_config_reloads_total`.
fn reload(app: &App, path: Option<&std::path::Path>) {
    systemd(Notify::Reloading);
    let result = match path {
        None => Err("the daemon was started without a configuration file path".to_string()),
        Some(p) => crate::config::load(p).map_err(|e| e.to_string()),
    }
    .and_then(|loaded| {
        for w in &loaded.warnings {
            warn!("{w}");
        }
        app.reload(loaded.config).map_err(|e| e.to_string())
    });
    match result {
        Ok(done) => {
            crate::app::Metrics::inc(&app.reloads.applied);
            for n in &done.needs_restart {
                warn!("reload: {n}");
            }
            if done.token_rotated {
                warn!(
                    "reload: server.api_token changed: the new token is in force; the old \
                     token, its phone links and page cookies are refused"
                );
            }
            if done.tokens_changed {
                warn!(
                    "reload: [[server.api_tokens]] changed: the new entries and scopes are in \
                     force; removed or rotated tokens are refused"
                );
            }
            info!(
                live_calls = app.calls.len(),
                need_restart = done.needs_restart.len(),
                "configuration reloaded: new calls use it, live calls keep theirs"
            );
        }
        Err(e) => {
            crate::app::Metrics::inc(&app.reloads.refused);
            error!(error = %e, "configuration reload refused: the running configuration is kept");
        }
    }
    systemd(Notify::Ready);
}

/// Tells systemd (`NOTIFY_SOCKET`, `Type=notify`); a failure is logged, never fatal.
fn systemd(msg: Notify) {
    match sd_notify::notify(msg) {
        Ok(true) => debug!(message = %msg.message(), "notified systemd"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)"),
    }
}

/// Sends `WATCHDOG=1` at half of systemd's `WATCHDOG_USEC` from a task on the async runtime:
/// when the runtime is stuck the pings stop and systemd restarts the daemon. Dropping the
/// guard stops the pings.
fn watchdog() -> Option<crate::util::TaskGuard> {
    let every = sd_notify::watchdog_interval()?;
    info!(
        interval_ms = every.as_millis() as u64,
        "systemd watchdog enabled"
    );
    Some(crate::util::TaskGuard::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            systemd(Notify::Watchdog);
        }
    })))
}

/// The longest wait for the call store's last writes at exit.
const STORE_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The longest wait for the calls' last spans at exit (`[telemetry]`).
const TRACE_FLUSH_LIMIT: Duration = Duration::from_secs(2);

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
