//! The call store on PostgreSQL (`[store] backend = "postgres"`, cargo feature `postgres`): the
//! same tables and the same write queue as the SQLite store, so several patterd instances can
//! share one database. Opening connects the writer's dedicated connection, runs the embedded
//! migrations (`migrations/postgres/`, checksummed in `_sqlx_migrations` and serialised by
//! sqlx's advisory lock, so instances starting together run each once); what this instance's
//! previous incarnation left open is closed when it registers (`members`). The writer thread
//! is `sink.rs`; reads go through a small pool on the caller's runtime ([`Reads`]).

pub(crate) mod caps;
pub(crate) mod claim;
pub(crate) mod handoff;
pub(crate) mod mcp_sessions;
pub(crate) mod members;
pub(crate) mod messages;
mod outbox;
pub(crate) mod owner;
pub(crate) mod roster;
pub(crate) mod settings;
mod sink;

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx_core::connection::Connection as _;
use sqlx_core::executor::Executor;
use sqlx_core::migrate::{Migration, MigrationType, Migrator};
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_core::sql_str::{AssertSqlSafe, SqlStr};
use sqlx_postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow, Postgres};
use tracing::info;

use super::StoreError;
use super::model::{CallFilter, CallRow, EventRow, Metrics, TurnRow};
use super::queue::WriteQueue;
use super::writer::writer_loop;

/// The embedded migrations, in order (expand-only within a release).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "store",
        include_str!("../../../migrations/postgres/0001_store.sql"),
    ),
    (
        2,
        "cluster",
        include_str!("../../../migrations/postgres/0002_cluster.sql"),
    ),
    (
        3,
        "outbound caps",
        include_str!("../../../migrations/postgres/0003_outbound_caps.sql"),
    ),
    (
        4,
        "webhooks",
        include_str!("../../../migrations/postgres/0004_webhooks.sql"),
    ),
    (
        5,
        "messages",
        include_str!("../../../migrations/postgres/0005_messages.sql"),
    ),
];

fn migrator() -> Migrator {
    let mut m = Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|(v, d, sql)| {
                Migration::new(
                    *v,
                    Cow::Borrowed(*d),
                    MigrationType::Simple,
                    SqlStr::from_static(sql),
                    false,
                )
            })
            .collect(),
    );
    m.set_locking(true);
    m
}

/// How to reach the database: `[store] url` and `pool`.
pub(crate) struct PgTarget {
    pub(crate) url: String,
    pub(crate) pool: u32,
}

/// The URL with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn unreachable(target: &PgTarget, message: impl std::fmt::Display) -> StoreError {
    StoreError::Postgres {
        url: redact(&target.url),
        message: message.to_string(),
    }
}

/// Connects and migrates: the writer's part of opening, on its own thread and runtime. Returns the connection and the schema version.
async fn prepare(options: &PgConnectOptions) -> Result<(PgConnection, usize), String> {
    let mut conn = PgConnection::connect_with(options)
        .await
        .map_err(|e| e.to_string())?;
    match migrator().run_direct(None, &mut conn, false).await {
        Ok(()) => {}
        Err(sqlx_core::migrate::MigrateError::VersionMissing(v)) => {
            return Err(format!(
                "the database has schema version {v}, newer than this patterd knows ({}); \
                 run the newer patterd, or point store.url at another database",
                supported_schema()
            ));
        }
        Err(e) => return Err(format!("migration failed: {e}")),
    }
    // What this instance's previous run left open is closed when it registers in the cluster
    // (`app::cluster::members`), with its legs and outbound slots.
    Ok((conn, supported_schema() as usize))
}

