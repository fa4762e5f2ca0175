//! The webhook outbox: one row per event and receiver (`[[webhooks]]` url) in `webhook_outbox`,
//! written by the writer thread in the batch's transaction — a call's `call.ended` rows with the
//! call's end row ([`super::Write::Ended`]), so a crash loses neither without the other — and
//! delivered by `app::webhooks`, which claims due rows with a lease, posts them and settles each
//! attempt ([`Settle`]): delivered, retried at a later `next_at`, or dead (the dead-letter list
//! of `GET /v1/webhooks/deliveries`). A row's id is its Standard Webhooks `webhook-id`, drawn
//! once when the event happens, so every attempt and every backend retry carries the same one.
//! The body of `call.ended` is made here, inside the transaction, from the rows it reports
//! (the call, its transcript with the turn latencies, its cost). This file is the SQLite side;
//! `postgres/outbox.rs` runs the same statements in PostgreSQL's dialect.

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::{Value, json};

use super::model::{CallRow, TurnRow};
use crate::config::WebhookEvent;

/// An event for the outbox, made when it happens (`app::observe`).
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    /// The `webhook-id` (`msg_` + 32 hex digits).
    pub id: String,
    /// The receiver (`[[webhooks]]` url).
    pub url: String,
    pub event: WebhookEvent,
    pub call_id: String,
    /// When it happened (ms since the epoch): the payload's `timestamp`.
    pub at: i64,
    pub body: OutboxBody,
    /// Not delivered until released (a `call.ended` waiting for the call's summary).
    pub held: bool,
}

/// What an outbox row will send.
#[derive(Debug, Clone)]
pub enum OutboxBody {
    /// This exact body.
    Ready(String),
    /// `call.ended`: made from the call's rows in the transaction that ends it.
    CallEnded,
}

/// A new `webhook-id`: `msg_` and 16 random bytes in hex.
pub fn new_id() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 16];
    if SystemRandom::new().fill(&mut b).is_err() {
        // No entropy source at all: still unique within this process.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8..].copy_from_slice(&super::now_ms().to_le_bytes());
    }
    format!("msg_{}", hex::encode(b))
}

/// The Standard Webhooks payload: `{"type", "timestamp", "data"}`.
pub fn envelope(event: WebhookEvent, at_ms: i64, data: Value) -> String {
    json!({
        "type": event.as_str(),
        "timestamp": crate::util::time::rfc3339_ms(at_ms),
        "data": data,
    })
    .to_string()
}

/// The caller turns' reply latencies, summed up.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Caller turns with a measured reply latency.
    pub turns: usize,
    pub avg_ms: Option<f64>,
    pub p50_ms: Option<i64>,
    pub max_ms: Option<i64>,
}

impl Latency {
    fn of(turns: &[TurnRow]) -> Self {
        let mut l: Vec<i64> = turns.iter().filter_map(|t| t.response_latency_ms).collect();
        l.sort_unstable();
        if l.is_empty() {
            return Self::default();
        }
        Self {
            turns: l.len(),
            avg_ms: Some(l.iter().sum::<i64>() as f64 / l.len() as f64),
            p50_ms: l.get(l.len() / 2).copied(),
            max_ms: l.last().copied(),
        }
    }
}

/// The body of `call.ended`: the call as `GET /v1/calls/{id}` serves it (with its cost and
/// summary), its transcript (each caller turn with its reply latency) and the latencies summed
/// up. Its `timestamp` is the call's end (`at_ms` if the row has none).
pub(crate) fn call_ended_body(at_ms: i64, call: &CallRow, turns: &[TurnRow]) -> String {
    envelope(
        WebhookEvent::CallEnded,
        call.ended_at.unwrap_or(at_ms),
        json!({
            "call": call,
            "transcript": turns,
            "latency": Latency::of(turns),
        }),
    )
}

