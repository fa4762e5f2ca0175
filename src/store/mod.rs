//! The call store: SQLite (bundled, WAL) at `data_dir/patterd.db` holding calls, their turns
//! and their event timelines, plus small persisted settings. Writes go through one store thread
//! fed by a queue ([`StoreTx`], `queue.rs`): call actors never wait on the disk; when the disk
//! stalls and the queue is full, timeline events are dropped and counted
//! (`patterd_store_writes_dropped_total`) while call rows, turns and call ends are always kept. The thread commits each batch it
//! drains, so a turn is durable as soon as the actor reports it ended — a crash or `kill -9`
//! loses at most the turn in progress. Reads use their own connection (WAL lets them run
//! beside the writer) on tokio's blocking pool. Schema changes are numbered migrations tracked
//! in `PRAGMA user_version`; calls older than `retention_days` are pruned at start and hourly.
//! At debug level (`patterd::store=debug`) each committed turn is logged as `turn stored` with
//! its call id, sequence number and heard length (never its text).

pub mod messages;
pub mod model;
pub mod outbox;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod queue;
mod sqlite_schema;
pub mod stats;
pub mod wiring;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::call::{CallEvent, CallLog, EndReason, EventDetail, TranscriptEntry};
pub use messages::{MessageFilter, MessageRow, NewMessage};
pub use model::{CallFilter, CallRow, EventRow, Metrics, TurnRow};
pub use outbox::{DeliveryRow, OutboxBody, OutboxCounts, OutboxEvent, OutboxRow, Settle};
use queue::{Pushed, WriteQueue};
use sqlite_schema::MIGRATIONS;
use writer::writer_loop;

/// File name of the database inside `data_dir`.
pub(crate) const DB_FILE: &str = "patterd.db";

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}: {source} (check server.data_dir)")]
    Dir {
        path: String,
        source: std::io::Error,
    },
    #[error("call store {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    #[error(
        "the call store has schema version {found}, newer than this patterd knows ({supported}); \
         run the newer patterd, or point server.data_dir at another directory"
    )]
    TooNew { found: usize, supported: usize },
    #[error("call store query failed: {0}")]
    Query(#[from] rusqlite::Error),
    #[error("the call store is busy (write queue full); try again")]
    Busy,
    #[error("the call store has stopped")]
    Stopped,
    #[error(
        "cannot use the call store at store.url = {url}: {message} (check [store] url, and that \
         PostgreSQL is running and reachable)"
    )]
    Postgres { url: String, message: String },
    #[error("call store query failed: {0}")]
    Remote(String),
    #[error(
        "[store] backend = \"postgres\" but this patterd was built without the `postgres` \
         feature; rebuild with default features, or use backend = \"sqlite\""
    )]
    NoPostgres,
}

/// A new call, written when it is created (webhook or originate time).
#[derive(Debug, Clone)]
pub struct NewCall {
    pub call_id: String,
    pub carrier: String,
    pub carrier_account: String,
    /// `inbound` or `outbound`.
    pub direction: &'static str,
    pub from: String,
    pub to: String,
    pub agent: String,
    pub status: String,
}

/// A call's usage and what it cost, per provider, in US dollars (`[pricing]`); stored as the
/// call's `cost_detail` and served with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallCost {
    pub usage: crate::call::Usage,
    pub stt_usd: f64,
    pub tts_usd: f64,
    pub llm_usd: f64,
    pub carrier_usd: f64,
    pub total_usd: f64,
}