/// Opens the store on PostgreSQL: the writer thread (connected and migrated before this
/// returns) and the read pool. Must run inside a tokio runtime (the pool lives on it).
pub(crate) fn open(
    target: &PgTarget,
    owner: &str,
    data_dir: &Path,
    retention_days: u32,
    queue: Arc<WriteQueue>,
    stats: Arc<super::stats::StoreStats>,
) -> Result<Reads, StoreError> {
    let options = PgConnectOptions::from_str(&target.url)
        .map_err(|e| unreachable(target, format!("not a PostgreSQL URL: {e}")))?
        .application_name("patterd");
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(unreachable(target, "opened outside a tokio runtime"));
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let thread_options = options.clone();
    let owner_name = owner.to_string();
    let dir = data_dir.to_path_buf();
    let what = redact(&target.url);
    std::thread::Builder::new()
        .name("patterd-store".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let conn = match rt.block_on(prepare(&thread_options)) {
                Ok((conn, version)) => {
                    let _ = ready_tx.send(Ok(version));
                    conn
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let sink = sink::PgSink {
                rt,
                db: sink::Db {
                    conn: Some(conn),
                    options: thread_options,
                    owner: owner_name,
                    seqs: Default::default(),
                },
            };
            writer_loop(sink, &queue, retention_days, &dir, &what, &stats);
        })
        .map_err(|e| unreachable(target, e))?;
    let version = match ready_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(unreachable(target, e)),
        Err(_) => return Err(unreachable(target, "no answer within 30 s")),
    };
    let pool = PgPoolOptions::new()
        .max_connections(target.pool.max(1))
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    info!(url = %redact(&target.url), schema_version = version, instance = owner, "call store open (PostgreSQL)");
    Ok(Reads { pool })
}

/// What `patterd doctor` learns of the database at `url` without changing it: the server's
/// version and the schema version patterd's migrations reached there (0: none yet).
pub(crate) async fn probe(url: &str) -> Result<(String, i64), String> {
    let options =
        PgConnectOptions::from_str(url).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    let connect = PgConnection::connect_with(&options);
    let mut conn = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let version: String = query::<Postgres>("SHOW server_version")
        .fetch_one(&mut conn)
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| e.to_string())?;
    // The table is planned before a CASE could skip it: ask whether it exists first.
    let migrated: bool = query::<Postgres>("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut conn)
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| e.to_string())?;
    let schema: i64 = if migrated {
        query::<Postgres>("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut conn)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(|e| e.to_string())?
    } else {
        0
    };
    let _ = conn.close().await;
    Ok((version, schema))
}

/// The schema version this patterd's migrations reach.
pub(crate) fn supported_schema() -> i64 {
    MIGRATIONS.iter().map(|m| m.0).max().unwrap_or(0)
}

/// The read side: a pool on the runtime that opened the store.
pub(crate) struct Reads {
    pool: PgPool,
}

impl Reads {
    /// The pool, for the cluster's own statements (`app::cluster`).
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }
}

const CALL_COLUMNS: &str = "c.call_id, c.carrier, c.carrier_account, c.direction, c.from_number,
    c.to_number, c.agent, c.status, c.outcome, c.answered_by, c.ended_reason, c.created_at,
    c.answered_at, c.ended_at, c.duration_ms, c.carrier_duration_s, c.cost_usd,
    (SELECT COUNT(*) FROM turns t WHERE t.call_id = c.call_id), c.cost_detail, c.summary";

fn call_row(r: &PgRow) -> Result<CallRow, sqlx_core::Error> {
    Ok(CallRow {
        call_id: r.try_get(0)?,
        carrier: r.try_get(1)?,
        carrier_account: r.try_get(2)?,
        direction: r.try_get(3)?,
        from: r.try_get(4)?,
        to: r.try_get(5)?,
        agent: r.try_get(6)?,
        status: r.try_get(7)?,
        outcome: r.try_get(8)?,
        answered_by: r.try_get(9)?,
        ended_reason: r.try_get(10)?,
        created_at: r.try_get(11)?,
        answered_at: r.try_get(12)?,
        ended_at: r.try_get(13)?,
        duration_ms: r.try_get(14)?,
        carrier_duration_s: r.try_get(15)?,
        cost_usd: r.try_get(16)?,
        turns: r.try_get(17)?,
        // A detail this version cannot read is left out rather than failing the listing.
        cost: r
            .try_get::<Option<String>, _>(18)?
            .and_then(|t| serde_json::from_str(&t).ok()),
        summary: r
            .try_get::<Option<String>, _>(19)?
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

/// A call by id, on `db` (the pool, or the writer's transaction).
async fn call_on<'e, E>(db: E, call_id: &str) -> Result<Option<CallRow>, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let sql = format!("SELECT {CALL_COLUMNS} FROM calls c WHERE c.call_id = $1");
    let row = query::<Postgres>(AssertSqlSafe(sql))
        .bind(call_id.to_string())
        .fetch_optional(db)
        .await?;
    row.as_ref().map(call_row).transpose()
}

/// A call's transcript, on `db`.
async fn turns_on<'e, E>(db: E, call_id: &str) -> Result<Vec<TurnRow>, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let rows = query::<Postgres>(
        "SELECT seq, speaker, text, heard_text, interrupted, start_ms, end_ms,
           response_latency_ms FROM turns WHERE call_id = $1 ORDER BY seq",
    )
    .bind(call_id.to_string())
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(TurnRow {
                seq: r.try_get(0)?,
                speaker: r.try_get(1)?,
                text: r.try_get(2)?,
                heard_text: r.try_get(3)?,
                interrupted: r.try_get(4)?,
                start_ms: r.try_get(5)?,
                end_ms: r.try_get(6)?,
                response_latency_ms: r.try_get(7)?,
            })
        })
        .collect()
}

