//! The drain hand-off's statements: which peers may take a new call this instance refuses busy
//! (the `ready` instances with a fresh heartbeat, most free capacity first; the lease is judged
//! on the database's clock), and releasing a replay-guard key this instance recorded for a
//! webhook it hands on, so the peer's guard takes the webhook as new. The policy is `app::cluster::handoff`; membership (registration, heartbeats, the
//! `draining` state) is `store::postgres::members`.

use std::time::Duration;

use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgPool, Postgres};

/// A peer that may take a handed-off webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) name: String,
    pub(crate) internal_url: String,
    /// `max_calls − live_calls` at its last heartbeat (≤ 0: full).
    pub(crate) free: i64,
}

/// The `ready` peers (this instance, `me`, excluded) whose heartbeat is fresher than `lease`,
/// the most free capacity first.
pub(crate) async fn ready_peers(
    pool: &PgPool,
    me: &str,
    lease: Duration,
) -> Result<Vec<Peer>, sqlx_core::Error> {
    query::<Postgres>(
        "SELECT name, internal_url, (max_calls - live_calls)::int8 AS free FROM instances
         WHERE state = 'ready' AND name <> $1
           AND heartbeat_at > now() - make_interval(secs => $2)
         ORDER BY free DESC, name",
    )
    .bind(me)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?
    .iter()
    .map(|r| {
        Ok(Peer {
            name: r.try_get(0)?,
            internal_url: r.try_get(1)?,
            free: r.try_get(2)?,
        })
    })
    .collect()
}

/// Forgets `key` in the replay guard's `scope` (`webhook_seen`); true when it was recorded.
pub(crate) async fn release_seen(
    pool: &PgPool,
    scope: &str,
    key: &str,
) -> Result<bool, sqlx_core::Error> {
    let done = query::<Postgres>("DELETE FROM webhook_seen WHERE scope = $1 AND key = $2")
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    /// Only ready peers with a fresh heartbeat, never this instance, the freest first; a
    /// released replay key is new again.
    #[tokio::test]
    async fn ready_peers_are_fresh_ready_others_freest_first() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let _store =
            crate::store::Store::open_postgres(&db.url, 1, "p0", dir.path(), 30, 16).unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&db.url)
            .await
            .unwrap();
        for (name, state, live, age_s) in [
            ("p0", "ready", 0, 0),
            ("p1", "ready", 8, 0),
            ("p2", "ready", 2, 0),
            ("p3", "draining", 0, 0),
            ("p4", "ready", 0, 60),
            ("p5", "stopped", 0, 0),
        ] {
            query::<Postgres>(
                "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state,
                   version, max_calls, live_calls, heartbeat_at)
                 VALUES ($1, 'i', 'http://' || $1, 'http://' || $1, $2, 'v', 10, $3,
                   now() - make_interval(secs => $4))",
            )
            .bind(name)
            .bind(state)
            .bind(live)
            .bind(f64::from(age_s))
            .execute(&pool)
            .await
            .unwrap();
        }
        let peers = ready_peers(&pool, "p0", Duration::from_secs(10))
            .await
            .unwrap();
        let names: Vec<(&str, i64)> = peers.iter().map(|p| (p.name.as_str(), p.free)).collect();
        assert_eq!(names, [("p2", 8), ("p1", 2)]);
        assert_eq!(peers[0].internal_url, "http://p2");
        sqlx_core::query::query::<Postgres>(
            "UPDATE instances SET state = 'draining' WHERE name = 'p2'",
        )
        .execute(&pool)
        .await
        .unwrap();
        let peers = ready_peers(&pool, "p0", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(
            peers.len(),
            1,
            "a draining peer takes no hand-off: {peers:?}"
        );

        assert!(
            crate::store::postgres::claim::first_seen(&pool, "nonce", "n1", 60.0)
                .await
                .unwrap()
        );
        assert!(release_seen(&pool, "nonce", "n1").await.unwrap());
        assert!(
            crate::store::postgres::claim::first_seen(&pool, "nonce", "n1", 60.0)
                .await
                .unwrap(),
            "new again for the peer"
        );
        assert!(!release_seen(&pool, "nonce", "other").await.unwrap());
    }
}
