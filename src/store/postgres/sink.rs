//! The PostgreSQL writer: the store thread's [`Sink`] on one dedicated connection, driven by a
//! current-thread runtime of its own (the thread still runs at the writer's nice, so commits never
//! take the media runtime's core). A batch is one transaction with one set-based statement per
//! kind of write for the frequent ones — call rows, answers, turns, events, ends (`unnest` of one
//! array per column) — and one statement per write for the rare ones (status callbacks, reply
//! latencies, costs, settings, webhook outbox rows, which go last). Events get a per-call sequence assigned here, before the first
//! attempt, so a batch retried after a lost COMMIT acknowledgement inserts nothing twice. A failed
//! batch is retried with backoff for up to [`RETRY_FOR`]; the queue keeps accepting meanwhile
//! (events are dropped when it fills, as with SQLite).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx_core::connection::Connection as _;
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgConnectOptions, PgConnection, Postgres};
use tracing::warn;

use crate::store::writer::Sink;
use crate::store::{Ask, TERMINAL, Write, now_ms};

/// How long a batch that fails is retried before it is given up (and counted in the log).
const RETRY_FOR: Duration = Duration::from_secs(30);

/// The writer's connection and what it remembers between batches.
pub(super) struct PgSink {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) db: Db,
}

/// The connection side of [`PgSink`] (apart from its runtime, so one can drive the other).
pub(super) struct Db {
    pub(super) conn: Option<PgConnection>,
    pub(super) options: PgConnectOptions,
    /// This instance's name, written as each call's `owner_id`.
    pub(super) owner: String,
    /// The next event sequence number of each call this process writes events for.
    pub(super) seqs: HashMap<String, i64>,
}

/// One batch as columns, ready to bind.
#[derive(Default)]
struct Columns {
    call_ids: Vec<String>,
    carriers: Vec<String>,
    accounts: Vec<String>,
    directions: Vec<String>,
    froms: Vec<String>,
    tos: Vec<String>,
    agents: Vec<String>,
    statuses: Vec<String>,
    created: Vec<i64>,
    answered: (Vec<String>, Vec<i64>),
    /// Keyed by (call, seq): a turn updated twice in one batch is written once, as it ended.
    turns: Vec<(String, i64, crate::call::TranscriptEntry)>,
    events: EventColumns,
    ended: (Vec<String>, Vec<String>, Vec<i64>),
    /// Webhook events (the ends' and the others'), inserted last.
    outbox: Vec<crate::store::OutboxEvent>,
    /// The rare writes, in order.
    singles: Vec<Write>,
}

#[derive(Default)]
struct EventColumns {
    call_ids: Vec<String>,
    seqs: Vec<i64>,
    t_ms: Vec<i64>,
    kinds: Vec<String>,
    details: Vec<String>,
    at: Vec<i64>,
}

impl Db {
    fn columns(&mut self, batch: Vec<Write>) -> Columns {
        let mut c = Columns::default();
        let mut turn_at: HashMap<(String, i64), usize> = HashMap::new();
        for w in batch {
            match w {
                Write::Call(n) => {
                    c.call_ids.push(n.call_id);
                    c.carriers.push(n.carrier);
                    c.accounts.push(n.carrier_account);
                    c.directions.push(n.direction.to_string());
                    c.froms.push(n.from);
                    c.tos.push(n.to);
                    c.agents.push(n.agent);
                    c.statuses.push(n.status);
                    c.created.push(now_ms());
                }
                Write::Answered { call_id, at } => {
                    c.answered.0.push(call_id);
                    c.answered.1.push(at);
                }
                Write::Turn {
                    call_id,
                    seq,
                    entry,
                } => {
                    let key = (call_id, seq as i64);
                    match turn_at.get(&key) {
                        Some(&i) => c.turns[i].2 = entry,
                        None => {
                            turn_at.insert(key.clone(), c.turns.len());
                            c.turns.push((key.0, key.1, entry));
                        }
                    }
                }
                Write::Event { call_id, event, at } => {
                    let next = self.seqs.entry(call_id.clone()).or_insert(0);
                    c.events.seqs.push(*next);
                    *next += 1;
                    c.events.call_ids.push(call_id);
                    c.events.t_ms.push(event.t_ms as i64);
                    c.events.kinds.push(event.kind.as_str().to_string());
                    c.events.details.push(event.detail);
                    c.events.at.push(at);
                }
                Write::Ended {
                    call_id,
                    reason,
                    at,
                    outbox,
                } => {
                    c.ended.0.push(call_id);
                    c.ended.1.push(reason);
                    c.ended.2.push(at);
                    c.outbox.extend(outbox);
                }
                Write::Outbox(events) => c.outbox.extend(events),
                Write::Flush(_) | Write::Ask(_) => {}
                other => c.singles.push(other),
            }
        }
        c
    }

