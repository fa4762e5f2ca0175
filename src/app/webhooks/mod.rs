//! Post-call webhooks (`[[webhooks]]`, docs/integrations.md): what each call reports
//! ([`events`]: `call.started`, `turn.completed`, `call.transferred`, `call.ended`,
//! `recording.ready`, written to the store's outbox in the transaction of what they report), the
//! call's summary ([`summary`], which `call.ended` waits for) and the delivery worker that empties the outbox ([`start`]): its own task, polling every
//! `poll_ms` for due deliveries, claiming at most as many as it has free slots
//! (`concurrency`) with a lease (`timeout_s` + 30 s; on PostgreSQL any instance may claim, none
//! twice), sending each once ([`deliver`]) and settling it — delivered, retried later with
//! backoff, or dead-lettered. At-least-once: a delivery whose answer was lost (a kill
//! mid-request) goes again with the same `webhook-id`. Counted in
//! `patterd_webhook_deliveries_total`; the outbox's depth and dead letters are gauges.

mod deliver;
pub(crate) mod events;
pub(crate) mod summary;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use super::App;
use super::metrics::DeliveryOutcome;
use crate::config::WebhookDeliveryConfig;
use crate::store::{OutboxRow, Settle, now_ms};
pub(crate) use events::CallHooks;
pub(crate) use summary::SummaryJob;

/// The outbox as the last poll found it (`/metrics`).
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    pub(crate) pending: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) dead: AtomicU64,
}

/// What every delivery task shares.
struct Worker {
    app: Weak<App>,
    cfg: WebhookDeliveryConfig,
    /// Claims are made in this instance's name (`[cluster] instance_name`).
    owner: String,
    clients: deliver::Clients,
    /// One permit per attempt in flight.
    slots: Arc<Semaphore>,
    /// Told when an attempt ends (a slot is free again).
    done: Notify,
}

/// Starts the delivery worker of `app`'s outbox (with `[webhook_delivery]` as it starts); it
/// ends when the app is dropped.
pub(crate) fn start(app: &Arc<App>) {
    let config = app.config();
    let cfg = config.webhook_delivery.clone();
    let clients = match deliver::Clients::new(Duration::from_secs(cfg.timeout_s.max(1))) {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "cannot build the webhook HTTP clients; webhooks will not be delivered");
            return;
        }
    };
    let worker = Arc::new(Worker {
        app: Arc::downgrade(app),
        slots: Arc::new(Semaphore::new(cfg.concurrency.max(1))),
        owner: config.cluster.instance_name(),
        cfg,
        clients,
        done: Notify::new(),
    });
    tokio::spawn(run(worker));
}

/// A random number for the retry jitter.
fn jitter_seed() -> u64 {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 8];
    if SystemRandom::new().fill(&mut b).is_err() {
        return now_ms() as u64;
    }
    u64::from_le_bytes(b)
}

async fn run(w: Arc<Worker>) {
    let poll = Duration::from_millis(w.cfg.poll_ms.max(1));
    let lease_ms = i64::try_from((w.cfg.timeout_s.saturating_add(30)).saturating_mul(1000))
        .unwrap_or(i64::MAX);
    let mut warned: Option<Instant> = None;
    let mut last_release = Instant::now() - RELEASE_EVERY;
    loop {
        let Some(app) = w.app.upgrade() else { return };
        let free = w.slots.available_permits();
        let mut more = false;
        if free > 0 {
            match app.store.outbox_claim(&w.owner, free, lease_ms).await {
                Ok(rows) => {
                    more = rows.len() == free;
                    for row in rows {
                        // Only this loop takes permits, and there were `free`.
                        let Ok(permit) = w.slots.clone().try_acquire_owned() else {
                            break;
                        };
                        let w = w.clone();
                        let app = app.clone();
                        tokio::spawn(async move {
                            deliver_one(&w, &app, row).await;
                            drop(permit);
                            w.done.notify_one();
                        });
                    }
                }
                Err(e) => {
                    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        warned = Some(Instant::now());
                        warn!(error = %e, "webhook outbox: cannot claim deliveries; retrying");
                    }
                }
            }
        }
        if last_release.elapsed() >= RELEASE_EVERY {
            last_release = Instant::now();
            release_stale(&app).await;
        }
        if let Ok(c) = app.store.outbox_counts().await {
            app.outbox.pending.store(c.pending, Ordering::Relaxed);
            app.outbox.held.store(c.held, Ordering::Relaxed);
            app.outbox.dead.store(c.dead, Ordering::Relaxed);
        }
        drop(app);
        if more {
            // Every slot was filled and more may be due: go again once one frees up.
            tokio::select! {
                _ = w.done.notified() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        } else {
            tokio::time::sleep(poll).await;
        }
    }
}

/// How often held deliveries are checked for a summary that never came.
const RELEASE_EVERY: Duration = Duration::from_secs(10);

/// Releases the `call.ended` deliveries held longer than any summary may take (the longest
/// `[agents.X.summary] timeout_s` and a minute): the summary's task died with its process, or
/// its brain never answered.
async fn release_stale(app: &App) {
    let longest = app
        .config()
        .agents
        .values()
        .filter_map(|a| a.summary.as_ref().map(|s| s.timeout_s))
        .max()
        .unwrap_or(0);
    let hold_ms =
        i64::try_from(longest.saturating_add(60).saturating_mul(1000)).unwrap_or(i64::MAX);
    match app.store.outbox_release_stale(hold_ms).await {
        Ok(0) | Err(_) => {}
        Ok(n) => warn!(
            deliveries = n,
            "released call.ended deliveries whose summary never came; they go without it"
        ),
    }
}

/// One attempt on `row`, settled in the store, logged and counted.
async fn deliver_one(w: &Worker, app: &App, row: OutboxRow) {
    let outcome = deliver::attempt(&app.config(), &w.clients, &row).await;
    let settle = deliver::settle(&w.cfg, &row, outcome, now_ms(), jitter_seed());
    let host = deliver::host_of(&row.url);
    let attempt = row.attempts + 1;
    match &settle {
        Settle::Delivered { status } => {
            app.metrics
                .webhook_deliveries
                .inc(DeliveryOutcome::Delivered);
            debug!(id = %row.id, event = %row.event, call_id = %row.call_id, %host, attempt, status, "webhook delivered");
        }
        Settle::Retry {
            error, delay_ms, ..
        } => {
            app.metrics.webhook_deliveries.inc(DeliveryOutcome::Retried);
            info!(id = %row.id, event = %row.event, call_id = %row.call_id, %host, attempt,
                  why = %error, retry_in_ms = delay_ms, "webhook delivery failed; it will be retried");
        }
        Settle::Dead { error, .. } => {
            app.metrics.webhook_deliveries.inc(DeliveryOutcome::Dead);
            warn!(id = %row.id, event = %row.event, call_id = %row.call_id, %host, attempt,
                  why = %error, "webhook delivery dead-lettered (GET /v1/webhooks/deliveries?state=dead)");
        }
    }
    match app.store.outbox_settle(&w.owner, &row.id, settle).await {
        Ok(true) => {}
        Ok(false) => {
            debug!(id = %row.id, "webhook delivery settled elsewhere (its lease ran out)")
        }
        Err(e) => {
            warn!(id = %row.id, error = %e, "webhook delivery not recorded; it will be sent again")
        }
    }
}
