//! MCP sessions shared by the cluster (`mcp_sessions`): what rmcp needs to continue a session
//! opened on another instance — the client's `initialize` parameters, as JSON. A row is written
//! after the handshake, read by an instance that does not have the session in memory (which
//! then replays the handshake), deleted when the client ends the session (`DELETE /mcp`).
//! Reading a row renews it; a row neither written nor read for its time to live is expired:
//! [`load`] ignores it and [`prune`] deletes it. The trait rmcp calls is
//! `crate::mcp::session_store`.

use std::time::Duration;

use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgPool, Postgres};

/// Writes (or replaces) session `id`'s state, renewing it.
pub(crate) async fn store(pool: &PgPool, id: &str, state: &str) -> Result<(), sqlx_core::Error> {
    query::<Postgres>(
        "INSERT INTO mcp_sessions (session_id, state, updated_at) VALUES ($1, $2::jsonb, now())
         ON CONFLICT (session_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now()",
    )
    .bind(id)
    .bind(state)
    .execute(pool)
    .await?;
    Ok(())
}

/// Session `id`'s state (its JSON text) when it exists and was used within `ttl`, renewing it.
pub(crate) async fn load(
    pool: &PgPool,
    id: &str,
    ttl: Duration,
) -> Result<Option<String>, sqlx_core::Error> {
    query::<Postgres>(
        "UPDATE mcp_sessions SET updated_at = now()
         WHERE session_id = $1 AND updated_at > now() - make_interval(secs => $2)
         RETURNING state::text",
    )
    .bind(id)
    .bind(ttl.as_secs_f64())
    .fetch_optional(pool)
    .await?
    .map(|r| r.try_get(0))
    .transpose()
}

/// Forgets session `id`; true when it was stored.
pub(crate) async fn delete(pool: &PgPool, id: &str) -> Result<bool, sqlx_core::Error> {
    let done = query::<Postgres>("DELETE FROM mcp_sessions WHERE session_id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes the sessions unused for `ttl`; returns how many went.
pub(crate) async fn prune(pool: &PgPool, ttl: Duration) -> Result<u64, sqlx_core::Error> {
    let done = query::<Postgres>(
        "DELETE FROM mcp_sessions WHERE updated_at <= now() - make_interval(secs => $1)",
    )
    .bind(ttl.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    /// A session's row: written, read back (from another pool, as a peer would), replaced,
    /// expired after its time to live (not loaded, then pruned), and gone after a delete.
    #[tokio::test]
    async fn session_rows_are_shared_renewed_expired_and_deleted() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let _store =
            crate::store::Store::open_postgres(&db.url, 1, "p0", dir.path(), 30, 16).unwrap();
        let connect = || PgPoolOptions::new().max_connections(2).connect(&db.url);
        let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
        let hour = Duration::from_secs(3600);

        store(&a, "s1", r#"{"initialize_params": {"x": 1}}"#)
            .await
            .unwrap();
        let got = load(&b, "s1", hour).await.unwrap().expect("stored");
        let v: serde_json::Value = serde_json::from_str(&got).unwrap();
        assert_eq!(v["initialize_params"]["x"], 1);
        assert_eq!(load(&b, "unknown", hour).await.unwrap(), None);
        store(&b, "s1", r#"{"initialize_params": {"x": 2}}"#)
            .await
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&load(&a, "s1", hour).await.unwrap().unwrap()).unwrap();
        assert_eq!(v["initialize_params"]["x"], 2, "replaced");

        // Unused for longer than its time to live: not loaded, and pruned.
        store(&a, "old", "{}").await.unwrap();
        query::<Postgres>(
            "UPDATE mcp_sessions SET updated_at = now() - interval '2 hours' WHERE session_id = 'old'",
        )
        .execute(&a)
        .await
        .unwrap();
        assert_eq!(load(&b, "old", hour).await.unwrap(), None, "expired");
        assert_eq!(prune(&a, hour).await.unwrap(), 1);
        assert!(!delete(&a, "old").await.unwrap(), "already pruned");

        // A load renews: a row read now survives a prune of everything older than a moment ago.
        query::<Postgres>(
            "UPDATE mcp_sessions SET updated_at = now() - interval '30 minutes' WHERE session_id = 's1'",
        )
        .execute(&a)
        .await
        .unwrap();
        assert!(load(&b, "s1", hour).await.unwrap().is_some());
        assert_eq!(prune(&a, Duration::from_secs(600)).await.unwrap(), 0);

        assert!(delete(&b, "s1").await.unwrap());
        assert_eq!(load(&a, "s1", hour).await.unwrap(), None, "deleted");
    }
}