    async fn connection(&mut self) -> Result<&mut PgConnection, sqlx_core::Error> {
        if self.conn.is_none() {
            self.conn = Some(PgConnection::connect_with(&self.options).await?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }
}

/// Applies one batch in one transaction.
async fn apply(conn: &mut PgConnection, owner: &str, c: &Columns) -> Result<(), sqlx_core::Error> {
    let mut tx = sqlx_core::connection::Connection::begin(conn).await?;
    if !c.call_ids.is_empty() {
        query::<Postgres>(
            "INSERT INTO calls (call_id, carrier, carrier_account, direction, from_number,
               to_number, agent, status, created_at, owner_id)
             SELECT u.*, $10 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
               $5::text[], $6::text[], $7::text[], $8::text[], $9::int8[]) AS u
             ON CONFLICT (call_id) DO NOTHING",
        )
        .bind(&c.call_ids)
        .bind(&c.carriers)
        .bind(&c.accounts)
        .bind(&c.directions)
        .bind(&c.froms)
        .bind(&c.tos)
        .bind(&c.agents)
        .bind(&c.statuses)
        .bind(&c.created)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
    }
    if !c.answered.0.is_empty() {
        query::<Postgres>(
            "UPDATE calls SET status = 'in-progress', answered_at = COALESCE(answered_at, u.at)
             FROM unnest($1::text[], $2::int8[]) AS u (call_id, at)
             WHERE calls.call_id = u.call_id",
        )
        .bind(&c.answered.0)
        .bind(&c.answered.1)
        .execute(&mut *tx)
        .await?;
    }
    for w in c
        .singles
        .iter()
        .filter(|w| matches!(w, Write::Status { .. }))
    {
        single(&mut tx, w).await?;
    }
    if !c.turns.is_empty() {
        let ids: Vec<&str> = c.turns.iter().map(|t| t.0.as_str()).collect();
        let seqs: Vec<i64> = c.turns.iter().map(|t| t.1).collect();
        let speakers: Vec<&str> = c
            .turns
            .iter()
            .map(|t| match t.2.speaker {
                crate::call::Speaker::Caller => "caller",
                crate::call::Speaker::Agent => "agent",
            })
            .collect();
        let texts: Vec<&str> = c.turns.iter().map(|t| t.2.text.as_str()).collect();
        let heard: Vec<&str> = c.turns.iter().map(|t| t.2.heard_text.as_str()).collect();
        let cut: Vec<bool> = c.turns.iter().map(|t| t.2.interrupted).collect();
        let starts: Vec<i64> = c.turns.iter().map(|t| t.2.start_ms as i64).collect();
        let ends: Vec<i64> = c.turns.iter().map(|t| t.2.end_ms as i64).collect();
        query::<Postgres>(
            "INSERT INTO turns (call_id, seq, speaker, text, heard_text, interrupted, start_ms,
               end_ms)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[],
               $6::bool[], $7::int8[], $8::int8[])
             ON CONFLICT (call_id, seq) DO UPDATE SET text = excluded.text,
               heard_text = excluded.heard_text, interrupted = excluded.interrupted,
               start_ms = excluded.start_ms, end_ms = excluded.end_ms",
        )
        .bind(&ids)
        .bind(&seqs)
        .bind(&speakers)
        .bind(&texts)
        .bind(&heard)
        .bind(&cut)
        .bind(&starts)
        .bind(&ends)
        .execute(&mut *tx)
        .await?;
    }
    for w in c
        .singles
        .iter()
        .filter(|w| matches!(w, Write::ReplyLatency { .. }))
    {
        single(&mut tx, w).await?;
    }
    let e = &c.events;
    if !e.call_ids.is_empty() {
        query::<Postgres>(
            "INSERT INTO events (call_id, seq, t_ms, kind, detail, at)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::text[], $5::text[],
               $6::int8[])
             ON CONFLICT (call_id, seq) DO NOTHING",
        )
        .bind(&e.call_ids)
        .bind(&e.seqs)
        .bind(&e.t_ms)
        .bind(&e.kinds)
        .bind(&e.details)
        .bind(&e.at)
        .execute(&mut *tx)
        .await?;
    }
    if !c.ended.0.is_empty() {
        query::<Postgres>(
            "UPDATE calls SET ended_at = u.at, ended_reason = u.reason,
               duration_ms = CASE WHEN answered_at IS NULL THEN 0 ELSE u.at - answered_at END,
               status = CASE WHEN status IN ('completed','busy','failed','no-answer','canceled')
                 THEN status WHEN answered_at IS NOT NULL OR outcome IN ('answered', 'voicemail')
                 THEN 'completed' ELSE 'failed' END,
               outcome = COALESCE(outcome, CASE WHEN answered_at IS NOT NULL THEN 'answered'
                 ELSE 'failed' END)
             FROM unnest($1::text[], $2::text[], $3::int8[]) AS u (call_id, reason, at)
             WHERE calls.call_id = u.call_id",
        )
        .bind(&c.ended.0)
        .bind(&c.ended.1)
        .bind(&c.ended.2)
        .execute(&mut *tx)
        .await?;
    }
    for w in c.singles.iter().filter(|w| {
        !matches!(
            w,
            Write::Status { .. } | Write::ReplyLatency { .. } | Write::Summary { .. }
        )
    }) {
        single(&mut tx, w).await?;
    }
    // Then: a `call.ended` body reports the call with its end, cost and turns.
    if !c.outbox.is_empty() {
        super::outbox::insert(&mut tx, &c.outbox).await?;
    }
    // Last: a summary releases its call's held rows, even those of this very batch.
    for w in c
        .singles
        .iter()
        .filter(|w| matches!(w, Write::Summary { .. }))
    {
        single(&mut tx, w).await?;
    }
    tx.commit().await
}

