//! The composition root: [`App`] owns everything a running daemon holds — the configuration,
//! the carrier [`Registry`], the providers, the media tokens, the live calls, the call store,
//! the outbound calls we placed and the runtime inbound overrides — and is the carriers'
//! [`Host`]: admission ([`admission`]), the carrier-neutral media pump ([`media`]) and the
//! outbound call lifecycle ([`dialer`]) live here. The control API (`crate::api`) and MCP
//! operate on an `App`; the HTTP server (`crate::server`) only routes requests to them and to
//! the carriers. An `App` is built from a [`Config`] without any listener.

pub mod admission;
pub mod cluster;
pub(crate) mod dialer;
pub mod inbound;
pub mod media;
pub(crate) mod messaging;
pub mod metrics;
pub mod observe;
pub mod progress;
pub mod reload;
pub(crate) mod replay;
pub mod telemetry;
pub mod trial;
pub(crate) mod webhooks;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::sync::watch;

use crate::call::CallRegistry;
use crate::carrier::Registry;
use crate::carrier::dial::{Outbound, StatusUpdate};
use crate::carrier::port::{
    Admission, Arrived, Counter, Direct, GuardUnavailable, Host, IncomingCall, MediaSocket,
    Pending, Refusal,
};
use crate::config::Config;
use crate::net::http::Body;
use crate::provider::Providers;
use crate::security::LogLimiter;
use crate::security::link::PhoneLinks;
use crate::security::token::MediaTokens;
use crate::store::{Store, StoreError, Write};
use inbound::{Overrides, SETTING_KEY};
pub use metrics::Metrics;

/// Lifetime of a per-call media token.
pub(crate) const MEDIA_TOKEN_TTL: Duration = Duration::from_secs(60);

/// Why the daemon's state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("providers: {0}")]
    Providers(#[from] crate::provider::SetupError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("tools: {0}")]
    Tools(#[from] crate::tools::ToolSetupError),
    #[error("{0}")]
    TurnModel(#[from] crate::call::eot::TurnModelSetupError),
    #[error("{0}")]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error(
        "the saved inbound overrides (store setting `{key}`) cannot be read: {source}; \
         fix or delete them with `sqlite3 {db} \"DELETE FROM settings WHERE key = '{key}'\"` \
         (patterd refuses to start rather than drop a saved `enabled = false`)"
    )]
    BadOverrides {
        key: &'static str,
        db: String,
        #[source]
        source: serde_json::Error,
    },
}

/// What new calls use: one configuration with the providers, tools and phone-link key built
/// from it. A reload swaps it whole ([`App::reload`]), so a reader holding one never sees the
/// configuration of one reload with the providers or tools of another; live calls keep the one
/// they started with.
pub struct Generation {
    pub config: Arc<Config>,
    pub providers: Arc<Providers>,
    /// Every agent's tools (per-call runners come from them).
    pub tools: Arc<BTreeMap<String, Arc<crate::tools::AgentTools>>>,
    /// The browser phone's link key (from `server.api_token`; none without one).
    pub phone_links: Option<Arc<PhoneLinks>>,
}

impl Generation {
    fn build(config: Config, providers: Providers) -> Result<Self, AppError> {
        let tools = crate::tools::build_all(&config.agents, &providers.llm)?;
        Ok(Self {
            phone_links: PhoneLinks::from_secret(config.server.api_token.expose()).map(Arc::new),
            tools: Arc::new(tools),
            providers: Arc::new(providers),
            config: Arc::new(config),
        })
    }
}

/// What a reload applied ([`App::reload`]).
#[derive(Debug, Default)]
pub struct Reloaded {
    /// One line per key that changed but needs a restart (the running value stays in force).
    pub needs_restart: Vec<String>,
    /// `server.api_token` changed: the new token, and the phone links and page cookies made
    /// with it, are in force; the old ones are refused.
    pub token_rotated: bool,
    /// `[[server.api_tokens]]` changed: the new entries are in force, removed ones refused.
    pub tokens_changed: bool,
}

