//! The cluster-wide outbound caps' statements: a reservation is an `outbound_slots` row inserted
//! by `patterd_reserve_outbound` (migration 0006), which serialises all reservations on the
//! `cap_keys` row `'outbound'` and counts every slot and today's calls before it inserts, so N
//! instances reserving at once hold exactly `max_concurrent` (a plain conditional INSERT overshoots,
//! see docs/scale-out.md). A slot is bound to its call id as soon as the carrier returns one,
//! deleted when the call ends (or its dial fails), swept when its call ended but the delete was
//! lost, and deleted with its instance by the reaper. The policy around these statements (when
//! to bind, release, sweep; what a refusal says) is `app::cluster::caps`.

use sqlx_core::executor::Executor;
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::Postgres;

/// What the reservation function answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// The new slot's id; `None`: refused (a cap is reached).
    pub(crate) slot: Option<i64>,
    /// Slots held across the cluster (with the new one, when it was granted).
    pub(crate) live: i64,
    /// Outbound calls of the day (with the new one, when it was granted).
    pub(crate) today: i64,
}

/// The caps a reservation is checked against, and who asks.
pub(crate) struct Ask<'a> {
    pub(crate) instance: &'a str,
    pub(crate) from: &'a str,
    pub(crate) max_concurrent: i64,
    pub(crate) max_per_day: i64,
    /// The start of the UTC day (ms since the epoch) that `max_per_day` counts from.
    pub(crate) day_start: i64,
    /// Now (ms since the epoch), the slot's `created_at`.
    pub(crate) now: i64,
}

/// Reserves a slot, or says which cap refused it; one round trip.
pub(crate) async fn reserve<'e, E>(db: E, ask: &Ask<'_>) -> Result<Reserved, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let row = query::<Postgres>(
        "SELECT slot, live, today FROM patterd_reserve_outbound($1, $2, $3, $4, $5, $6)",
    )
    .bind(ask.instance.to_string())
    .bind(ask.from.to_string())
    .bind(ask.max_concurrent)
    .bind(ask.max_per_day)
    .bind(ask.day_start)
    .bind(ask.now)
    .fetch_one(db)
    .await?;
    Ok(Reserved {
        slot: row.try_get(0)?,
        live: row.try_get(1)?,
        today: row.try_get(2)?,
    })
}

/// Binds `slot` to the call the carrier placed under it.
pub(crate) async fn bind<'e, E>(db: E, slot: i64, call_id: &str) -> Result<(), sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>("UPDATE outbound_slots SET call_id = $2 WHERE slot_id = $1")
        .bind(slot)
        .bind(call_id.to_string())
        .execute(db)
        .await
        .map(drop)
}

/// Deletes `slot` (its call ended, or its dial failed).
pub(crate) async fn release<'e, E>(db: E, slot: i64) -> Result<(), sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>("DELETE FROM outbound_slots WHERE slot_id = $1")
        .bind(slot)
        .execute(db)
        .await
        .map(drop)
}

/// Deletes every slot of `instance` (the reaper, for an instance it declared lost). Returns how
/// many it deleted.
pub(crate) async fn release_instance<'e, E>(db: E, instance: &str) -> Result<u64, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>("DELETE FROM outbound_slots WHERE instance = $1")
        .bind(instance.to_string())
        .execute(db)
        .await
        .map(|r| r.rows_affected())
}

/// The sweep: deletes the slots whose call has ended (any instance's: an end whose delete was
/// lost), and `instance`'s own slots that this process does not hold (`held`) and that are older
/// than `older_than` (ms since the epoch) — a previous run's, or a release that failed. Returns
/// how many it deleted.
pub(crate) async fn sweep<'e, E>(
    db: E,
    instance: &str,
    held: &[i64],
    older_than: i64,
) -> Result<u64, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>(
        "DELETE FROM outbound_slots o
         WHERE EXISTS (SELECT 1 FROM calls c WHERE c.call_id = o.call_id AND c.ended_at IS NOT NULL)
            OR (o.instance = $1 AND o.created_at < $3 AND NOT (o.slot_id = ANY($2)))",
    )
    .bind(instance.to_string())
    .bind(held.to_vec())
    .bind(older_than)
    .execute(db)
    .await
    .map(|r| r.rows_affected())
}

/// Slots held across the cluster (tests and `GET /v1/cluster`-style reads).
#[cfg(test)]
pub(crate) async fn held<'e, E>(db: E) -> Result<i64, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>("SELECT count(*) FROM outbound_slots")
        .fetch_one(db)
        .await?
        .try_get(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    fn ask<'a>(instance: &'a str, max_concurrent: i64, max_per_day: i64) -> Ask<'a> {
        let now = crate::store::now_ms();
        Ask {
            instance,
            from: "+15550001234",
            max_concurrent,
            max_per_day,
            day_start: now - now.rem_euclid(86_400_000),
            now,
        }
    }

    /// 30 reservations at once from three instances' pools against `max_concurrent = 5`:
    /// exactly 5 granted, every round; releasing them lets 5 more through; a lost instance's
    /// slots (deleted as the reaper does) free its capacity.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_concurrent_cap_holds_across_instances_under_a_race() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // Opening the store runs the migrations (the function and the slot table).
        let _store =
            crate::store::Store::open_postgres(&db.url, 1, "p0", dir.path(), 30, 16).unwrap();
        let mut pools = Vec::new();
        for _ in 0..3 {
            pools.push(
                PgPoolOptions::new()
                    .max_connections(10)
                    .connect(&db.url)
                    .await
                    .unwrap(),
            );
        }
        for round in 0..3 {
            let mut tasks = tokio::task::JoinSet::new();
            for k in 0..30 {
                let pool = pools[k % 3].clone();
                tasks.spawn(async move {
                    let name = format!("p{}", k % 3);
                    reserve(&pool, &ask(&name, 5, 1_000)).await.unwrap().slot
                });
            }
            let mut granted = Vec::new();
            while let Some(r) = tasks.join_next().await {
                if let Some(slot) = r.unwrap() {
                    granted.push(slot);
                }
            }
            assert_eq!(granted.len(), 5, "round {round}: {granted:?}");
            assert_eq!(held(&pools[0]).await.unwrap(), 5);
            for slot in granted {
                release(&pools[1], slot).await.unwrap();
            }
            assert_eq!(held(&pools[0]).await.unwrap(), 0);
        }
        // p1 holds two and is lost: nobody else gets past 3 until its rows go.
        for _ in 0..2 {
            assert!(
                reserve(&pools[1], &ask("p1", 5, 1_000))
                    .await
                    .unwrap()
                    .slot
                    .is_some()
            );
        }
        let mut more = 0;
        while reserve(&pools[0], &ask("p0", 5, 1_000))
            .await
            .unwrap()
            .slot
            .is_some()
        {
            more += 1;
        }
        assert_eq!(
            more, 3,
            "fail closed: the lost instance's slots still count"
        );
        assert_eq!(release_instance(&pools[2], "p1").await.unwrap(), 2);
        assert!(
            reserve(&pools[0], &ask("p0", 5, 1_000))
                .await
                .unwrap()
                .slot
                .is_some()
        );
        // The day's cap counts the slots created today too.
        let r = reserve(&pools[0], &ask("p0", 100, 4)).await.unwrap();
        assert_eq!(r.slot, None, "four today already: {}", r.today);
    }
}