fn failed(e: sqlx_core::Error) -> StoreError {
    StoreError::Remote(e.to_string())
}

/// Each fetched row through `map`, the first error as the store's.
fn map_rows<T>(
    rows: &[PgRow],
    map: impl Fn(&PgRow) -> Result<T, sqlx_core::Error>,
) -> Result<Vec<T>, StoreError> {
    rows.iter()
        .map(map)
        .collect::<Result<_, _>>()
        .map_err(failed)
}

impl Reads {
    pub(crate) async fn calls(&self, f: &CallFilter) -> Result<Vec<CallRow>, StoreError> {
        let mut sql = format!("SELECT {CALL_COLUMNS} FROM calls c WHERE TRUE");
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if f.status.is_some() {
            sql.push_str(&format!(" AND c.status = ${}", next()));
        }
        if f.direction.is_some() {
            sql.push_str(&format!(" AND c.direction = ${}", next()));
        }
        if f.number.is_some() {
            let i = next();
            sql.push_str(&format!(
                " AND (c.from_number = ${i} OR c.to_number = ${i})"
            ));
        }
        if f.since_ms.is_some() {
            sql.push_str(&format!(" AND c.created_at >= ${}", next()));
        }
        sql.push_str(&format!(
            " ORDER BY c.created_at DESC, c.ins DESC LIMIT ${}",
            next()
        ));
        let mut q = query::<Postgres>(AssertSqlSafe(sql));
        if let Some(s) = &f.status {
            q = q.bind(s.clone());
        }
        if let Some(d) = &f.direction {
            q = q.bind(d.clone());
        }
        if let Some(num) = &f.number {
            q = q.bind(num.clone());
        }
        if let Some(s) = f.since_ms {
            q = q.bind(s);
        }
        q = q.bind(f.limit.clamp(1, 1000) as i64);
        let rows = q.fetch_all(&self.pool).await.map_err(failed)?;
        map_rows(&rows, call_row)
    }

    pub(crate) async fn call(&self, call_id: &str) -> Result<Option<CallRow>, StoreError> {
        call_on(&self.pool, call_id).await.map_err(failed)
    }

    pub(crate) async fn turns(&self, call_id: &str) -> Result<Vec<TurnRow>, StoreError> {
        turns_on(&self.pool, call_id).await.map_err(failed)
    }

    pub(crate) async fn events(&self, call_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let rows = query::<Postgres>(
            "SELECT t_ms, kind, detail, at FROM events WHERE call_id = $1 ORDER BY seq",
        )
        .bind(call_id.to_string())
        .fetch_all(&self.pool)
        .await
        .map_err(failed)?;
        map_rows(&rows, |r| {
            Ok(EventRow {
                t_ms: r.try_get(0)?,
                kind: r.try_get(1)?,
                detail: r.try_get(2)?,
                at: r.try_get(3)?,
            })
        })
    }