/// Shared, read-mostly state of the daemon. Everything mutable is behind its own small owner
/// (the call registry, the token store, the outbound calls, atomics).
pub struct App {
    /// What new calls use ([`Generation`]); swapped whole by a reload.
    live: RwLock<Arc<Generation>>,
    pub carriers: Registry,
    /// Reloads by result (`patterd_config_reloads_total`).
    pub reloads: Reloads,
    /// `[server]` as the daemon started: it never changes on reload (except its
    /// `api_token` and `api_tokens`, which are read from [`App::config`], never from here).
    pub server: crate::config::schema::ServerConfig,
    pub tokens: MediaTokens,
    pub calls: Arc<CallRegistry>,
    pub metrics: Arc<Metrics>,
    /// The call store (`data_dir/patterd.db`).
    pub store: Store,
    /// Outbound calls we placed (live, and recently ended for late carrier callbacks).
    pub outbound: Outbound,
    /// The outbound caps' reservations ([`dialer::reserve`]).
    pub outbound_caps: dialer::Caps,
    /// Runtime inbound overrides (`configure_inbound`), persisted in the store.
    pub inbound: RwLock<Overrides>,
    draining: watch::Sender<bool>,
    /// Set while this instance cannot renew its cluster heartbeat ([`App::is_fenced`]).
    fenced: std::sync::atomic::AtomicBool,
    pub started: Instant,
    /// One permit per media socket, held until it ends: upgraded sockets leave the listener's
    /// connection count, so they are bounded here ([`media_socket_limit`]).
    pub(crate) media_sockets: Arc<tokio::sync::Semaphore>,
    /// Rate limit for warnings unauthenticated peers can trigger.
    pub(crate) peer_warnings: LogLimiter,
    /// The calls' API tokens (scope `call`), handed to each call's brain.
    pub(crate) call_tokens: crate::security::call_token::CallTokens,
    /// Failed API authentications per peer (429 past the limit).
    pub(crate) auth_failures: crate::security::auth_limit::AuthFailures,
    /// One inference worker per `[turn_model.NAME]`, as the daemon started (a reload keeps
    /// them: onnxruntime is loaded once per process).
    turn_models: BTreeMap<String, crate::call::eot::TurnModelWorker>,
    /// This instance in the cluster, when the store is PostgreSQL (`None`: one instance).
    #[cfg(feature = "postgres")]
    pub cluster: Option<Arc<cluster::Cluster>>,
    /// The replay guards' memory without a shared store ([`replay`]).
    pub(crate) replay: replay::LocalSeen,
    /// The webhook outbox's depth as its worker last saw it ([`webhooks`]).
    pub(crate) outbox: webhooks::Gauges,
    /// The SQLite store's count toward `[outbound] max_sms_per_day` ([`messaging`]).
    pub(crate) sms_caps: messaging::SmsCaps,
    /// The agents' text conversations running now ([`messaging`]).
    pub(crate) conversations: messaging::Conversations,
    /// This `App` (what the calls' in-call `send_sms` sends through).
    me: std::sync::Weak<App>,
    /// The trace exporter (`[telemetry]`; `None` when off), as the daemon started.
    pub telemetry: Option<Arc<telemetry::Telemetry>>,
}

/// How many media sockets may be open at once: two per call (a carrier may reconnect) plus
/// a few sockets still waiting for `start`.
pub fn media_socket_limit(config: &Config) -> usize {
    config.server.max_calls.saturating_mul(2).saturating_add(16)
}

