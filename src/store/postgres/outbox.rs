//! The webhook outbox on PostgreSQL (`store::outbox` is the SQLite side and the types): rows
//! inserted by the writer in its batch's transaction (after the batch's other writes, so a
//! `call.ended` body sees the call's end, cost and turns), claimed by any instance with
//! `FOR UPDATE SKIP LOCKED` and a lease on the database's clock, settled only by the claim's
//! holder. Times are epoch milliseconds, as in the other tables.

use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_core::sql_str::AssertSqlSafe;
use sqlx_postgres::{PgConnection, PgRow, Postgres};

use super::{Reads, call_on, failed, map_rows, turns_on};
use crate::store::StoreError;
use crate::store::outbox::{
    DeliveryRow, OutboxBody, OutboxCounts, OutboxEvent, OutboxRow, Settle, call_ended_body, parts,
};

/// Now on the database's clock, in ms since the epoch.
const DB_NOW_MS: &str = "(extract(epoch FROM now()) * 1000)::int8";

/// Inserts a batch's outbox events inside its transaction (`conn`); a retried batch inserts
/// nothing twice (the ids were drawn before the first attempt).
pub(super) async fn insert(
    conn: &mut PgConnection,
    events: &[OutboxEvent],
) -> Result<(), sqlx_core::Error> {
    for e in events {
        let body = match &e.body {
            OutboxBody::Ready(b) => b.clone(),
            OutboxBody::CallEnded => {
                let Some(call) = call_on(&mut *conn, &e.call_id).await? else {
                    tracing::warn!(call_id = %e.call_id, "call.ended for a call the store has no row of; not sent");
                    continue;
                };
                let turns = turns_on(&mut *conn, &e.call_id).await?;
                call_ended_body(e.at, &call, &turns)
            }
        };
        query::<Postgres>(AssertSqlSafe(format!(
            "INSERT INTO webhook_outbox (id, url, event, call_id, body, state, created_at,
               window_start, next_at)
             VALUES ($1, $2, $3, $4, $5, $6, {DB_NOW_MS}, {DB_NOW_MS}, {DB_NOW_MS})
             ON CONFLICT (id) DO NOTHING"
        )))
        .bind(&e.id)
        .bind(&e.url)
        .bind(e.event.as_str())
        .bind(&e.call_id)
        .bind(body)
        .bind(if e.held { "held" } else { "pending" })
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The summary of `call_id` was stored (in `conn`'s transaction): its held deliveries are due
/// now, each `call.ended` made again from the call as it now stands.
pub(super) async fn release_held(
    conn: &mut PgConnection,
    call_id: &str,
) -> Result<(), sqlx_core::Error> {
    let held = query::<Postgres>(
        "SELECT id, event FROM webhook_outbox WHERE call_id = $1 AND state = 'held'",
    )
    .bind(call_id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    if held.is_empty() {
        return Ok(());
    }
    let call = call_on(&mut *conn, call_id).await?;
    let turns = turns_on(&mut *conn, call_id).await?;
    for r in &held {
        let (id, event): (String, String) = (r.try_get(0)?, r.try_get(1)?);
        let body = match &call {
            Some(call) if event == crate::config::WebhookEvent::CallEnded.as_str() => {
                Some(call_ended_body(crate::store::now_ms(), call, &turns))
            }
            _ => None,
        };
        query::<Postgres>(AssertSqlSafe(format!(
            "UPDATE webhook_outbox SET state = 'pending', next_at = {DB_NOW_MS},
               body = COALESCE($2, body) WHERE id = $1 AND state = 'held'"
        )))
        .bind(id)
        .bind(body)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Deletes delivered and dead rows created before `cutoff_ms` (the writer's retention).
pub(super) async fn prune(conn: &mut PgConnection, cutoff_ms: i64) -> Result<(), sqlx_core::Error> {
    query::<Postgres>(
        "DELETE FROM webhook_outbox WHERE created_at < $1 AND state IN ('delivered', 'dead')",
    )
    .bind(cutoff_ms)
    .execute(conn)
    .await
    .map(|_| ())
}

const DELIVERY_COLUMNS: &str = "id, event, url, call_id, state, attempts::int8, created_at,
    CASE WHEN state = 'pending' THEN next_at END, last_status::int8, last_error, done_at";

fn delivery_row(r: &PgRow) -> Result<DeliveryRow, sqlx_core::Error> {
    Ok(DeliveryRow {
        id: r.try_get(0)?,
        event: r.try_get(1)?,
        url: r.try_get(2)?,
        call_id: r.try_get(3)?,
        state: r.try_get(4)?,
        attempts: r.try_get(5)?,
        created_at: r.try_get(6)?,
        next_attempt_at: r.try_get(7)?,
        last_status: r.try_get(8)?,
        last_error: r.try_get(9)?,
        done_at: r.try_get(10)?,
    })
}

impl Reads {
    pub(crate) async fn outbox_claim(
        &self,
        owner: &str,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let rows = query::<Postgres>(AssertSqlSafe(format!(
            "UPDATE webhook_outbox o SET claimed_by = $1, lease_until = {DB_NOW_MS} + $2
             FROM (SELECT id FROM webhook_outbox
                   WHERE state = 'pending' AND next_at <= {DB_NOW_MS}
                     AND (lease_until IS NULL OR lease_until <= {DB_NOW_MS})
                   ORDER BY next_at LIMIT $3
                   FOR UPDATE SKIP LOCKED) due
             WHERE o.id = due.id
             RETURNING o.id, o.url, o.event, o.call_id, o.body, o.attempts::int8, o.window_start"
        )))
        .bind(owner.to_string())
        .bind(lease_ms)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(failed)?;
        map_rows(&rows, |r| {
            Ok(OutboxRow {
                id: r.try_get(0)?,
                url: r.try_get(1)?,
                event: r.try_get(2)?,
                call_id: r.try_get(3)?,
                body: r.try_get(4)?,
                attempts: r.try_get(5)?,
                window_start: r.try_get(6)?,
            })
        })
    }

    pub(crate) async fn outbox_settle(
        &self,
        owner: &str,
        id: &str,
        s: &Settle,
    ) -> Result<bool, StoreError> {
        // The delay is added on the database's clock: `parts` gets 0 for "now".
        let (state, status, error, delay, attempted) = parts(s, 0);
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "UPDATE webhook_outbox SET state = $3::text, attempts = attempts + $4,
               last_status = $5, last_error = $6,
               next_at = COALESCE({DB_NOW_MS} + $7::int8, next_at),
               done_at = CASE WHEN $3::text = 'pending' THEN NULL ELSE {DB_NOW_MS} END,
               claimed_by = NULL, lease_until = NULL
             WHERE id = $1 AND claimed_by = $2 AND state = 'pending'"
        )))
        .bind(id.to_string())
        .bind(owner.to_string())
        .bind(state)
        .bind(i32::from(attempted))
        .bind(status.map(i32::from))
        .bind(error.map(str::to_string))
        .bind(delay)
        .execute(self.pool())
        .await
        .map_err(failed)?;
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        let r = query::<Postgres>(
            "SELECT COUNT(*) FILTER (WHERE state = 'pending'), COUNT(*) FILTER (WHERE state = 'held'),
               COUNT(*) FILTER (WHERE state = 'dead')
             FROM webhook_outbox WHERE state IN ('pending', 'held', 'dead')",
        )
        .fetch_one(self.pool())
        .await
        .map_err(failed)?;
        let n = |i: usize| -> Result<u64, StoreError> {
            Ok(r.try_get::<i64, _>(i).map_err(failed)?.max(0) as u64)
        };
        Ok(OutboxCounts {
            pending: n(0)?,
            held: n(1)?,
            dead: n(2)?,
        })
    }

    pub(crate) async fn outbox_list(
        &self,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let rows = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_outbox WHERE ($1::text IS NULL OR state = $1)
             ORDER BY created_at DESC, id LIMIT $2"
        )))
        .bind(state.map(str::to_string))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(failed)?;
        map_rows(&rows, delivery_row)
    }

    pub(crate) async fn outbox_get(&self, id: &str) -> Result<Option<DeliveryRow>, StoreError> {
        let row = query::<Postgres>(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_outbox WHERE id = $1"
        )))
        .bind(id.to_string())
        .fetch_optional(self.pool())
        .await
        .map_err(failed)?;
        row.as_ref().map(delivery_row).transpose().map_err(failed)
    }

    pub(crate) async fn outbox_release_stale(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "UPDATE webhook_outbox SET state = 'pending', next_at = {DB_NOW_MS}
             WHERE state = 'held' AND created_at < {DB_NOW_MS} - $1"
        )))
        .bind(older_than_ms)
        .execute(self.pool())
        .await
        .map_err(failed)?;
        Ok(r.rows_affected())
    }

    pub(crate) async fn outbox_retry(&self, id: &str) -> Result<bool, StoreError> {
        let r = query::<Postgres>(AssertSqlSafe(format!(
            "UPDATE webhook_outbox SET state = 'pending', next_at = {DB_NOW_MS},
               window_start = {DB_NOW_MS}, done_at = NULL WHERE id = $1 AND state = 'dead'"
        )))
        .bind(id.to_string())
        .execute(self.pool())
        .await
        .map_err(failed)?;
        Ok(r.rows_affected() == 1)
    }
}