    /// The same figures as the SQLite store's `model::metrics`, in PostgreSQL's dialect.
    pub(crate) async fn metrics(&self, call_id: Option<&str>) -> Result<Metrics, StoreError> {
        let scope = "($1::text IS NULL OR call_id = $1)";
        let id = call_id.map(str::to_string);
        let mut m = Metrics::default();
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT COUNT(*), COUNT(answered_at), (COALESCE(SUM(duration_ms), 0) / 1000)::int8,
               COALESCE(SUM(cost_usd), 0.0)::float8
             FROM calls WHERE {scope}"
        )))
        .bind(id.clone())
        .fetch_one(&self.pool)
        .await
        .map_err(failed)?;
        (|| -> Result<(), sqlx_core::Error> {
            m.calls = r.try_get(0)?;
            m.answered = r.try_get(1)?;
            m.duration_s_total = r.try_get(2)?;
            m.cost_usd_total = r.try_get(3)?;
            Ok(())
        })()
        .map_err(failed)?;
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE speaker = 'caller'),
               COUNT(*) FILTER (WHERE speaker = 'agent'), COUNT(*) FILTER (WHERE interrupted),
               AVG(response_latency_ms)::float8, MAX(response_latency_ms)
             FROM turns WHERE {scope}"
        )))
        .bind(id.clone())
        .fetch_one(&self.pool)
        .await
        .map_err(failed)?;
        (|| -> Result<(), sqlx_core::Error> {
            m.turns = r.try_get(0)?;
            m.caller_turns = r.try_get(1)?;
            m.agent_turns = r.try_get(2)?;
            m.interruptions = r.try_get(3)?;
            m.response_latency_ms_avg = r.try_get(4)?;
            m.response_latency_ms_max = r.try_get(5)?;
            Ok(())
        })()
        .map_err(failed)?;
        let lat: Vec<i64> = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT response_latency_ms FROM turns WHERE {scope}
               AND response_latency_ms IS NOT NULL ORDER BY response_latency_ms"
        )))
        .bind(id.clone())
        .fetch_all(&self.pool)
        .await
        .map_err(failed)?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
        m.response_latency_ms_p50 = lat.get(lat.len() / 2).copied();
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FILTER (WHERE kind = 'llm_error'),
               COUNT(*) FILTER (WHERE kind = 'tts_error'), COUNT(*) FILTER (WHERE kind = 'stt_error'),
               COUNT(*) FILTER (WHERE kind = 'filler'),
               AVG(CASE WHEN kind = 'greeting_first_frame' AND detail ~ '^-?[0-9]+(\\.[0-9]+)?$'
                 THEN detail::float8 / 1000 END)::float8
             FROM events WHERE {scope}"
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .map_err(failed)?;
        (|| -> Result<(), sqlx_core::Error> {
            m.llm_errors = r.try_get(0)?;
            m.tts_errors = r.try_get(1)?;
            m.stt_errors = r.try_get(2)?;
            m.fillers = r.try_get(3)?;
            m.greeting_latency_ms_avg = r.try_get(4)?;
            Ok(())
        })()
        .map_err(failed)?;
        Ok(m)
    }

    pub(crate) async fn outbound_since(&self, since_ms: i64) -> Result<u64, StoreError> {
        let n: i64 = query::<Postgres>(
            "SELECT COUNT(*) FROM calls WHERE direction = 'outbound' AND created_at >= $1",
        )
        .bind(since_ms)
        .fetch_one(&self.pool)
        .await
        .and_then(|r| r.try_get(0))
        .map_err(failed)?;
        Ok(n.max(0) as u64)
    }

    pub(crate) async fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        query::<Postgres>("SELECT value FROM settings WHERE key = $1")
            .bind(key.to_string())
            .fetch_optional(&self.pool)
            .await
            .and_then(|r| r.map(|r| r.try_get(0)).transpose())
            .map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(
            redact("postgres://patterd:s3cret@db:5432/calls"),
            "postgres://patterd:***@db:5432/calls"
        );
        assert_eq!(
            redact("postgres://patterd@db/calls"),
            "postgres://patterd@db/calls"
        );
        assert_eq!(redact("postgres://db/calls"), "postgres://db/calls");
    }
}