impl App {
    /// Builds the daemon's state from `config`: providers, carriers, the store (opened at
    /// `server.data_dir`) and the persisted inbound overrides.
    pub fn new(config: Config) -> Result<Arc<Self>, AppError> {
        crate::util::init_tls();
        let providers = crate::provider::build_providers(&config).map_err(AppError::Providers)?;
        let carriers = Registry::from_config(&config.carriers);
        let turn_models = crate::call::eot::start_workers(&config.turn_model)?;
        let store = Store::open_configured(
            &config.store,
            &config.cluster.instance_name(),
            &config.server.data_dir,
        )?;
        let inbound: Overrides = match store.setting_blocking(SETTING_KEY)? {
            None => Overrides::default(),
            Some(text) => serde_json::from_str(&text).map_err(|source| AppError::BadOverrides {
                key: SETTING_KEY,
                db: store.path.display().to_string(),
                source,
            })?,
        };
        let server = crate::config::schema::ServerConfig {
            api_token: Default::default(),
            api_tokens: Vec::new(),
            ..config.server.clone()
        };
        let media_sockets = Arc::new(tokio::sync::Semaphore::new(media_socket_limit(&config)));
        let metrics: Arc<Metrics> = Arc::default();
        let telemetry = telemetry::Telemetry::new(
            &config.telemetry,
            &config.cluster.instance_name(),
            metrics.clone(),
        )?;
        #[cfg(feature = "postgres")]
        let cluster = store
            .pg_pool()
            .map(|pool| Arc::new(cluster::Cluster::new(&config, pool)));
        let generation = Generation::build(config, providers)?;
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            sms_caps: Default::default(),
            conversations: Default::default(),
            #[cfg(feature = "postgres")]
            cluster,
            live: RwLock::new(Arc::new(generation)),
            carriers,
            reloads: Reloads::default(),
            server,
            tokens: MediaTokens::new(MEDIA_TOKEN_TTL),
            calls: Arc::new(CallRegistry::new()),
            metrics,
            store,
            outbound: Outbound::default(),
            outbound_caps: dialer::Caps::default(),
            inbound: RwLock::new(inbound),
            draining: watch::channel(false).0,
            fenced: Default::default(),
            started: Instant::now(),
            media_sockets,
            peer_warnings: LogLimiter::new(20, Duration::from_secs(1)),
            call_tokens: Default::default(),
            auth_failures: Default::default(),
            turn_models,
            replay: Default::default(),
            outbox: Default::default(),
            telemetry,
        }))
    }

    /// What new calls use now: the configuration with its providers, tools and link key.
    pub fn current(&self) -> Arc<Generation> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The configuration new calls use now.
    pub fn config(&self) -> Arc<Config> {
        self.current().config.clone()
    }

    /// The providers new calls use now.
    pub fn providers(&self) -> Arc<Providers> {
        self.current().providers.clone()
    }

    /// The phone-link key in force (derived from the current `server.api_token`).
    pub fn phone_links(&self) -> Option<Arc<PhoneLinks>> {
        self.current().phone_links.clone()
    }

    /// Applies a re-read configuration to new calls: agents, numbers, prompts, allow-lists,
    /// providers, outbound limits, `server.api_token` and `[[server.api_tokens]]`. The rest of `[server]` (the listener,
    /// TLS, public_url, limits), `[log]`, `[store]`, `[carriers.*]` and `[turn_model.*]` are
    /// kept as the daemon started — they need a restart — and each changed key is named in
    /// [`Reloaded::needs_restart`] ([`reload::plan`]). The new generation is swapped in one
    /// step; live calls keep the one they started with. Nothing changes when the providers or
    /// tools cannot be built.
    pub fn reload(&self, new: Config) -> Result<Reloaded, AppError> {
        let plan = reload::plan(&self.config(), new);
        let providers =
            crate::provider::build_providers(&plan.config).map_err(AppError::Providers)?;
        let next = Generation::build(plan.config, providers)?;
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        Ok(Reloaded {
            needs_restart: plan.needs_restart,
            token_rotated: plan.token_rotated,
            tokens_changed: plan.tokens_changed,
        })
    }

    /// True once a drain has begun: new calls are refused politely.
    pub(crate) fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    pub fn start_drain(&self) {
        self.draining.send_replace(true);
    }

    /// True while this instance fences itself: its cluster heartbeat could not be renewed for
    /// `lease − 2 × heartbeat` (`cluster::members`). Like a drain it is not ready and refuses
    /// new calls, but it ends as soon as a heartbeat is renewed. Never set without a cluster.
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets or clears the fence; returns whether it was set before.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn set_fenced(&self, fenced: bool) -> bool {
        self.fenced
            .swap(fenced, std::sync::atomic::Ordering::AcqRel)
    }

    /// A warning an unauthenticated peer triggered, rate limited ([`Self::peer_warnings`]).
    pub(crate) fn log_limited(&self, message: &str) {
        if let Some(suppressed) = self.peer_warnings.allow() {
            tracing::warn!(suppressed, "{message}");
        }
    }

    /// The log a new call reports to: the store, with the call metrics derived on the way.
    pub(crate) fn call_log(&self, setup: &crate::call::CallSetup) -> Arc<dyn crate::call::CallLog> {
        let generation = self.current();
        Arc::new(observe::CallObserver::new(
            &generation.config,
            &generation.providers,
            self.store.tx.clone(),
            self.metrics.clone(),
            setup,
        ))
    }

    /// Live outbound calls we placed.
    pub fn outbound_live(&self) -> usize {
        self.outbound.live_count()
    }
}

