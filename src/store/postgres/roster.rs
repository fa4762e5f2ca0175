//! The cluster's instances as an operator reads them (`GET /v1/cluster`, the cluster-wide
//! `live_calls` of `GET /v1/metrics`): every `instances` row with its heartbeat's age judged
//! on the database's clock. Read-only; membership (`members`) writes the rows.

use serde::Serialize;
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgPool, Postgres};

/// One instance, as `GET /v1/cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Member {
    pub(crate) name: String,
    /// `ready`, `draining`, `stopped` or `lost`.
    pub(crate) state: String,
    pub(crate) version: String,
    pub(crate) advertise_url: String,
    pub(crate) internal_url: String,
    pub(crate) max_calls: i64,
    /// As of its last heartbeat.
    pub(crate) live_calls: i64,
    /// Milliseconds since epoch.
    pub(crate) started_at: i64,
    /// How long ago its last heartbeat was, on the database's clock.
    pub(crate) heartbeat_age_ms: i64,
    /// Running (`ready` or `draining`) with its lease fresh.
    pub(crate) live: bool,
}

/// Every instance, by name; `live` judged with `lease_ms`.
pub(crate) async fn members(pool: &PgPool, lease_ms: u64) -> Result<Vec<Member>, sqlx_core::Error> {
    let rows = query::<Postgres>(
        "SELECT name, state, version, advertise_url, internal_url, max_calls, live_calls,
                (extract(epoch FROM started_at) * 1000)::int8,
                GREATEST((extract(epoch FROM now() - heartbeat_at) * 1000)::int8, 0)
         FROM instances ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let state: String = r.try_get(1)?;
            let age: i64 = r.try_get(8)?;
            let live = matches!(state.as_str(), "ready" | "draining")
                && u64::try_from(age).is_ok_and(|a| a <= lease_ms);
            Ok(Member {
                name: r.try_get(0)?,
                state,
                version: r.try_get(2)?,
                advertise_url: r.try_get(3)?,
                internal_url: r.try_get(4)?,
                max_calls: i64::from(r.try_get::<i32, _>(5)?),
                live_calls: i64::from(r.try_get::<i32, _>(6)?),
                started_at: r.try_get(7)?,
                heartbeat_age_ms: age,
                live,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn members_are_listed_with_their_lease_judged_on_the_database_clock() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        // Opening the store runs the migrations.
        let _store = crate::store::Store::open_postgres(&db.url, 1, "me", dir.path(), 30, 16)
            .expect("store");
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&db.url)
            .await
            .expect("connect");
        for (name, state, ago) in [
            ("a", "ready", "0 seconds"),
            ("b", "draining", "0 seconds"),
            ("c", "ready", "1 hour"),
            ("d", "lost", "0 seconds"),
        ] {
            sqlx_core::query::query::<Postgres>(sqlx_core::sql_str::AssertSqlSafe(format!(
                "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state,
                   version, max_calls, live_calls, heartbeat_at)
                 VALUES ('{name}', 'i', 'http://{name}:1', 'http://{name}:2', '{state}', 'v1',
                   100, 7, now() - interval '{ago}')"
            )))
            .execute(&pool)
            .await
            .expect("insert");
        }
        let m = members(&pool, 10_000).await.expect("members");
        let view: Vec<_> = m
            .iter()
            .map(|m| (m.name.as_str(), m.state.as_str(), m.live))
            .collect();
        assert_eq!(
            view,
            [
                ("a", "ready", true),
                ("b", "draining", true),
                ("c", "ready", false),
                ("d", "lost", false)
            ]
        );
        assert!(m[2].heartbeat_age_ms >= 3_600_000, "{:?}", m[2]);
        assert_eq!((m[0].live_calls, m[0].max_calls), (7, 100));
        assert_eq!(m[0].internal_url, "http://a:1");
    }
}
