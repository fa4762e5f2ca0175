//! Who runs a call, asked from any instance: one primary-key join of the call's row with its
//! owner's `instances` row, judged on the database's clock (`now()`), so no instance's clock
//! decides whether a peer's lease still runs. Forwarding (`api::forward`) reads the answer: run
//! the request here, send it to the owner's `internal_url`, or answer that the call is over.
//! The rows themselves are written elsewhere (admission claims `calls.owner_id`, membership
//! writes `instances`); this file only reads them.

use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgPool, Postgres};

/// A peer instance, as forwarding needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerRef {
    /// `instances.name` (= the call's `owner_id`).
    pub(crate) name: String,
    /// Where that instance takes forwarded requests.
    pub(crate) internal_url: String,
}

/// The instance that ran a call that has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ran {
    /// This instance.
    Here,
    /// A peer that is still running (ready or draining, lease fresh or not yet declared lost).
    Peer(PeerRef),
    /// An instance that is gone (stopped, lost, or with no `instances` row): its name.
    Gone(String),
}

/// Where a call is, from this instance's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// No call of that id.
    Unknown,
    /// The call has ended (its row has `ended_at`); `by` is who ran it (recordings live there).
    Ended { by: Ran },
    /// Open and owned by this instance.
    Here,
    /// Open and owned by a peer whose lease is fresh (state ready or draining).
    Peer(PeerRef),
    /// Open and owned by a peer that has not renewed its lease in time but is not (yet)
    /// declared lost: it may be paused or partitioned, or dead and about to be reaped.
    PeerStale(PeerRef),
    /// Open, but its owner stopped or was declared lost (or never registered): nobody runs it
    /// any more; the reaper closes such rows.
    Lost { name: String },
}

/// Where call `call_id` is, for instance `me`, with the cluster's lease in milliseconds.
pub(crate) async fn owner_of(
    pool: &PgPool,
    me: &str,
    call_id: &str,
    lease_ms: u64,
) -> Result<Owner, sqlx_core::Error> {
    let row = query::<Postgres>(
        "SELECT c.owner_id, c.ended_at IS NOT NULL, i.internal_url, i.state,
                COALESCE(i.heartbeat_at >= now() - ($2::float8 * interval '1 millisecond'), false)
         FROM calls c LEFT JOIN instances i ON i.name = c.owner_id
         WHERE c.call_id = $1",
    )
    .bind(call_id)
    .bind(lease_ms as f64)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(Owner::Unknown);
    };
    let owner: String = row.try_get(0)?;
    let ended: bool = row.try_get(1)?;
    let url: Option<String> = row.try_get(2)?;
    let state: Option<String> = row.try_get(3)?;
    let fresh: bool = row.try_get(4)?;
    Ok(judge(me, owner, ended, url, state.as_deref(), fresh))
}