/// Config reloads by result.
#[derive(Default)]
pub struct Reloads {
    pub applied: std::sync::atomic::AtomicU64,
    pub refused: std::sync::atomic::AtomicU64,
}

impl Host for App {
    fn public_url(&self) -> &str {
        // `[server]` never changes on reload: the first configuration's is the one in force.
        &self.server.public_url
    }

    fn callback_base(&self) -> &str {
        #[cfg(feature = "postgres")]
        if let Some(c) = &self.cluster {
            return &c.advertise_url;
        }
        &self.server.public_url
    }

    fn first_seen(
        &self,
        scope: &'static str,
        key: &str,
        ttl: Duration,
    ) -> Pending<'static, Result<bool, GuardUnavailable>> {
        replay::first_seen(self, scope, key, ttl)
    }

    fn record_leg(&self, call_id: &str, leg_id: &str) {
        if call_id != leg_id {
            self.store.tx.send(Write::Leg {
                call_id: call_id.to_string(),
                leg_id: leg_id.to_string(),
            });
        }
    }

    fn max_body_bytes(&self) -> usize {
        self.server.max_body_bytes
    }

    fn count(&self, counter: Counter) {
        let c = match counter {
            Counter::WebhookForbidden => {
                self.metrics
                    .webhooks_refused
                    .inc(metrics::RefusalReason::BadSignature);
                &self.metrics.webhooks_forbidden
            }
            Counter::MediaRejected => &self.metrics.media_rejected,
            Counter::MediaFrameBad => &self.metrics.media_frames_bad,
        };
        Metrics::inc(c);
    }

    fn admit<'a>(&'a self, call: IncomingCall<'a>) -> Admission<'a> {
        Box::pin(admission::admit(self, call))
    }

    fn hand_off<'a>(
        &'a self,
        refusal: Refusal,
        webhook: Arrived,
    ) -> Pending<'a, Option<Response<Body>>> {
        #[cfg(feature = "postgres")]
        return Box::pin(cluster::handoff::hand_off(self, refusal, webhook));
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (refusal, webhook);
            Box::pin(std::future::ready(None))
        }
    }

    fn agents(&self) -> Vec<String> {
        self.config().agents.keys().cloned().collect()
    }

    fn admit_direct<'a>(&'a self, call: Direct<'a>) -> Admission<'a> {
        Box::pin(admission::admit_direct(self, call))
    }

    fn phone_links(&self) -> Option<Arc<PhoneLinks>> {
        App::phone_links(self)
    }

    fn mint_token(&self, call_id: &str) -> String {
        self.tokens.mint(call_id)
    }

    fn live_call_account(&self, call_id: &str) -> Option<String> {
        self.calls
            .get(call_id)
            .map(|h| h.carrier_account.to_string())
    }

    fn end_call(&self, call_id: &str, reason: &str) -> bool {
        match self.calls.get(call_id) {
            Some(h) => {
                let _ = h.hang_up(reason);
                true
            }
            None => false,
        }
    }

    fn machine_answered(
        &self,
        call_id: &str,
        message: &str,
        machine: crate::carrier::dial::Machine,
    ) -> bool {
        self.calls
            .get(call_id)
            .is_some_and(|h| h.machine_answered(message, machine).is_ok())
    }

    fn outbound(&self) -> &Outbound {
        &self.outbound
    }

    fn report(&self, u: StatusUpdate) {
        self.store.tx.send(Write::Status {
            call_id: u.call_id,
            status: u.status.map(|s| s.as_str().to_string()),
            outcome: u.outcome.map(|o| o.as_str().to_string()),
            answered_by: u.answered_by,
            carrier_duration_s: u.carrier_duration_s,
        });
    }

    fn accept_media(
        self: Arc<Self>,
        req: Request<Incoming>,
        socket: MediaSocket,
    ) -> Response<Body> {
        media::accept(self, req, socket)
    }

    fn incoming_sms<'a>(
        self: Arc<Self>,
        sms: crate::carrier::messaging::InboundSms<'a>,
    ) -> Pending<'a, Result<crate::carrier::messaging::SmsReceipt, GuardUnavailable>> {
        Box::pin(messaging::incoming(self, sms))
    }
}

