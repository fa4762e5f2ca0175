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

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    fn call(id: &str) -> NewCall {
        NewCall {
            call_id: id.into(),
            carrier: "twilio".into(),
            carrier_account: "AC1".into(),
            direction: "inbound",
            from: "+15550001111".into(),
            to: "+15550002222".into(),
            agent: "front-desk".into(),
            status: "ringing".into(),
        }
    }

    /// The database at `url` migrated (by opening a store on it) and three instances' pools.
    async fn migrated(url: &str) -> (tempfile::TempDir, crate::store::Store, Vec<PgPool>) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open_postgres(url, 1, "p0", dir.path(), 30, 16).unwrap();
        let mut pools = Vec::new();
        for _ in 0..3 {
            pools.push(
                PgPoolOptions::new()
                    .max_connections(6)
                    .connect(url)
                    .await
                    .unwrap(),
            );
        }
        (dir, store, pools)
    }

    /// The same webhook handed to three instances six times each, all at once: one claim
    /// wins, and the row names the winner; a non-owner cannot close the winner's claim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_of_many_concurrent_claims_of_a_call_id_wins() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let (_dir, _store, pools) = migrated(&db.url).await;
        let mut tasks = Vec::new();
        for round in 0..6 {
            for (i, pool) in pools.iter().enumerate() {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    let owner = format!("p{i}");
                    let won = claim_call(&pool, &call("CA-race"), &owner, round).await;
                    (owner, won.unwrap())
                }));
            }
        }
        let mut winners = Vec::new();
        for t in tasks {
            let (owner, won) = t.await.unwrap();
            if won {
                winners.push(owner);
            }
        }
        assert_eq!(winners.len(), 1, "winners: {winners:?}");
        let owner: String = sqlx_core::query_scalar::query_scalar::<Postgres, String>(
            "SELECT owner_id FROM calls WHERE call_id = 'CA-race'",
        )
        .fetch_one(&pools[0])
        .await
        .unwrap();
        assert_eq!(owner, winners[0]);
        let other = if owner == "p0" { "p1" } else { "p0" };
        assert!(
            !end_unstarted(&pools[0], "CA-race", other, "test", 1)
                .await
                .unwrap(),
            "only the owner closes its claim"
        );
        assert!(
            end_unstarted(&pools[0], "CA-race", &owner, "test", 1)
                .await
                .unwrap()
        );
        // A closed claim is still a claim: the id is never handed out again.
        assert!(
            !claim_call(&pools[1], &call("CA-race"), "p1", 2)
                .await
                .unwrap()
        );
    }

    /// A nonce seen on one instance is a repeat on every other, whichever asks first and
    /// however many ask at once; scopes are apart; an expired key is new again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_is_first_seen_once_across_instances_until_it_expires() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let (_dir, _store, pools) = migrated(&db.url).await;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            for pool in &pools {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    first_seen(&pool, "plivo-nonce", "n-1", 600.0)
                        .await
                        .unwrap()
                }));
            }
        }
        let mut firsts = 0;
        for t in tasks {
            firsts += usize::from(t.await.unwrap());
        }
        assert_eq!(firsts, 1);
        assert!(
            first_seen(&pools[2], "telnyx-event", "n-1", 600.0)
                .await
                .unwrap(),
            "another scope is apart"
        );
        assert!(
            !first_seen(&pools[1], "plivo-nonce", "n-1", 600.0)
                .await
                .unwrap()
        );
        // Age the key past a 1 s window: it is new once more, and only once.
        sqlx_core::query::query::<Postgres>(
            "UPDATE webhook_seen SET seen_at = now() - interval '5 seconds'",
        )
        .execute(&pools[0])
        .await
        .unwrap();
        assert!(
            first_seen(&pools[1], "plivo-nonce", "n-1", 1.0)
                .await
                .unwrap()
        );
        assert!(
            !first_seen(&pools[2], "plivo-nonce", "n-1", 1.0)
                .await
                .unwrap()
        );
        assert_eq!(
            prune_seen(&pools[0], 3.0).await.unwrap(),
            1,
            "the aged telnyx key"
        );
    }
}