/// One of the rare writes, as its own statement(s).
async fn single(
    tx: &mut sqlx_core::transaction::Transaction<'_, Postgres>,
    w: &Write,
) -> Result<(), sqlx_core::Error> {
    match w {
        Write::Status {
            call_id,
            status,
            outcome,
            answered_by,
            carrier_duration_s,
        } => {
            // A terminal status is never replaced by a late progress callback.
            if let Some(s) = status {
                query::<Postgres>(
                    "UPDATE calls SET status = $2 WHERE call_id = $1
                       AND ($3 OR status NOT IN ('completed','busy','failed','no-answer','canceled'))",
                )
                .bind(call_id)
                .bind(s)
                .bind(TERMINAL.contains(&s.as_str()))
                .execute(&mut **tx)
                .await?;
            }
            query::<Postgres>(
                "UPDATE calls SET outcome = COALESCE($2, outcome),
                   answered_by = COALESCE($3, answered_by),
                   carrier_duration_s = COALESCE($4, carrier_duration_s)
                 WHERE call_id = $1",
            )
            .bind(call_id)
            .bind(outcome)
            .bind(answered_by)
            .bind(carrier_duration_s.map(|d| d as i64))
            .execute(&mut **tx)
            .await?;
        }
        Write::ReplyLatency {
            call_id,
            latency_us,
        } => {
            query::<Postgres>(
                "UPDATE turns SET response_latency_ms = $2 WHERE call_id = $1
                   AND response_latency_ms IS NULL AND seq = (SELECT MAX(seq) FROM turns
                   WHERE call_id = $1 AND speaker = 'caller')",
            )
            .bind(call_id)
            .bind((latency_us / 1000) as i64)
            .execute(&mut **tx)
            .await?;
        }
        Write::Cost { call_id, cost } => {
            let detail = serde_json::to_string(cost).unwrap_or_default();
            query::<Postgres>(
                "UPDATE calls SET cost_usd = $2, cost_detail = $3 WHERE call_id = $1",
            )
            .bind(call_id)
            .bind(cost.total_usd)
            .bind(detail)
            .execute(&mut **tx)
            .await?;
        }
        Write::Message(m) => super::messages::insert(&mut **tx, m).await?,
        Write::MessageStatus {
            message_id,
            status,
            carrier_message_id,
            error,
            at,
        } => {
            super::messages::update(
                &mut **tx,
                message_id,
                status,
                carrier_message_id.as_deref(),
                error.as_deref(),
                *at,
            )
            .await?
        }
        Write::Leg { call_id, leg_id } => {
            query::<Postgres>("UPDATE calls SET leg_id = $2 WHERE call_id = $1")
                .bind(call_id)
                .bind(leg_id)
                .execute(&mut **tx)
                .await?;
        }
        Write::Summary { call_id, summary } => {
            query::<Postgres>("UPDATE calls SET summary = $2 WHERE call_id = $1")
                .bind(call_id)
                .bind(summary.to_string())
                .execute(&mut **tx)
                .await?;
            super::outbox::release_held(tx, call_id).await?;
        }
        Write::Setting { key, value } => {
            query::<Postgres>(
                "INSERT INTO settings (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value,
                   version = settings.version + 1",
            )
            .bind(key)
            .bind(value)
            .execute(&mut **tx)
            .await?;
            // Peers reload on the notification (delivered at commit) or their next poll.
            query::<Postgres>("SELECT pg_notify($1, $2)")
                .bind(super::settings::CHANNEL)
                .bind(key)
                .execute(&mut **tx)
                .await?;
        }
        _ => {}
    }
    Ok(())
}