/// One write for the store thread.
pub enum Write {
    Call(NewCall),
    /// A carrier status callback or answer: any field that is `Some` is set.
    Status {
        call_id: String,
        status: Option<String>,
        outcome: Option<String>,
        answered_by: Option<String>,
        carrier_duration_s: Option<u64>,
    },
    Turn {
        call_id: String,
        seq: usize,
        entry: TranscriptEntry,
    },
    Event {
        call_id: String,
        event: CallEvent,
        at: i64,
    },
    /// The carrier's media stream started: the call is in progress from `at`.
    Answered {
        call_id: String,
        at: i64,
    },
    /// The first audio of the agent's answer to the caller's latest turn went out, `latency_us`
    /// after that turn ended.
    ReplyLatency {
        call_id: String,
        latency_us: u64,
    },
    /// The call ended at `at`, for `reason`; `outbox` holds the webhook events of its end
    /// (`call.ended`, `call.transferred`), committed in the same transaction.
    Ended {
        call_id: String,
        reason: String,
        at: i64,
        outbox: Vec<OutboxEvent>,
    },
    /// Webhook events for the outbox (`store::outbox`), committed with the batch.
    Outbox(Vec<OutboxEvent>),
    /// The call's summary (`[agents.X.summary]`), stored with the call; its held `call.ended`
    /// deliveries are made again with it and released, in the same transaction.
    Summary {
        call_id: String,
        summary: serde_json::Value,
    },
    Setting {
        key: String,
        value: String,
    },
    /// The carrier's own id for the call's leg, when it differs from the call id (PostgreSQL
    /// keeps it in `calls.leg_id` so a peer can hang the leg up; the SQLite store, one
    /// instance, has no use for it).
    Leg {
        call_id: String,
        leg_id: String,
    },
    /// What the call used and cost (written once, as it ends).
    Cost {
        call_id: String,
        cost: CallCost,
    },
    /// A text message sent or received ([`messages`]).
    Message(NewMessage),
    /// A sent message's carrier id and status (`sent`, `failed` with `error`).
    MessageStatus {
        message_id: String,
        status: &'static str,
        carrier_message_id: Option<String>,
        error: Option<String>,
        at: i64,
    },
    /// Answered once everything queued before it is committed.
    Flush(oneshot::Sender<()>),
    /// A lookup someone waits on synchronously, answered by the writer after the batch it came
    /// in committed (the PostgreSQL store's blocking reads).
    Ask(Ask),
}

/// A synchronous lookup the writer thread answers ([`Write::Ask`]).
pub enum Ask {
    Setting(
        String,
        std::sync::mpsc::SyncSender<Result<Option<String>, String>>,
    ),
}

impl Write {
    /// True for writes that may be dropped when the disk stalls (timeline detail); never for
    /// call rows, statuses, turns, call ends, settings or flushes.
    fn droppable(&self) -> bool {
        matches!(self, Write::Event { .. } | Write::ReplyLatency { .. })
    }

    /// True for writes the writer commits at once: flushes (someone waits), call rows
    /// (admission looks replayed webhooks up in the store) and settings. The rest wait up to
    /// the writer's linger to share a transaction; the store's reads flush first, so no reader
    /// sees the delay.
    fn urgent(&self) -> bool {
        matches!(
            self,
            Write::Flush(_)
                | Write::Call(_)
                | Write::Setting { .. }
                | Write::Ask(_)
                | Write::Message(_)
                | Write::MessageStatus { .. }
        )
    }
}

/// The store is where calls log themselves ([`CallLog`]); each method queues and returns.
impl CallLog for StoreTx {
    fn event(&self, call_id: &str, event: &CallEvent, _typed: &EventDetail) {
        StoreTx::event(self, call_id, event);
    }
    fn turn(&self, call_id: &str, seq: usize, entry: &TranscriptEntry) {
        StoreTx::turn(self, call_id, seq, entry);
    }
    fn answered(&self, call_id: &str) {
        StoreTx::answered(self, call_id);
    }
    fn reply_latency(&self, call_id: &str, latency_us: u64) {
        StoreTx::reply_latency(self, call_id, latency_us);
    }
    fn ended(&self, call_id: &str, reason: &EndReason) {
        StoreTx::ended(self, call_id, reason);
    }
}

