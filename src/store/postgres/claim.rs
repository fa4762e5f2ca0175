//! The cluster's replay guards on PostgreSQL: claiming a call id (the `calls` row itself,
//! inserted once: `INSERT … ON CONFLICT (call_id) DO NOTHING RETURNING`, so of N instances
//! handed the same webhook exactly one gets a row back and starts the call), closing a claimed
//! row whose call could not start, the carrier's leg id of a call, and `webhook_seen` (a
//! webhook's nonce or event id, first seen once per scope within its time to live). Each is
//! one statement on the store's pool, awaited by the caller (admission, a webhook handler).

use sqlx_core::query::query;
use sqlx_postgres::{PgPool, Postgres};

use crate::store::NewCall;

/// Inserts the call's row owned by `owner`; true when this insert created it (the call id is
/// this instance's), false when any instance already holds a row for it (a replayed webhook).
pub(crate) async fn claim_call(
    pool: &PgPool,
    call: &NewCall,
    owner: &str,
    created_at: i64,
) -> Result<bool, sqlx_core::Error> {
    let row = query::<Postgres>(
        "INSERT INTO calls (call_id, carrier, carrier_account, direction, from_number, to_number,
           agent, status, created_at, owner_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (call_id) DO NOTHING
         RETURNING call_id",
    )
    .bind(&call.call_id)
    .bind(&call.carrier)
    .bind(&call.carrier_account)
    .bind(call.direction)
    .bind(&call.from)
    .bind(&call.to)
    .bind(&call.agent)
    .bind(&call.status)
    .bind(created_at)
    .bind(owner)
    .fetch_optional(pool)
    .await?;
    Ok(row.is_some())
}

/// Closes the row `owner` claimed for a call that never started (refused after the claim,
/// e.g. `max_calls` reached): status `busy`, ended now for `reason`. True when a row changed.
pub(crate) async fn end_unstarted(
    pool: &PgPool,
    call_id: &str,
    owner: &str,
    reason: &str,
    at: i64,
) -> Result<bool, sqlx_core::Error> {
    let done = query::<Postgres>(
        "UPDATE calls SET status = 'busy', outcome = COALESCE(outcome, 'busy'),
           ended_reason = $3, ended_at = $4, duration_ms = 0
         WHERE call_id = $1 AND owner_id = $2 AND ended_at IS NULL",
    )
    .bind(call_id)
    .bind(owner)
    .bind(reason)
    .bind(at)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records `key` in `scope`; true when it was not seen within `ttl_s` seconds (a new row, or
/// an expired one taken over), false for a repeat.
pub(crate) async fn first_seen(
    pool: &PgPool,
    scope: &str,
    key: &str,
    ttl_s: f64,
) -> Result<bool, sqlx_core::Error> {
    let done = query::<Postgres>(
        "INSERT INTO webhook_seen (scope, key) VALUES ($1, $2)
         ON CONFLICT (scope, key) DO UPDATE SET seen_at = now()
           WHERE webhook_seen.seen_at < now() - make_interval(secs => $3)",
    )
    .bind(scope)
    .bind(key)
    .bind(ttl_s)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Forgets the replay guard's keys older than `max_age_s`; returns how many went.
pub(crate) async fn prune_seen(pool: &PgPool, max_age_s: f64) -> Result<u64, sqlx_core::Error> {
    let done = query::<Postgres>(
        "DELETE FROM webhook_seen WHERE seen_at < now() - make_interval(secs => $1)",
    )
    .bind(max_age_s)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