/// One row ready to deliver, as claimed.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: String,
    pub url: String,
    pub event: String,
    pub call_id: String,
    pub body: String,
    /// Attempts before this one.
    pub attempts: i64,
    /// When the current delivery window began (the event, or a manual retry): the give-up
    /// clock starts here.
    pub window_start: i64,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// The receiver answered 2xx.
    Delivered { status: u16 },
    /// Failed; try again `delay_ms` from now.
    Retry {
        status: Option<u16>,
        error: String,
        delay_ms: u64,
    },
    /// Given up: into the dead-letter list. `attempted`: a request went out (counted).
    Dead {
        status: Option<u16>,
        error: String,
        attempted: bool,
    },
}

/// A delivery as `GET /v1/webhooks/deliveries` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryRow {
    /// The `webhook-id`.
    pub id: String,
    pub event: String,
    pub url: String,
    pub call_id: String,
    /// `held`, `pending`, `delivered` or `dead`.
    pub state: String,
    pub attempts: i64,
    pub created_at: i64,
    /// When the next attempt is due (pending only).
    pub next_attempt_at: Option<i64>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    /// When it was delivered or dead-lettered.
    pub done_at: Option<i64>,
}

/// How many rows are in each state that matters for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    pub pending: u64,
    pub held: u64,
    pub dead: u64,
}

/// The states a listing may filter on.
pub const STATES: &[&str] = &["held", "pending", "delivered", "dead"];

const DELIVERY_COLUMNS: &str = "id, event, url, call_id, state, attempts, created_at,
    CASE WHEN state = 'pending' THEN next_at END, last_status, last_error, done_at";

// ------------------------------------------------------------------------------------ SQLite

/// Inserts `events` for a batch being committed (`tx`); `call.ended` bodies are made from
/// the call's rows as they stand in the transaction. A call without a row gets none.
pub(super) fn insert_sqlite(
    tx: &Connection,
    events: Vec<OutboxEvent>,
    now: i64,
) -> Result<(), rusqlite::Error> {
    for e in events {
        let body = match e.body {
            OutboxBody::Ready(b) => b,
            OutboxBody::CallEnded => {
                let Some(call) = super::model::get_call(tx, &e.call_id)? else {
                    tracing::warn!(call_id = %e.call_id, "call.ended for a call the store has no row of; not sent");
                    continue;
                };
                let turns = super::model::turns(tx, &e.call_id)?;
                call_ended_body(e.at, &call, &turns)
            }
        };
        tx.execute(
            "INSERT OR IGNORE INTO webhook_outbox (id, url, event, call_id, body, state,
               created_at, window_start, next_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7)",
            params![
                e.id,
                e.url,
                e.event.as_str(),
                e.call_id,
                body,
                if e.held { "held" } else { "pending" },
                now
            ],
        )?;
    }
    Ok(())
}