/// Closes the queue when the last [`StoreTx`] goes, so the writer drains and ends.
struct Sender {
    queue: Arc<WriteQueue>,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// The write side, cheap to clone: what call actors and handlers hold.
#[derive(Clone)]
pub struct StoreTx {
    sender: Arc<Sender>,
    dropped: Arc<AtomicU64>,
    /// When a drop was last warned about (rate limit: one line per 10 s).
    warned: Arc<Mutex<Option<Instant>>>,
}

impl StoreTx {
    /// Queues a write without waiting. When the queue is full a droppable write (an event) is
    /// dropped, counted and warned about at most every 10 s; every other write is kept.
    pub fn send(&self, w: Write) -> bool {
        match self.sender.queue.push(w) {
            Pushed::Queued => true,
            Pushed::Dropped => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                let mut last = self.warned.lock().unwrap_or_else(|e| e.into_inner());
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    *last = Some(Instant::now());
                    warn!(
                        dropped_total = n,
                        "call store write queue full (is the disk stalled?); timeline events dropped"
                    );
                }
                false
            }
            Pushed::Closed => false,
        }
    }

    /// Writes waiting for the store thread now.
    pub(crate) fn queue_depth(&self) -> usize {
        self.sender.queue.len()
    }

    /// A call event (the actor's timeline).
    pub fn event(&self, call_id: &str, event: &CallEvent) {
        self.send(Write::Event {
            call_id: call_id.to_string(),
            event: event.clone(),
            at: now_ms(),
        });
    }

    /// A transcript entry, inserted or updated by its position in the transcript.
    /// The call's media started now (status `in-progress`, `answered_at`).
    pub fn answered(&self, call_id: &str) {
        self.send(Write::Answered {
            call_id: call_id.to_string(),
            at: now_ms(),
        });
    }

    /// The agent's first audio for the caller's latest turn went out `latency_us` after the turn
    /// ended (stored on that caller turn as `response_latency_ms`).
    pub(crate) fn reply_latency(&self, call_id: &str, latency_us: u64) {
        self.send(Write::ReplyLatency {
            call_id: call_id.to_string(),
            latency_us,
        });
    }

    /// The call ended now: its end time, duration, final status and outcome are settled.
    pub fn ended(&self, call_id: &str, reason: &EndReason) {
        self.ended_with(call_id, reason, Vec::new());
    }

    /// [`StoreTx::ended`] with the webhook events of the end, committed with it.
    pub(crate) fn ended_with(&self, call_id: &str, reason: &EndReason, outbox: Vec<OutboxEvent>) {
        self.send(Write::Ended {
            call_id: call_id.to_string(),
            reason: reason.to_string(),
            at: now_ms(),
            outbox,
        });
    }

    /// The call's summary; releases its held `call.ended` deliveries.
    pub(crate) fn summary(&self, call_id: &str, summary: serde_json::Value) {
        self.send(Write::Summary {
            call_id: call_id.to_string(),
            summary,
        });
    }

    /// Webhook events for the outbox (never dropped).
    pub(crate) fn outbox(&self, events: Vec<OutboxEvent>) {
        if !events.is_empty() {
            self.send(Write::Outbox(events));
        }
    }

    pub fn turn(&self, call_id: &str, seq: usize, entry: &TranscriptEntry) {
        self.send(Write::Turn {
            call_id: call_id.to_string(),
            seq,
            entry: entry.clone(),
        });
    }

    /// Writes dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every write queued so far is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        match self.sender.queue.push(Write::Flush(tx)) {
            Pushed::Queued => rx.await.map_err(|_| StoreError::Stopped),
            Pushed::Dropped => Err(StoreError::Busy),
            Pushed::Closed => Err(StoreError::Stopped),
        }
    }

    /// Flushes at shutdown, waiting at most `limit`; says how it went.
    pub(crate) async fn flush_within(&self, limit: Duration) -> Result<(), StoreError> {
        match tokio::time::timeout(limit, self.flush()).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Busy),
        }
    }
}

