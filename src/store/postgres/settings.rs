//! Runtime settings shared by the cluster (`configure_inbound`'s overrides): a change is one
//! transaction that locks the setting's row, lets the caller merge into the value it finds
//! (so two instances changing two numbers at once both keep their change), writes it with
//! `version = version + 1` and sends `NOTIFY patterd_settings` (delivered at commit). Peers
//! LISTEN on [`CHANNEL`] and poll [`read`] as the fallback (`app::cluster::settings`).

use sqlx_core::query::query;
use sqlx_core::row::Row as _;
use sqlx_postgres::{PgPool, Postgres};

/// The notification channel a settings change is announced on (payload: the setting's key).
pub(crate) const CHANNEL: &str = "patterd_settings";

/// A setting's value and version, or `None` when it was never written.
pub(crate) async fn read(
    pool: &PgPool,
    key: &str,
) -> Result<Option<(String, i64)>, sqlx_core::Error> {
    query::<Postgres>("SELECT value, version FROM settings WHERE key = $1")
        .bind(key.to_string())
        .fetch_optional(pool)
        .await?
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
}

/// Why a change was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError<E> {
    #[error("{0}")]
    Db(#[from] sqlx_core::Error),
    /// The caller's merge refused the value it found.
    #[error("{0}")]
    Merge(E),
}

/// Changes `key` under its row lock: `merge` gets the stored value (`empty` when there is none)
/// and returns the new one, which is written with the next version and announced. Returns the
/// new value and version.
pub(crate) async fn change<E>(
    pool: &PgPool,
    key: &str,
    empty: &str,
    merge: impl FnOnce(&str) -> Result<String, E>,
) -> Result<(String, i64), ChangeError<E>> {
    let mut tx = pool.begin().await?;
    // Version 0 for a row made here: the update below makes it 1, as a first write elsewhere.
    query::<Postgres>(
        "INSERT INTO settings (key, value, version) VALUES ($1, $2, 0) ON CONFLICT (key) DO NOTHING",
    )
    .bind(key.to_string())
    .bind(empty.to_string())
    .execute(&mut *tx)
    .await?;
    let current: String = query::<Postgres>("SELECT value FROM settings WHERE key = $1 FOR UPDATE")
        .bind(key.to_string())
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    let value = merge(&current).map_err(ChangeError::Merge)?;
    let version: i64 = query::<Postgres>(
        "UPDATE settings SET value = $2, version = version + 1 WHERE key = $1 RETURNING version",
    )
    .bind(key.to_string())
    .bind(value.clone())
    .fetch_one(&mut *tx)
    .await?
    .try_get(0)?;
    query::<Postgres>("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(key.to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((value, version))
}