/// The summary of `call_id` was stored (in `tx`): its held deliveries are due now, each
/// `call.ended` made again from the call as it now stands.
pub(super) fn release_held_sqlite(
    tx: &Connection,
    call_id: &str,
    now: i64,
) -> Result<(), rusqlite::Error> {
    let held: Vec<(String, String)> = tx
        .prepare("SELECT id, event FROM webhook_outbox WHERE call_id = ?1 AND state = 'held'")?
        .query_map([call_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    if held.is_empty() {
        return Ok(());
    }
    let call = super::model::get_call(tx, call_id)?;
    let turns = super::model::turns(tx, call_id)?;
    for (id, event) in held {
        let body = match &call {
            Some(call) if event == WebhookEvent::CallEnded.as_str() => {
                Some(call_ended_body(now, call, &turns))
            }
            _ => None,
        };
        tx.execute(
            "UPDATE webhook_outbox SET state = 'pending', next_at = ?2, body = COALESCE(?3, body)
             WHERE id = ?1 AND state = 'held'",
            params![id, now, body],
        )?;
    }
    Ok(())
}

/// Held deliveries created before `cutoff` are due now, as they are.
pub(super) fn release_stale_sqlite(
    c: &Connection,
    cutoff: i64,
    now: i64,
) -> Result<usize, rusqlite::Error> {
    c.execute(
        "UPDATE webhook_outbox SET state = 'pending', next_at = ?2
         WHERE state = 'held' AND created_at < ?1",
        params![cutoff, now],
    )
}

/// At open, one instance: whatever the last process had claimed is free again.
pub(super) fn release_claims_sqlite(c: &Connection) -> Result<usize, rusqlite::Error> {
    c.execute(
        "UPDATE webhook_outbox SET claimed_by = NULL, lease_until = NULL
         WHERE claimed_by IS NOT NULL",
        [],
    )
}

pub(super) fn claim_sqlite(
    c: &Connection,
    owner: &str,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> Result<Vec<OutboxRow>, rusqlite::Error> {
    let mut q = c.prepare(
        "UPDATE webhook_outbox SET claimed_by = ?1, lease_until = ?2 + ?3
         WHERE id IN (SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_at <= ?2
           AND (lease_until IS NULL OR lease_until <= ?2) ORDER BY next_at LIMIT ?4)
         RETURNING id, url, event, call_id, body, attempts, window_start",
    )?;
    q.query_map(params![owner, now, lease_ms, limit as i64], |r| {
        Ok(OutboxRow {
            id: r.get(0)?,
            url: r.get(1)?,
            event: r.get(2)?,
            call_id: r.get(3)?,
            body: r.get(4)?,
            attempts: r.get(5)?,
            window_start: r.get(6)?,
        })
    })?
    .collect()
}

/// Settles a claimed row; false when the claim was no longer ours (its lease ran out and
/// another took it, or it was settled already).
pub(super) fn settle_sqlite(
    c: &Connection,
    owner: &str,
    id: &str,
    s: &Settle,
    now: i64,
) -> Result<bool, rusqlite::Error> {
    let (state, status, error, next_at, attempted) = parts(s, now);
    let n = c.execute(
        "UPDATE webhook_outbox SET state = ?3, attempts = attempts + ?4, last_status = ?5,
           last_error = ?6, next_at = COALESCE(?7, next_at),
           done_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE ?8 END,
           claimed_by = NULL, lease_until = NULL
         WHERE id = ?1 AND claimed_by = ?2 AND state = 'pending'",
        params![
            id,
            owner,
            state,
            i64::from(attempted),
            status.map(i64::from),
            error,
            next_at,
            now
        ],
    )?;
    Ok(n == 1)
}

/// The columns a [`Settle`] writes: state, status, error, next attempt, whether it counts.
pub(super) fn parts(
    s: &Settle,
    now: i64,
) -> (&'static str, Option<u16>, Option<&str>, Option<i64>, bool) {
    match s {
        Settle::Delivered { status } => ("delivered", Some(*status), None, None, true),
        Settle::Retry {
            status,
            error,
            delay_ms,
        } => (
            "pending",
            *status,
            Some(error.as_str()),
            Some(now.saturating_add(i64::try_from(*delay_ms).unwrap_or(i64::MAX))),
            true,
        ),
        Settle::Dead {
            status,
            error,
            attempted,
        } => ("dead", *status, Some(error.as_str()), None, *attempted),
    }
}

pub(super) fn counts_sqlite(c: &Connection) -> Result<OutboxCounts, rusqlite::Error> {
    c.query_row(
        "SELECT COUNT(*) FILTER (WHERE state = 'pending'), COUNT(*) FILTER (WHERE state = 'held'),
           COUNT(*) FILTER (WHERE state = 'dead')
         FROM webhook_outbox WHERE state IN ('pending', 'held', 'dead')",
        [],
        |r| {
            Ok(OutboxCounts {
                pending: r.get::<_, i64>(0)?.max(0) as u64,
                held: r.get::<_, i64>(1)?.max(0) as u64,
                dead: r.get::<_, i64>(2)?.max(0) as u64,
            })
        },
    )
}

fn delivery_row(r: &rusqlite::Row<'_>) -> Result<DeliveryRow, rusqlite::Error> {
    Ok(DeliveryRow {
        id: r.get(0)?,
        event: r.get(1)?,
        url: r.get(2)?,
        call_id: r.get(3)?,
        state: r.get(4)?,
        attempts: r.get(5)?,
        created_at: r.get(6)?,
        next_attempt_at: r.get(7)?,
        last_status: r.get(8)?,
        last_error: r.get(9)?,
        done_at: r.get(10)?,
    })
}

pub(super) fn list_sqlite(
    c: &Connection,
    state: Option<&str>,
    limit: usize,
) -> Result<Vec<DeliveryRow>, rusqlite::Error> {
    let mut q = c.prepare(&format!(
        "SELECT {DELIVERY_COLUMNS} FROM webhook_outbox WHERE (?1 IS NULL OR state = ?1)
         ORDER BY created_at DESC, id LIMIT ?2"
    ))?;
    q.query_map(params![state, limit as i64], delivery_row)?
        .collect()
}

pub(super) fn get_sqlite(c: &Connection, id: &str) -> Result<Option<DeliveryRow>, rusqlite::Error> {
    c.query_row(
        &format!("SELECT {DELIVERY_COLUMNS} FROM webhook_outbox WHERE id = ?1"),
        [id],
        delivery_row,
    )
    .optional()
}

/// A dead letter back into the queue, due now, with a new delivery window.
pub(super) fn retry_sqlite(c: &Connection, id: &str, now: i64) -> Result<bool, rusqlite::Error> {
    let n = c.execute(
        "UPDATE webhook_outbox SET state = 'pending', next_at = ?2, window_start = ?2,
           done_at = NULL WHERE id = ?1 AND state = 'dead'",
        params![id, now],
    )?;
    Ok(n == 1)
}

/// Deletes delivered and dead rows created before `cutoff_ms` (the retention).
pub(super) fn prune_sqlite(c: &Connection, cutoff_ms: i64) -> Result<usize, rusqlite::Error> {
    c.execute(
        "DELETE FROM webhook_outbox WHERE created_at < ?1 AND state IN ('delivered', 'dead')",
        [cutoff_ms],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(seq: i64, speaker: &str, latency: Option<i64>) -> TurnRow {
        TurnRow {
            seq,
            speaker: speaker.into(),
            text: "t".into(),
            heard_text: "t".into(),
            interrupted: false,
            start_ms: 0,
            end_ms: 1,
            response_latency_ms: latency,
        }
    }

    #[test]
    fn latencies_sum_the_measured_caller_turns() {
        let turns = [
            turn(0, "agent", None),
            turn(1, "caller", Some(700)),
            turn(2, "agent", None),
            turn(3, "caller", Some(500)),
            turn(4, "caller", Some(900)),
            turn(5, "caller", None),
        ];
        let l = Latency::of(&turns);
        assert_eq!(l.turns, 3);
        assert_eq!(l.avg_ms, Some(700.0));
        assert_eq!(l.p50_ms, Some(700));
        assert_eq!(l.max_ms, Some(900));
        assert_eq!(Latency::of(&[]), Latency::default());
    }

    #[test]
    fn the_envelope_is_standard_webhooks_shaped() {
        let v: Value = serde_json::from_str(&envelope(
            WebhookEvent::CallStarted,
            1_674_087_231_344,
            json!({"call_id": "CA1"}),
        ))
        .expect("json");
        assert_eq!(
            v,
            json!({"type": "call.started", "timestamp": "2023-01-19T00:13:51.344Z",
                   "data": {"call_id": "CA1"}})
        );
    }

    #[test]
    fn ids_are_distinct_and_dot_free() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert!(
            a.starts_with("msg_") && a.len() == 36 && !a.contains('.'),
            "{a}"
        );
    }
}