/// The store: a writer thread plus the read side of its backend.
pub struct Store {
    /// Where the store is, for messages: the SQLite file, or the PostgreSQL URL (password
    /// redacted).
    pub path: PathBuf,
    pub tx: StoreTx,
    /// The writer thread's commit figures (`/metrics`).
    pub stats: Arc<stats::StoreStats>,
    read: Reads,
}

/// The read side of each backend.
enum Reads {
    Sqlite(Arc<Mutex<Connection>>),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Reads),
}

/// How long a blocking lookup on the PostgreSQL store waits for the writer's answer.
#[cfg(feature = "postgres")]
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn open_conn(path: &Path) -> Result<Connection, StoreError> {
    let map = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let conn = Connection::open(path).map_err(map)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(map)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )
    .map_err(map)?;
    Ok(conn)
}

/// Runs the migrations that have not run yet; returns the schema version.
pub(crate) fn migrate(conn: &mut Connection) -> Result<usize, StoreError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let current = usize::try_from(current).unwrap_or(0);
    if current > MIGRATIONS.len() {
        return Err(StoreError::TooNew {
            found: current,
            supported: MIGRATIONS.len(),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", i + 1))?;
        tx.commit()?;
    }
    Ok(MIGRATIONS.len())
}

/// A store URL with any password as `***`, for messages.
pub(crate) fn redact_url(url: &str) -> String {
    #[cfg(feature = "postgres")]
    {
        postgres::redact(url)
    }
    #[cfg(not(feature = "postgres"))]
    {
        url.to_string()
    }
}

/// `patterd doctor`'s look at a PostgreSQL store: `(server version, schema version there,
/// schema version this patterd knows)`, or why it cannot be reached (password redacted).
pub(crate) async fn probe_postgres(url: &str) -> Result<(String, i64, i64), String> {
    #[cfg(feature = "postgres")]
    {
        postgres::probe(url)
            .await
            .map(|(v, s)| (v, s, postgres::supported_schema()))
            .map_err(|e| e.replace(url, &postgres::redact(url)))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = url;
        Err(StoreError::NoPostgres.to_string())
    }
}

impl Store {
    /// Opens the store `[store]` configures: SQLite in `data_dir`, or PostgreSQL at `url`
    /// (connected and migrated before this returns; must run inside a tokio runtime), where this
    /// instance owns its calls as `owner` (`[cluster] instance_name`).
    pub fn open_configured(
        store: &crate::config::schema::StoreConfig,
        owner: &str,
        data_dir: &Path,
    ) -> Result<Self, StoreError> {
        use crate::config::schema::StoreBackend;
        match store.backend {
            StoreBackend::Sqlite => Self::open(data_dir, store.retention_days, store.queue),
            StoreBackend::Postgres => {
                let url = store.url.as_ref().map(|u| u.expose().to_string());
                Self::open_postgres(
                    url.as_deref().unwrap_or_default(),
                    store.pool,
                    owner,
                    data_dir,
                    store.retention_days,
                    store.queue,
                )
            }
        }
    }

    /// Opens the PostgreSQL store at `url` for the instance `owner`.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(
        url: &str,
        pool: u32,
        owner: &str,
        data_dir: &Path,
        retention_days: u32,
        queue: usize,
    ) -> Result<Self, StoreError> {
        crate::util::create_private_dir(data_dir).map_err(|source| StoreError::Dir {
            path: data_dir.display().to_string(),
            source,
        })?;
        let queue = Arc::new(WriteQueue::new(queue));
        let target = postgres::PgTarget {
            url: url.to_string(),
            pool,
        };
        let stats = Arc::new(stats::StoreStats::default());
        let reads = postgres::open(
            &target,
            owner,
            data_dir,
            retention_days,
            queue.clone(),
            stats.clone(),
        )?;
        Ok(Self {
            stats,
            path: PathBuf::from(postgres::redact(url)),
            tx: StoreTx {
                sender: Arc::new(Sender { queue }),
                dropped: Arc::new(AtomicU64::new(0)),
                warned: Arc::new(Mutex::new(None)),
            },
            read: Reads::Postgres(reads),
        })
    }

    /// Without the `postgres` feature: says how to get it.
    #[cfg(not(feature = "postgres"))]
    pub fn open_postgres(
        _url: &str,
        _pool: u32,
        _owner: &str,
        _data_dir: &Path,
        _retention_days: u32,
        _queue: usize,
    ) -> Result<Self, StoreError> {
        Err(StoreError::NoPostgres)
    }

    /// Opens the SQLite store in `data_dir` (creating the directory and database if needed) and
    /// starts the writer thread.
    pub fn open(data_dir: &Path, retention_days: u32, queue: usize) -> Result<Self, StoreError> {
        crate::util::create_private_dir(data_dir).map_err(|source| StoreError::Dir {
            path: data_dir.display().to_string(),
            source,
        })?;
        let path = data_dir.join(DB_FILE);
        let mut writer = open_conn(&path)?;
        let version = migrate(&mut writer).map_err(|e| match e {
            StoreError::Query(source) => StoreError::Open {
                path: path.display().to_string(),
                source,
            },
            other => other,
        })?;
        // No call is live in a process that is only starting: calls the last one left open
        // (it crashed or was killed) are closed as failed, so nobody waits on them.
        let stale = writer
            .execute(
                "UPDATE calls SET status = 'failed', ended_reason = 'daemon stopped before the call ended',
                   ended_at = COALESCE(ended_at, ?1)
                 WHERE ended_at IS NULL",
                [now_ms()],
            )
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        if stale > 0 {
            tracing::warn!(
                calls = stale,
                "closed calls left open by a previous run as failed"
            );
        }
        // One instance: the webhook deliveries the last run had claimed are free again.
        outbox::release_claims_sqlite(&writer).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        // Nor is any recording being written: a `.wav.part` is a crash's unfinished one.
        crate::call::recording::prune_parts(data_dir);
        let read = open_conn(&path)?;
        let queue = Arc::new(WriteQueue::new(queue));
        let rx = queue.clone();
        let thread_path = path.clone();
        let stats = Arc::new(stats::StoreStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("patterd-store".into())
            .spawn(move || {
                let data_dir = thread_path.parent().unwrap_or(Path::new(".")).to_path_buf();
                let what = thread_path.display().to_string();
                writer_loop(
                    writer::SqliteSink { conn: writer },
                    &rx,
                    retention_days,
                    &data_dir,
                    &what,
                    &thread_stats,
                )
            })
            .map_err(|e| StoreError::Dir {
                path: path.display().to_string(),
                source: e,
            })?;
        info!(path = %path.display(), schema_version = version, "call store open");
        Ok(Self {
            path,
            tx: StoreTx {
                sender: Arc::new(Sender { queue }),
                dropped: Arc::new(AtomicU64::new(0)),
                warned: Arc::new(Mutex::new(None)),
            },
            stats,
            read: Reads::Sqlite(Arc::new(Mutex::new(read))),
        })
    }

    /// Runs `f` on the SQLite read connection on the blocking pool.
    async fn read_sqlite<T, F>(conn: &Arc<Mutex<Connection>>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let conn = conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&conn).map_err(StoreError::from)
        })
        .await
        .map_err(|_| StoreError::Stopped)?
    }

    /// Writes wait up to the writer's linger (100 ms) to share a transaction, so the reads
    /// below flush first: a reader sees everything logged before it asked. A full queue or a
    /// stopped writer still lets the read go on.
    async fn settle(&self) {
        // Bounded: a database that is down must not hang the reader (its reads fail on their
        // own, with a message).
        let _ = self.tx.flush_within(Duration::from_secs(5)).await;
    }

    pub async fn calls(&self, filter: CallFilter) -> Result<Vec<CallRow>, StoreError> {
        self.settle().await;
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| model::list_calls(c, &filter)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.calls(&filter).await,
        }
    }

    pub async fn call(&self, call_id: &str) -> Result<Option<CallRow>, StoreError> {
        self.settle().await;
        let id = call_id.to_string();
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| model::get_call(c, &id)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.call(&id).await,
        }
    }

    pub async fn turns(&self, call_id: &str) -> Result<Vec<TurnRow>, StoreError> {
        self.settle().await;
        let id = call_id.to_string();
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| model::turns(c, &id)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.turns(&id).await,
        }
    }

    pub async fn events(&self, call_id: &str) -> Result<Vec<EventRow>, StoreError> {
        self.settle().await;
        let id = call_id.to_string();
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| model::events(c, &id)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.events(&id).await,
        }
    }

    pub async fn metrics(&self, call_id: Option<&str>) -> Result<Metrics, StoreError> {
        self.settle().await;
        let id = call_id.map(str::to_string);
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| model::metrics(c, id.as_deref())).await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.metrics(id.as_deref()).await,
        }
    }

    /// Outbound calls created since `since_ms`.
    pub(crate) async fn outbound_since(&self, since_ms: i64) -> Result<u64, StoreError> {
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    c.query_row(
                    "SELECT COUNT(*) FROM calls WHERE direction = 'outbound' AND created_at >= ?1",
                    [since_ms],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n.max(0) as u64)
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbound_since(since_ms).await,
        }
    }

    /// Text messages matching `filter`, newest first.
    pub async fn messages(&self, filter: MessageFilter) -> Result<Vec<MessageRow>, StoreError> {
        self.settle().await;
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| messages::list(c, &filter)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => postgres::messages::list(p.pool(), &filter)
                .await
                .map_err(|e| StoreError::Remote(e.to_string())),
        }
    }

    /// Outbound text messages since `since_ms` that count toward `max_sms_per_day`.
    pub(crate) async fn sms_sent_since(&self, since_ms: i64) -> Result<u64, StoreError> {
        self.settle().await;
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| messages::sent_since(c, since_ms)).await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => postgres::messages::sent_since(p.pool(), since_ms)
                .await
                .map_err(|e| StoreError::Remote(e.to_string())),
        }
    }

    /// The PostgreSQL pool, when the store is on PostgreSQL (the cluster's statements use it).
    #[cfg(feature = "postgres")]
    pub(crate) fn pg_pool(&self) -> Option<sqlx_postgres::PgPool> {
        match &self.read {
            Reads::Sqlite(_) => None,
            Reads::Postgres(p) => Some(p.pool().clone()),
        }
    }

    /// Asks the writer thread (PostgreSQL: the blocking lookups of a sync caller).
    #[cfg(feature = "postgres")]
    fn ask<T>(
        &self,
        make: impl FnOnce(std::sync::mpsc::SyncSender<Result<T, String>>) -> Ask,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        match self.tx.sender.queue.push(Write::Ask(make(tx))) {
            Pushed::Queued => {}
            Pushed::Dropped => return Err(StoreError::Busy),
            Pushed::Closed => return Err(StoreError::Stopped),
        }
        match rx.recv_timeout(ASK_TIMEOUT) {
            Ok(r) => r.map_err(StoreError::Remote),
            Err(_) => Err(StoreError::Remote(format!(
                "no answer from the store within {} s",
                ASK_TIMEOUT.as_secs()
            ))),
        }
    }

    /// A setting, read synchronously (startup only).
    pub(crate) fn setting_blocking(&self, key: &str) -> Result<Option<String>, StoreError> {
        match &self.read {
            Reads::Sqlite(c) => {
                let conn = c.lock().unwrap_or_else(|e| e.into_inner());
                conn.query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(StoreError::from)
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(_) => self.ask(|tx| Ask::Setting(key.to_string(), tx)),
        }
    }

    /// True when the store has a row for `call_id` (a primary-key lookup: admission refuses
    /// a replayed webhook with it). No flush first: call rows are urgent writes, and a
    /// racing duplicate is caught by the live-call registry.
    pub(crate) async fn has_call(&self, call_id: &str) -> Result<bool, StoreError> {
        let id = call_id.to_string();
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    c.query_row("SELECT 1 FROM calls WHERE call_id = ?1", [id], |_| Ok(()))
                        .optional()
                        .map(|r| r.is_some())
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.call(&id).await.map(|r| r.is_some()),
        }
    }

    pub async fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_string();
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    c.query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                        r.get(0)
                    })
                    .optional()
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.setting(&key).await,
        }
    }
}

