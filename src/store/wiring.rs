//! The restore records of `patterd wire`: for each wired number, the carrier settings it had
//! before (`carrier::admin::Wiring`, as JSON) so `patterd unwire` puts back exactly them; and
//! for each carrier application a wire rewrote (one several numbers may share), its settings
//! before the first wire through it (`carrier::admin::SharedApp`), kept until the last number
//! wired through it is unwired. Used
//! by the command line while the daemon may be running, so it opens its own connection and
//! never touches calls (no writer thread, no closing of open calls).

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

use super::{DB_FILE, StoreError, migrate, now_ms, open_conn};

/// A connection for the wiring records (creates the directory and database, runs the
/// migrations).
pub fn open(data_dir: &Path) -> Result<Connection, StoreError> {
    crate::util::create_private_dir(data_dir).map_err(|source| StoreError::Dir {
        path: data_dir.display().to_string(),
        source,
    })?;
    let mut conn = open_conn(&data_dir.join(DB_FILE))?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// One stored record: the carrier account and the settings before the first wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WiringRecord {
    pub number: String,
    pub carrier_account: String,
    /// The carrier's previous settings (JSON).
    pub previous: String,
    pub(crate) wired_at: i64,
}

/// Saves the settings `number` had before patterd wired it. An existing record is kept (it
/// holds the settings from before the first wire, which are the ones to restore); returns
/// whether this call stored a new one.
pub fn save(
    conn: &Connection,
    number: &str,
    carrier_account: &str,
    previous: &str,
) -> Result<bool, StoreError> {
    let n = conn.execute(
        "INSERT OR IGNORE INTO wirings (number, carrier_account, previous, wired_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![number, carrier_account, previous, now_ms()],
    )?;
    Ok(n == 1)
}

/// The record for `number`, if it is wired.
pub fn get(conn: &Connection, number: &str) -> Result<Option<WiringRecord>, StoreError> {
    conn.query_row(
        "SELECT number, carrier_account, previous, wired_at FROM wirings WHERE number = ?1",
        [number],
        |r| {
            Ok(WiringRecord {
                number: r.get(0)?,
                carrier_account: r.get(1)?,
                previous: r.get(2)?,
                wired_at: r.get(3)?,
            })
        },
    )
    .optional()
    .map_err(StoreError::from)
}

/// Forgets `number`'s record (after a successful unwire).
pub fn delete(conn: &Connection, number: &str) -> Result<(), StoreError> {
    conn.execute("DELETE FROM wirings WHERE number = ?1", [number])?;
    Ok(())
}

/// Every number record of `carrier_account`.
pub fn of_account(
    conn: &Connection,
    carrier_account: &str,
) -> Result<Vec<WiringRecord>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT number, carrier_account, previous, wired_at FROM wirings
         WHERE carrier_account = ?1 ORDER BY number",
    )?;
    let rows = stmt.query_map([carrier_account], |r| {
        Ok(WiringRecord {
            number: r.get(0)?,
            carrier_account: r.get(1)?,
            previous: r.get(2)?,
            wired_at: r.get(3)?,
        })
    })?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::from)
}

/// Saves application `app_id`'s settings before patterd first rewrote it. An existing record
/// is kept: it holds the settings from before the first wire through the application, which
/// a second wire (of another number on it) must not replace. Returns whether it stored one.
pub fn save_app(
    conn: &Connection,
    carrier_account: &str,
    app_id: &str,
    previous: &str,
) -> Result<bool, StoreError> {
    let n = conn.execute(
        "INSERT OR IGNORE INTO wiring_apps (carrier_account, app_id, previous, wired_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![carrier_account, app_id, previous, now_ms()],
    )?;
    Ok(n == 1)
}

/// Application `app_id`'s saved settings (JSON), if patterd rewrote it.
pub fn get_app(
    conn: &Connection,
    carrier_account: &str,
    app_id: &str,
) -> Result<Option<String>, StoreError> {
    conn.query_row(
        "SELECT previous FROM wiring_apps WHERE carrier_account = ?1 AND app_id = ?2",
        [carrier_account, app_id],
        |r| r.get(0),
    )
    .optional()
    .map_err(StoreError::from)
}

/// Forgets application `app_id`'s record (after it was restored).
pub fn delete_app(
    conn: &Connection,
    carrier_account: &str,
    app_id: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM wiring_apps WHERE carrier_account = ?1 AND app_id = ?2",
        [carrier_account, app_id],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_record_is_kept_until_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = open(dir.path()).expect("open");
        assert!(save(&c, "+15550001111", "tw", "{\"a\":1}").expect("save"));
        assert!(!save(&c, "+15550001111", "tw", "{\"a\":2}").expect("save again"));
        let r = get(&c, "+15550001111").expect("get").expect("record");
        assert_eq!(r.previous, "{\"a\":1}");
        assert_eq!(r.carrier_account, "tw");
        delete(&c, "+15550001111").expect("delete");
        assert!(get(&c, "+15550001111").expect("get").is_none());
    }

    #[test]
    fn an_application_keeps_its_first_record_until_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = open(dir.path()).expect("open");
        assert!(save_app(&c, "tx", "app1", "{\"url\":\"original\"}").expect("save"));
        assert!(!save_app(&c, "tx", "app1", "{\"url\":\"patterd\"}").expect("again"));
        assert!(save_app(&c, "other", "app1", "{}").expect("another account"));
        assert_eq!(
            get_app(&c, "tx", "app1").expect("get").as_deref(),
            Some("{\"url\":\"original\"}")
        );
        delete_app(&c, "tx", "app1").expect("delete");
        assert_eq!(get_app(&c, "tx", "app1").expect("get"), None);
        save(&c, "+15550002222", "tx", "{}").expect("save");
        save(&c, "+15550001111", "tx", "{}").expect("save");
        save(&c, "+15550003333", "tw", "{}").expect("save");
        let numbers: Vec<String> = of_account(&c, "tx")
            .expect("list")
            .into_iter()
            .map(|r| r.number)
            .collect();
        assert_eq!(numbers, ["+15550001111", "+15550002222"]);
    }
}