/// The verdict on one row of the join (separate from the query for the unit tests' sake).
fn judge(
    me: &str,
    owner: String,
    ended: bool,
    url: Option<String>,
    state: Option<&str>,
    fresh: bool,
) -> Owner {
    let running = matches!(state, Some("ready" | "draining"));
    let peer = |name: String| {
        url.clone()
            .map(|internal_url| PeerRef { name, internal_url })
    };
    if ended {
        let by = if owner == me {
            Ran::Here
        } else {
            match (running, peer(owner.clone())) {
                (true, Some(p)) => Ran::Peer(p),
                _ => Ran::Gone(owner),
            }
        };
        return Owner::Ended { by };
    }
    if owner == me {
        return Owner::Here;
    }
    match (running, peer(owner.clone())) {
        (true, Some(p)) if fresh => Owner::Peer(p),
        (true, Some(p)) => Owner::PeerStale(p),
        _ => Owner::Lost { name: owner },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    async fn exec(pool: &PgPool, sql: &str) {
        query::<Postgres>(sqlx_core::sql_str::AssertSqlSafe(sql.to_string()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    fn peer(name: &str) -> PeerRef {
        PeerRef {
            name: name.into(),
            internal_url: format!("http://{name}.internal:8080"),
        }
    }

    /// Every verdict from real rows, the lease judged on the database's clock: a fresh peer,
    /// one past its lease, lost and stopped owners with the call still open, an owner with no
    /// instance row, this instance, ended calls (by whom), and no call at all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn owner_of_tells_each_case_from_the_rows() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // Opening the store runs the migrations.
        let _store =
            crate::store::Store::open_postgres(&db.url, 1, "me", dir.path(), 30, 16).unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&db.url)
            .await
            .unwrap();
        for (name, state, age_s) in [
            ("me", "ready", 0),
            ("fresh", "ready", 0),
            ("draining", "draining", 0),
            ("stale", "ready", 30),
            ("lost", "lost", 30),
            ("stopped", "stopped", 0),
        ] {
            exec(
                &pool,
                &format!(
                    "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state,
                       version, max_calls, heartbeat_at)
                     VALUES ('{name}', 'x', 'http://{name}.internal:8080', 'http://a', '{state}',
                       't', 10, now() - interval '{age_s} seconds')"
                ),
            )
            .await;
        }
        for (call, owner, ended) in [
            ("c-me", "me", false),
            ("c-fresh", "fresh", false),
            ("c-draining", "draining", false),
            ("c-stale", "stale", false),
            ("c-lost", "lost", false),
            ("c-stopped", "stopped", false),
            ("c-nobody", "never-registered", false),
            ("e-me", "me", true),
            ("e-fresh", "fresh", true),
            ("e-stale", "stale", true),
            ("e-lost", "lost", true),
        ] {
            exec(
                &pool,
                &format!(
                    "INSERT INTO calls (call_id, carrier, carrier_account, direction, from_number,
                       to_number, agent, status, created_at, owner_id, ended_at)
                     VALUES ('{call}', 'twilio', 'tw', 'inbound', '+1', '+2', 'a', 'x', 1,
                       '{owner}', {})",
                    if ended { "2" } else { "NULL" }
                ),
            )
            .await;
        }
        let lease = 10_000;
        let of = |id: &'static str| {
            let pool = pool.clone();
            async move { owner_of(&pool, "me", id, lease).await.unwrap() }
        };
        assert_eq!(of("nope").await, Owner::Unknown);
        assert_eq!(of("c-me").await, Owner::Here);
        assert_eq!(of("c-fresh").await, Owner::Peer(peer("fresh")));
        assert_eq!(of("c-draining").await, Owner::Peer(peer("draining")));
        assert_eq!(of("c-stale").await, Owner::PeerStale(peer("stale")));
        for (id, name) in [
            ("c-lost", "lost"),
            ("c-stopped", "stopped"),
            ("c-nobody", "never-registered"),
        ] {
            assert_eq!(of(id).await, Owner::Lost { name: name.into() }, "{id}");
        }
        assert_eq!(of("e-me").await, Owner::Ended { by: Ran::Here });
        assert_eq!(
            of("e-fresh").await,
            Owner::Ended {
                by: Ran::Peer(peer("fresh"))
            }
        );
        // A stale but not lost peer may still serve its recordings.
        assert_eq!(
            of("e-stale").await,
            Owner::Ended {
                by: Ran::Peer(peer("stale"))
            }
        );
        assert_eq!(
            of("e-lost").await,
            Owner::Ended {
                by: Ran::Gone("lost".into())
            }
        );
        // The lease is the caller's: a long one makes the stale peer fresh again.
        assert_eq!(
            owner_of(&pool, "me", "c-stale", 60_000).await.unwrap(),
            Owner::Peer(peer("stale"))
        );
        // A heartbeat just past a short lease on the database's clock is stale.
        exec(
            &pool,
            "UPDATE instances SET heartbeat_at = now() - interval '1500 milliseconds'
             WHERE name = 'fresh'",
        )
        .await;
        assert_eq!(
            owner_of(&pool, "me", "c-fresh", 1_000).await.unwrap(),
            Owner::PeerStale(peer("fresh"))
        );
    }

    #[test]
    fn judging_without_a_url_never_makes_a_peer() {
        assert_eq!(
            judge("me", "p1".into(), false, None, Some("ready"), true),
            Owner::Lost { name: "p1".into() }
        );
    }
}