/// The webhook outbox's delivery side (`app::webhooks`, `GET /v1/webhooks/deliveries`). These
/// write directly (SQLite: on the read connection, waiting on the writer's lock at most its
/// busy timeout; PostgreSQL: on the pool), not through the queue: a claim must be answered.
impl Store {
    /// Claims up to `limit` deliveries that are due for `owner`, for `lease_ms` (PostgreSQL:
    /// `FOR UPDATE SKIP LOCKED`, so N instances never claim one row twice; a claim whose lease
    /// ran out is taken again).
    pub(crate) async fn outbox_claim(
        &self,
        owner: &str,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let owner = owner.to_string();
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    outbox::claim_sqlite(c, &owner, limit, lease_ms, now_ms())
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_claim(&owner, limit, lease_ms).await,
        }
    }

    /// Records how an attempt on a claimed delivery ended; false when the claim was no
    /// longer `owner`'s.
    pub(crate) async fn outbox_settle(
        &self,
        owner: &str,
        id: &str,
        settle: Settle,
    ) -> Result<bool, StoreError> {
        let (owner, id) = (owner.to_string(), id.to_string());
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    outbox::settle_sqlite(c, &owner, &id, &settle, now_ms())
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_settle(&owner, &id, &settle).await,
        }
    }

    /// Deliveries pending, held and dead (the `/metrics` gauges).
    pub(crate) async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, outbox::counts_sqlite).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_counts().await,
        }
    }

    /// The newest deliveries (in `state`, if given), at most `limit`.
    pub(crate) async fn outbox_list(
        &self,
        state: Option<String>,
        limit: usize,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        self.settle().await;
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| outbox::list_sqlite(c, state.as_deref(), limit)).await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_list(state.as_deref(), limit).await,
        }
    }

    /// One delivery by its `webhook-id`.
    pub(crate) async fn outbox_get(&self, id: &str) -> Result<Option<DeliveryRow>, StoreError> {
        let id = id.to_string();
        match &self.read {
            Reads::Sqlite(c) => Self::read_sqlite(c, move |c| outbox::get_sqlite(c, &id)).await,
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_get(&id).await,
        }
    }

    /// Releases `held` deliveries created more than `older_than_ms` ago (their summary never
    /// came: its brain hung, or the process that waited for it died); returns how many.
    pub(crate) async fn outbox_release_stale(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| {
                    outbox::release_stale_sqlite(c, now_ms() - older_than_ms, now_ms())
                        .map(|n| n as u64)
                })
                .await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_release_stale(older_than_ms).await,
        }
    }

    /// Puts a dead letter back in the queue, due now; false when `id` is not dead.
    pub(crate) async fn outbox_retry(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        match &self.read {
            Reads::Sqlite(c) => {
                Self::read_sqlite(c, move |c| outbox::retry_sqlite(c, &id, now_ms())).await
            }
            #[cfg(feature = "postgres")]
            Reads::Postgres(p) => p.outbox_retry(&id).await,
        }
    }
}

/// Statuses after which a call is over.
pub(crate) const TERMINAL: &[&str] = &["completed", "busy", "failed", "no-answer", "canceled"];

#[cfg(test)]
mod contract_tests;
#[cfg(test)]
mod tests;