/// Gives a call its agent's tools from `generation` (the one its agent and providers came
/// from; none when the agent has none), its trace when `[telemetry]` is on and, when the agent
/// records calls, its recording's path.
pub(crate) fn with_tools(
    app: &App,
    generation: &Generation,
    mut setup: crate::call::CallSetup,
) -> crate::call::CallSetup {
    if setup.agent.record {
        setup.recording =
            crate::call::recording::path(&app.config().server.data_dir, &setup.call_id);
    }
    setup.turn_model =
        (setup.agent.turn_model.as_ref()).and_then(|name| app.turn_models.get(name).cloned());
    // The brain gets the call's own API token when there are tokens at all (token-less, the
    // API needs none).
    if !generation.config.server.api_token.is_empty() {
        setup.call_token = Some(crate::util::secret::Secret::new(
            app.call_tokens.mint(&setup.call_id),
        ));
    }
    setup.tracing = app.telemetry.as_ref().map(|t| t.for_call(&setup.call_id));
    let (caller, callee) = (setup.from.clone(), setup.to.clone());
    let texter: Arc<dyn crate::tools::Texter> = Arc::new(app.me.clone());
    setup.tools = generation.tools.get(&setup.agent_name).and_then(|t| {
        t.for_call(crate::tools::CallCtx {
            call_id: setup.call_id.clone(),
            caller,
            callee,
            agent: setup.agent_name.clone(),
            calls: app.calls.clone(),
            outbound: setup.outbound,
            carrier_account: setup.carrier_account.clone(),
            texter: Some(texter),
        })
    });
    setup
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_saved_overrides_refuse_to_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[server]\ndata_dir = {:?}\n\n[carriers.tw]\nkind = \"twilio\"\n",
            dir.path().display().to_string()
        );
        let config = || {
            crate::config::load_str_with_vars(&text, "t.toml", &[])
                .expect("config")
                .config
        };
        let app = App::new(config()).expect("first start");
        app.store.tx.send(crate::store::Write::Setting {
            key: SETTING_KEY.into(),
            value: "{\"enabled\": fals".into(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(app.store.tx.flush()).expect("flush");
        drop(app);
        match App::new(config()) {
            Err(e @ AppError::BadOverrides { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("inbound_overrides") && msg.contains("refuses"),
                    "{msg}"
                );
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("started with unreadable overrides (a saved enabled = false lost)"),
        }
    }
}
