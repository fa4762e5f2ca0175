//! Membership's statements on PostgreSQL: the `instances` table (one row per instance name, its
//! current incarnation, URLs, state and heartbeat), the heartbeat that renews a lease, the
//! reaper's transaction and its advisory lock, and the read of ready peers for the drain
//! hand-off. Every lease is judged on the database's clock (`now()`), never an instance's.
//!
//! Closing an instance's calls is one routine ([`close_instance`]) used both by the reaper (for
//! each instance it declares lost) and by an instance at its own start (for its previous
//! incarnation): its open calls become `failed` (`instance <name> stopped before the call
//! ended`), its outbound slots are deleted, and the legs to hang up at the carrier are returned
//! for the caller to hang up after the commit. The policy around these statements (when to beat,
//! fence, exit, reap) is `app::cluster::members` and `app::cluster::reaper`.

use std::time::Duration;

use sqlx_core::connection::Connection as _;
use sqlx_core::executor::Executor;
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgConnection, PgPool, Postgres};

/// The session advisory lock whose holder is the cluster's reaper (`"patterd1"` in ASCII).
pub(crate) const REAPER_LOCK: i64 = 0x7061_7474_6572_6431;

/// Now on the database's clock, in ms since the epoch (the store's time columns).
const DB_NOW_MS: &str = "(extract(epoch FROM now()) * 1000)::int8";

/// An instance's row as it registers.
pub(crate) struct Me<'a> {
    pub(crate) name: &'a str,
    pub(crate) incarnation: &'a str,
    pub(crate) internal_url: &'a str,
    pub(crate) advertise_url: &'a str,
    pub(crate) version: &'a str,
    pub(crate) max_calls: i64,
}

/// A call closed because its instance is gone: what hanging its leg up needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReapedCall {
    pub(crate) call_id: String,
    /// `calls.carrier_account`: the carrier account the leg is on.
    pub(crate) account: String,
    /// The carrier's id for the leg (`calls.leg_id`, else the call id).
    pub(crate) leg_id: String,
}

/// What registering found and did.
#[derive(Debug, Default)]
pub(crate) struct Registered {
    /// The state of this name's previous row when it was neither `stopped` nor `lost` (the
    /// previous incarnation died without saying so).
    pub(crate) previous_live: Option<String>,
    /// The previous incarnation's calls closed now.
    pub(crate) calls: Vec<ReapedCall>,
    /// The previous incarnation's outbound slots deleted now.
    pub(crate) slots: u64,
}