impl Sink for PgSink {
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), String> {
        let ended: Vec<String> = batch
            .iter()
            .filter_map(|w| match w {
                Write::Ended { call_id, .. } => Some(call_id.clone()),
                _ => None,
            })
            .collect();
        let columns = self.db.columns(batch);
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        let result = loop {
            let db = &mut self.db;
            let r = self.rt.block_on(async {
                let owner = db.owner.clone();
                let conn = db.connection().await?;
                apply(conn, &owner, &columns).await
            });
            match r {
                Ok(()) => break Ok(()),
                Err(e) if started.elapsed() < RETRY_FOR => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                          "call store (PostgreSQL) batch failed; retrying");
                    // Whatever failed — a dropped connection, a server restarting, a failover —
                    // the next try starts on a fresh connection.
                    self.db.conn = None;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    self.db.conn = None;
                    break Err(format!(
                        "PostgreSQL batch given up after {} s: {e}",
                        RETRY_FOR.as_secs()
                    ));
                }
            }
        };
        // Events after a call's end are rare; its sequence goes once it has ended.
        for id in ended {
            self.db.seqs.remove(&id);
        }
        result
    }

    fn prune(&mut self, cutoff_ms: i64) -> Result<Vec<String>, String> {
        let db = &mut self.db;
        let r = self.rt.block_on(async {
            let conn = db.connection().await?;
            super::outbox::prune(&mut *conn, cutoff_ms).await?;
            query::<Postgres>("DELETE FROM messages WHERE created_at < $1")
                .bind(cutoff_ms)
                .execute(&mut *conn)
                .await?;
            let rows = query::<Postgres>(
                "DELETE FROM calls WHERE created_at < $1 AND ended_at IS NOT NULL RETURNING call_id",
            )
            .bind(cutoff_ms)
            .fetch_all(conn)
            .await?;
            rows.iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<Vec<_>, _>>()
        });
        r.map_err(|e| e.to_string())
    }

    fn ask(&mut self, ask: Ask) {
        let (rt, db) = (&self.rt, &mut self.db);
        match ask {
            Ask::Setting(key, reply) => {
                let r = rt.block_on(async {
                    let conn = db.connection().await?;
                    let row = query::<Postgres>("SELECT value FROM settings WHERE key = $1")
                        .bind(key)
                        .fetch_optional(conn)
                        .await?;
                    row.map(|r| r.try_get::<String, _>(0)).transpose()
                });
                let _ = reply.send(r.map_err(|e| e.to_string()));
            }
        }
    }
}
