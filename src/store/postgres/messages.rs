//! Text messages on PostgreSQL (migration 0005): the cluster-wide daily cap's reservation
//! (`patterd_reserve_sms`, which inserts the message `sending` under the `cap_keys` row lock,
//! so N instances together send at most `max_sms_per_day`), the writer's statements for the
//! queued writes, and the reads.

use sqlx_core::executor::Executor;
use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_core::sql_str::AssertSqlSafe;
use sqlx_postgres::{PgRow, Postgres};

use crate::store::messages::{COLUMNS, COUNTED, MessageFilter, MessageRow, NewMessage, filter_sql};

/// What the reservation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// The message row was inserted (`sending`); false: the day's cap is reached.
    pub(crate) granted: bool,
    /// Outbound messages of the day that count (with this one, when granted).
    pub(crate) today: i64,
}

/// Inserts `m` (outbound, `sending`) if the day starting at `day_start` has room under
/// `max_per_day`; one round trip.
pub(crate) async fn reserve<'e, E>(
    db: E,
    m: &NewMessage,
    max_per_day: i64,
    day_start: i64,
) -> Result<Reserved, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let row = query::<Postgres>(
        "SELECT granted, today FROM patterd_reserve_sms($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
         $11, $12)",
    )
    .bind(m.message_id.clone())
    .bind(m.carrier.clone())
    .bind(m.carrier_account.clone())
    .bind(m.from.clone())
    .bind(m.to.clone())
    .bind(m.body.clone())
    .bind(m.agent.clone())
    .bind(m.call_id.clone())
    .bind(m.source.to_string())
    .bind(max_per_day)
    .bind(day_start)
    .bind(m.created_at)
    .fetch_one(db)
    .await?;
    Ok(Reserved {
        granted: row.try_get(0)?,
        today: row.try_get(1)?,
    })
}

/// The writer's insert of a queued message (a replay, same id or carrier id, inserts nothing).
pub(super) async fn insert<'e, E>(db: E, m: &NewMessage) -> Result<(), sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>(
        "INSERT INTO messages (message_id, direction, carrier, carrier_account,
           carrier_message_id, from_number, to_number, body, status, agent, call_id, source,
           created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)
         ON CONFLICT DO NOTHING",
    )
    .bind(m.message_id.clone())
    .bind(m.direction.to_string())
    .bind(m.carrier.clone())
    .bind(m.carrier_account.clone())
    .bind(m.carrier_message_id.clone())
    .bind(m.from.clone())
    .bind(m.to.clone())
    .bind(m.body.clone())
    .bind(m.status.to_string())
    .bind(m.agent.clone())
    .bind(m.call_id.clone())
    .bind(m.source.to_string())
    .bind(m.created_at)
    .execute(db)
    .await
    .map(drop)
}

/// The writer's status update.
pub(super) async fn update<'e, E>(
    db: E,
    message_id: &str,
    status: &str,
    carrier_message_id: Option<&str>,
    error: Option<&str>,
    at: i64,
) -> Result<(), sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    query::<Postgres>(
        "UPDATE messages SET status = $2, carrier_message_id = COALESCE($3, carrier_message_id),
           error = COALESCE($4, error), updated_at = $5
         WHERE message_id = $1",
    )
    .bind(message_id.to_string())
    .bind(status.to_string())
    .bind(carrier_message_id.map(str::to_string))
    .bind(error.map(str::to_string))
    .bind(at)
    .execute(db)
    .await
    .map(drop)
}

fn row(r: &PgRow) -> Result<MessageRow, sqlx_core::Error> {
    Ok(MessageRow {
        message_id: r.try_get(0)?,
        direction: r.try_get(1)?,
        carrier: r.try_get(2)?,
        carrier_account: r.try_get(3)?,
        carrier_message_id: r.try_get(4)?,
        from: r.try_get(5)?,
        to: r.try_get(6)?,
        body: r.try_get(7)?,
        status: r.try_get(8)?,
        error: r.try_get(9)?,
        agent: r.try_get(10)?,
        call_id: r.try_get(11)?,
        source: r.try_get(12)?,
        created_at: r.try_get(13)?,
        updated_at: r.try_get(14)?,
    })
}

/// Messages matching `filter`, newest first.
pub(crate) async fn list<'e, E>(
    db: E,
    filter: &MessageFilter,
) -> Result<Vec<MessageRow>, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let (clause, values) = filter_sql(filter, true);
    let sql = format!(
        "SELECT {COLUMNS} FROM messages{clause} ORDER BY created_at DESC, message_id DESC \
         LIMIT {}",
        filter.limit.max(1)
    );
    let mut q = query::<Postgres>(AssertSqlSafe(sql));
    for v in values {
        q = q.bind(v);
    }
    q.fetch_all(db).await?.iter().map(row).collect()
}

/// Outbound messages since `since_ms` that count toward the day.
pub(crate) async fn sent_since<'e, E>(db: E, since_ms: i64) -> Result<u64, sqlx_core::Error>
where
    E: Executor<'e, Database = Postgres>,
{
    let n: i64 = query::<Postgres>(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM messages WHERE direction = 'outbound' AND {COUNTED} \
         AND created_at >= $1"
    )))
    .bind(since_ms)
    .fetch_one(db)
    .await?
    .try_get(0)?;
    Ok(n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use patterd_sim::postgres::TestDatabase;
    use sqlx_postgres::PgPoolOptions;

    fn message(i: usize) -> NewMessage {
        NewMessage {
            message_id: crate::store::messages::new_id(),
            direction: "outbound",
            carrier: "twilio".into(),
            carrier_account: "tw".into(),
            carrier_message_id: None,
            from: "+15550001234".into(),
            to: format!("+1555765{i:04}"),
            body: "hi".into(),
            status: "sending",
            agent: None,
            call_id: None,
            source: "api",
            created_at: crate::store::now_ms(),
        }
    }

    /// 30 messages at once from three instances' pools against `max_sms_per_day = 5`: exactly
    /// 5 rows inserted; a failed one frees its place; yesterday's do not count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_daily_cap_holds_across_instances_under_a_race() {
        let Some(db) = TestDatabase::create() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
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
        let now = crate::store::now_ms();
        let day = now - now.rem_euclid(86_400_000);
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..30 {
            let pool = pools[k % 3].clone();
            tasks.spawn(async move {
                let m = message(k);
                let r = reserve(&pool, &m, 5, day).await.unwrap();
                (r.granted, m.message_id)
            });
        }
        let mut granted = Vec::new();
        while let Some(r) = tasks.join_next().await {
            let (ok, id) = r.unwrap();
            if ok {
                granted.push(id);
            }
        }
        assert_eq!(granted.len(), 5, "{granted:?}");
        assert_eq!(sent_since(&pools[0], day).await.unwrap(), 5);
        let r = reserve(&pools[1], &message(99), 5, day).await.unwrap();
        assert_eq!((r.granted, r.today), (false, 5));
        update(&pools[2], &granted[0], "failed", None, Some("refused"), now)
            .await
            .unwrap();
        assert!(
            reserve(&pools[1], &message(98), 5, day)
                .await
                .unwrap()
                .granted
        );
        // A new day starts from zero.
        let r = reserve(&pools[0], &message(97), 1, day + 86_400_000)
            .await
            .unwrap();
        assert_eq!((r.granted, r.today), (true, 1));
        let rows = list(
            &pools[0],
            &MessageFilter {
                limit: 100,
                ..MessageFilter::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(rows.len(), 7);
        assert_eq!(rows.iter().filter(|m| m.status == "failed").count(), 1);
    }
}