/// What one reaper pass did.
#[derive(Debug, Default)]
pub(crate) struct Reaped {
    /// The instances declared lost.
    pub(crate) lost: Vec<String>,
    pub(crate) calls: Vec<ReapedCall>,
    pub(crate) slots: u64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Closes `name`'s open calls as failed and deletes its outbound slots, on `conn` (inside the
/// caller's transaction). Returns the closed calls and how many slots went.
pub(crate) async fn close_instance(
    conn: &mut PgConnection,
    name: &str,
) -> Result<(Vec<ReapedCall>, u64), sqlx_core::Error> {
    let sql = format!(
        "UPDATE calls SET status = 'failed',
           ended_reason = 'instance ' || owner_id || ' stopped before the call ended',
           ended_at = {DB_NOW_MS},
           duration_ms = CASE WHEN answered_at IS NULL THEN 0
             ELSE GREATEST(0, {DB_NOW_MS} - answered_at) END
         WHERE owner_id = $1 AND ended_at IS NULL
         RETURNING call_id, carrier_account, COALESCE(leg_id, call_id)"
    );
    let rows = query::<Postgres>(sqlx_core::sql_str::AssertSqlSafe(sql))
        .bind(name.to_string())
        .fetch_all(&mut *conn)
        .await?;
    let calls = rows
        .iter()
        .map(|r| {
            Ok(ReapedCall {
                call_id: r.try_get(0)?,
                account: r.try_get(1)?,
                leg_id: r.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx_core::Error>>()?;
    let slots = super::caps::release_instance(&mut *conn, name).await?;
    Ok((calls, slots))
}

/// Registers `me`: in one transaction, takes this name's row under a lock, closes whatever its
/// previous incarnation left open ([`close_instance`]; a StatefulSet never runs two pods of one
/// name, so whatever is open under this name is the previous run's), and writes the row for this
/// incarnation as `ready` with a fresh heartbeat.
pub(crate) async fn register(pool: &PgPool, me: &Me<'_>) -> Result<Registered, sqlx_core::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let previous: Option<String> =
        query::<Postgres>("SELECT state FROM instances WHERE name = $1 FOR UPDATE")
            .bind(me.name.to_string())
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
    let (calls, slots) = close_instance(&mut tx, me.name).await?;
    query::<Postgres>(
        "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state, version,
           max_calls, live_calls, started_at, heartbeat_at)
         VALUES ($1, $2, $3, $4, 'ready', $5, $6, 0, now(), now())
         ON CONFLICT (name) DO UPDATE SET incarnation = EXCLUDED.incarnation,
           internal_url = EXCLUDED.internal_url, advertise_url = EXCLUDED.advertise_url,
           state = 'ready', version = EXCLUDED.version, max_calls = EXCLUDED.max_calls,
           live_calls = 0, started_at = now(), heartbeat_at = now()",
    )
    .bind(me.name.to_string())
    .bind(me.incarnation.to_string())
    .bind(me.internal_url.to_string())
    .bind(me.advertise_url.to_string())
    .bind(me.version.to_string())
    .bind(i32::try_from(me.max_calls).unwrap_or(i32::MAX))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Registered {
        previous_live: previous.filter(|s| s != "stopped" && s != "lost"),
        calls,
        slots,
    })
}

/// Renews this incarnation's lease and writes its live calls and `state` (`ready`, `draining`,
/// `stopped`). Returns the row's state after the write — a `lost` or `stopped` row is never
/// brought back (nor its heartbeat renewed) — or `None` when the row is not this incarnation's
/// any more (another incarnation took the name).
pub(crate) async fn heartbeat<'e, E>(
    db: E,
    name: &str,
    incarnation: &str,
    live_calls: i64,
    state: &str,
) -> Result<Option<String>, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>(
        "UPDATE instances SET
           heartbeat_at = CASE WHEN state IN ('lost', 'stopped') THEN heartbeat_at ELSE now() END,
           live_calls = $3,
           state = CASE WHEN state IN ('lost', 'stopped') THEN state ELSE $4 END
         WHERE name = $1 AND incarnation = $2
         RETURNING state",
    )
    .bind(name.to_string())
    .bind(incarnation.to_string())
    .bind(i32::try_from(live_calls).unwrap_or(i32::MAX))
    .bind(state.to_string())
    .fetch_optional(db)
    .await?
    .map(|r| r.try_get(0))
    .transpose()
}

/// How many instances are in each state (`patterd_cluster_instances`); every state is named,
/// with 0 when none is in it.
pub(crate) async fn count_by_state<'e, E>(db: E) -> Result<Vec<(String, i64)>, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let rows = query::<Postgres>(
        "SELECT s.state, count(i.name)
         FROM unnest(ARRAY['ready', 'draining', 'stopped', 'lost']) AS s (state)
         LEFT JOIN instances i ON i.state = s.state
         GROUP BY s.state ORDER BY s.state",
    )
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// Takes the reaper's session lock on `conn` without waiting; true when this session holds it
/// now. Call it only while not holding it (each success stacks one more hold on the session).
pub(crate) async fn try_lead(conn: &mut PgConnection) -> Result<bool, sqlx_core::Error> {
    query::<Postgres>("SELECT pg_try_advisory_lock($1)")
        .bind(REAPER_LOCK)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)
}

/// One reaper pass, in one transaction on `conn` (the session holding [`REAPER_LOCK`]): the
/// instances `ready` or `draining` other than `me` whose heartbeat is older than `lease` become
/// `lost`, and each is closed ([`close_instance`]). Returns what it did; the caller hangs the
/// legs up after.
pub(crate) async fn reap(
    conn: &mut PgConnection,
    me: &str,
    lease: Duration,
) -> Result<Reaped, sqlx_core::Error> {
    let mut tx = conn.begin().await?;
    let lost: Vec<String> = query::<Postgres>(
        "UPDATE instances SET state = 'lost'
         WHERE state IN ('ready', 'draining') AND name <> $2
           AND heartbeat_at < now() - $1::int8 * interval '1 millisecond'
         RETURNING name",
    )
    .bind(ms(lease))
    .bind(me.to_string())
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|r| r.try_get(0))
    .collect::<Result<_, _>>()?;
    let mut reaped = Reaped::default();
    for name in &lost {
        let (calls, slots) = close_instance(&mut tx, name).await?;
        reaped.calls.extend(calls);
        reaped.slots += slots;
    }
    tx.commit().await?;
    reaped.lost = lost;
    Ok(reaped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    /// A migrated database and a pool on it (`None`: no PostgreSQL here).
    async fn database() -> Option<(TestDatabase, tempfile::TempDir, PgPool)> {
        let db = TestDatabase::create()?;
        let dir = tempfile::tempdir().unwrap();
        // Opening the store runs the migrations.
        drop(crate::store::Store::open_postgres(&db.url, 1, "setup", dir.path(), 30, 16).unwrap());
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&db.url)
            .await
            .unwrap();
        Some((db, dir, pool))
    }

    fn me<'a>(name: &'a str, incarnation: &'a str, max_calls: i64) -> Me<'a> {
        Me {
            name,
            incarnation,
            internal_url: "http://10.0.0.1:8080",
            advertise_url: "http://10.0.0.1:8080",
            version: "test",
            max_calls,
        }
    }

    async fn open_call(pool: &PgPool, id: &str, owner: &str, leg: Option<&str>) {
        query::<Postgres>(
            "INSERT INTO calls (call_id, carrier, carrier_account, direction, from_number,
               to_number, agent, status, created_at, answered_at, owner_id, leg_id)
             VALUES ($1, 'twilio', 'tw', 'inbound', '+15550001111', '+15550002222', 'a',
               'in-progress', 1, 2, $2, $3)",
        )
        .bind(id.to_string())
        .bind(owner.to_string())
        .bind(leg.map(str::to_string))
        .execute(pool)
        .await
        .unwrap();
    }

    async fn slot(pool: &PgPool, instance: &str) {
        query::<Postgres>(
            "INSERT INTO outbound_slots (instance, from_number, created_at) VALUES ($1, '+1', 1)",
        )
        .bind(instance.to_string())
        .execute(pool)
        .await
        .unwrap();
    }

    /// `(status, ended_reason, ended)` of a call.
    async fn call(pool: &PgPool, id: &str) -> (String, Option<String>, bool) {
        let r = query::<Postgres>(
            "SELECT status, ended_reason, ended_at IS NOT NULL FROM calls WHERE call_id = $1",
        )
        .bind(id.to_string())
        .fetch_one(pool)
        .await
        .unwrap();
        (r.get(0), r.get(1), r.get(2))
    }

    async fn slots_of(pool: &PgPool, instance: &str) -> i64 {
        query::<Postgres>("SELECT count(*) FROM outbound_slots WHERE instance = $1")
            .bind(instance.to_string())
            .fetch_one(pool)
            .await
            .unwrap()
            .get(0)
    }

    async fn age(pool: &PgPool, name: &str, secs: i64) {
        query::<Postgres>(
            "UPDATE instances SET heartbeat_at = now() - $2::int8 * interval '1 second'
             WHERE name = $1",
        )
        .bind(name.to_string())
        .bind(secs)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn state(pool: &PgPool, name: &str) -> String {
        query::<Postgres>("SELECT state FROM instances WHERE name = $1")
            .bind(name.to_string())
            .fetch_one(pool)
            .await
            .unwrap()
            .get(0)
    }

    /// A restarted instance closes its previous incarnation's calls and slots at once (legs to
    /// hang up: the carrier's leg id, else the call id), never a peer's; the previous
    /// incarnation's heartbeat finds the row taken.
    #[tokio::test]
    async fn register_reaps_the_previous_incarnation_at_once() {
        let Some((_db, _dir, pool)) = database().await else {
            return;
        };
        register(&pool, &me("p0", "old", 10)).await.unwrap();
        register(&pool, &me("p1", "one", 10)).await.unwrap();
        open_call(&pool, "A1", "p0", Some("LEG-A1")).await;
        open_call(&pool, "A2", "p0", None).await;
        open_call(&pool, "B1", "p1", None).await;
        slot(&pool, "p0").await;
        slot(&pool, "p1").await;

        let done = register(&pool, &me("p0", "new", 10)).await.unwrap();
        assert_eq!(done.previous_live.as_deref(), Some("ready"));
        let mut legs: Vec<_> = done
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.account.as_str(), c.leg_id.as_str()))
            .collect();
        legs.sort();
        assert_eq!(legs, [("A1", "tw", "LEG-A1"), ("A2", "tw", "A2")]);
        assert_eq!(done.slots, 1);
        for id in ["A1", "A2"] {
            let (status, reason, ended) = call(&pool, id).await;
            assert_eq!(status, "failed");
            assert_eq!(
                reason.as_deref(),
                Some("instance p0 stopped before the call ended")
            );
            assert!(ended);
        }
        assert_eq!(call(&pool, "B1").await, ("in-progress".into(), None, false));
        assert_eq!(
            (slots_of(&pool, "p0").await, slots_of(&pool, "p1").await),
            (0, 1)
        );
        // The row is the new incarnation's: the old one's beat finds none, the new one's renews.
        assert_eq!(
            heartbeat(&pool, "p0", "old", 3, "ready").await.unwrap(),
            None
        );
        assert_eq!(
            heartbeat(&pool, "p0", "new", 3, "ready")
                .await
                .unwrap()
                .as_deref(),
            Some("ready")
        );
        // A stopped previous run is no live previous incarnation.
        heartbeat(&pool, "p1", "one", 0, "stopped").await.unwrap();
        let again = register(&pool, &me("p1", "two", 10)).await.unwrap();
        assert_eq!(again.previous_live, None);
    }

    /// The reaper declares lost only the `ready`/`draining` instances whose lease ran out on the
    /// database's clock, closes only their calls and slots, and a lost or stopped row is never
    /// brought back by a late heartbeat. The ready peers are the fresh ones, most free first.
    #[tokio::test]
    async fn the_reaper_marks_a_stale_instance_lost_and_closes_only_its_calls() {
        let Some((_db, _dir, pool)) = database().await else {
            return;
        };
        for (name, max) in [("p0", 10), ("p1", 10), ("p2", 10), ("p3", 10), ("p4", 30)] {
            register(&pool, &me(name, "i", max)).await.unwrap();
        }
        heartbeat(&pool, "p1", "i", 4, "draining").await.unwrap();
        heartbeat(&pool, "p2", "i", 0, "stopped").await.unwrap();
        heartbeat(&pool, "p4", "i", 25, "ready").await.unwrap();
        open_call(&pool, "P0", "p0", None).await;
        open_call(&pool, "P1", "p1", Some("LEG1")).await;
        open_call(&pool, "P2", "p2", None).await;
        slot(&pool, "p0").await;
        slot(&pool, "p1").await;
        // p1 (draining) and p2 (stopped) stopped beating 5 s ago; p0, p3, p4 are fresh.
        age(&pool, "p1", 5).await;
        age(&pool, "p2", 5).await;

        let mut conn = pool.acquire().await.unwrap().detach();
        assert!(try_lead(&mut conn).await.unwrap());
        // A reaper never declares its own instance lost.
        let own = reap(&mut conn, "p1", Duration::from_secs(1)).await.unwrap();
        assert!(own.lost.is_empty(), "{own:?}");
        let r = reap(&mut conn, "p0", Duration::from_secs(1)).await.unwrap();
        assert_eq!(r.lost, ["p1"]);
        assert_eq!(
            r.calls,
            [ReapedCall {
                call_id: "P1".into(),
                account: "tw".into(),
                leg_id: "LEG1".into()
            }]
        );
        assert_eq!(r.slots, 1);
        assert_eq!(call(&pool, "P1").await.0, "failed");
        assert_eq!(call(&pool, "P0").await, ("in-progress".into(), None, false));
        assert_eq!(call(&pool, "P2").await, ("in-progress".into(), None, false));
        assert_eq!(
            (slots_of(&pool, "p0").await, slots_of(&pool, "p1").await),
            (1, 0)
        );
        assert_eq!(state(&pool, "p1").await, "lost");
        assert_eq!(state(&pool, "p2").await, "stopped");
        // The lost instance's late beat reads `lost` and changes nothing.
        assert_eq!(
            heartbeat(&pool, "p1", "i", 4, "ready")
                .await
                .unwrap()
                .as_deref(),
            Some("lost")
        );
        assert_eq!(state(&pool, "p1").await, "lost");
        // A second pass finds nothing more.
        let again = reap(&mut conn, "p0", Duration::from_secs(1)).await.unwrap();
        assert!(again.lost.is_empty() && again.calls.is_empty());

        let peers = super::super::handoff::ready_peers(&pool, "p0", Duration::from_secs(1))
            .await
            .unwrap();
        let got: Vec<(&str, i64)> = peers.iter().map(|p| (p.name.as_str(), p.free)).collect();
        assert_eq!(got, [("p3", 10), ("p4", 5)]);
        assert_eq!(peers[0].internal_url, "http://10.0.0.1:8080");
        let counts = count_by_state(&pool).await.unwrap();
        let want: Vec<(String, i64)> = [("draining", 0), ("lost", 1), ("ready", 3), ("stopped", 1)]
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect();
        assert_eq!(counts, want);
    }

    /// Two instances' reapers trying at once: exactly one holds the lock and acts; when its
    /// session ends, the other takes over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_one_of_two_concurrent_reapers_acts() {
        let Some((db, _dir, pool)) = database().await else {
            return;
        };
        register(&pool, &me("gone", "i", 10)).await.unwrap();
        open_call(&pool, "G1", "gone", None).await;
        age(&pool, "gone", 5).await;
        let connect = || async {
            let options: sqlx_postgres::PgConnectOptions = db.url.parse().unwrap();
            PgConnection::connect_with(&options).await.unwrap()
        };
        let (mut a, mut b) = (connect().await, connect().await);
        async fn pass(conn: &mut PgConnection) -> Option<Reaped> {
            if try_lead(conn).await.unwrap() {
                Some(reap(conn, "p0", Duration::from_secs(1)).await.unwrap())
            } else {
                None
            }
        }
        let (ra, rb) = tokio::join!(pass(&mut a), pass(&mut b));
        let (leader, acted, other) = match (ra, rb) {
            (Some(r), None) => (a, r, b),
            (None, Some(r)) => (b, r, a),
            (ra, rb) => panic!("exactly one reaper acts: {ra:?} {rb:?}"),
        };
        assert_eq!(acted.lost, ["gone"]);
        assert_eq!(acted.calls.len(), 1);
        let mut other = other;
        assert!(!try_lead(&mut other).await.unwrap(), "the lock is held");
        leader.close().await.unwrap();
        // The server releases a session's locks when it ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !try_lead(&mut other).await.unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the other reaper took over"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
