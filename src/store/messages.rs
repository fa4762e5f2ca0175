//! Text messages in the store (`messages`, SQLite migration 5 and PostgreSQL's 0005): every
//! message sent or received, its body, its carrier's id and its status. An outbound message
//! is written `sending` before its carrier is asked (the row is what `[outbound]
//! max_sms_per_day` counts, so a crash mid-send still counts), then `sent` or `failed`; an
//! inbound one is written `received`. The writes go through the writer queue like a call's;
//! the SQL for SQLite's writer and reads is here, PostgreSQL's in `postgres/messages.rs`.

use rusqlite::{Connection, Row, params, params_from_iter, types::Value};
use serde::{Deserialize, Serialize};

/// A message to store, as it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// Our id (`msg-` + 24 hex digits).
    pub message_id: String,
    /// `inbound` or `outbound`.
    pub direction: &'static str,
    pub carrier: String,
    pub carrier_account: String,
    /// The carrier's id (known at once for an inbound message, after the send otherwise).
    pub carrier_message_id: Option<String>,
    pub from: String,
    pub to: String,
    pub body: String,
    /// `sending` or `received`.
    pub status: &'static str,
    /// The agent that sent it or answers it.
    pub agent: Option<String>,
    /// The call whose in-call tool sent it.
    pub call_id: Option<String>,
    /// Who asked for it: `api` (REST or MCP), `call` (the in-call tool), `agent` (an agent's
    /// answer to an inbound message), `carrier` (received).
    pub source: &'static str,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// A message as stored (the REST API's JSON shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRow {
    pub message_id: String,
    pub direction: String,
    pub carrier: String,
    pub carrier_account: String,
    pub carrier_message_id: Option<String>,
    pub from: String,
    pub to: String,
    pub body: String,
    /// `sending`, `sent`, `failed` (outbound); `received` (inbound).
    pub status: String,
    /// Why sending failed.
    pub error: Option<String>,
    pub agent: Option<String>,
    pub call_id: Option<String>,
    pub source: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Filters for listing messages, newest first.
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    /// Messages from or to this number (E.164).
    pub number: Option<String>,
    /// Only the conversation between these two numbers (either direction).
    pub pair: Option<(String, String)>,
    pub direction: Option<String>,
    pub since_ms: Option<i64>,
    pub limit: usize,
}

/// The statuses an outbound message counts toward `max_sms_per_day` with.
pub(crate) const COUNTED: &str = "status IN ('sending', 'sent')";

pub(crate) const COLUMNS: &str = "message_id, direction, carrier, carrier_account, \
    carrier_message_id, from_number, to_number, body, status, error, agent, call_id, source, \
    created_at, updated_at";

fn row(r: &Row<'_>) -> rusqlite::Result<MessageRow> {
    Ok(MessageRow {
        message_id: r.get(0)?,
        direction: r.get(1)?,
        carrier: r.get(2)?,
        carrier_account: r.get(3)?,
        carrier_message_id: r.get(4)?,
        from: r.get(5)?,
        to: r.get(6)?,
        body: r.get(7)?,
        status: r.get(8)?,
        error: r.get(9)?,
        agent: r.get(10)?,
        call_id: r.get(11)?,
        source: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
    })
}

/// The `WHERE` clause of `filter` with `?N` placeholders from 1, and its values.
pub(crate) fn filter_sql(filter: &MessageFilter, dollar: bool) -> (String, Vec<String>) {
    let mut clauses = Vec::new();
    let mut values: Vec<String> = Vec::new();
    let ph = |values: &mut Vec<String>, v: &str| {
        values.push(v.to_string());
        if dollar {
            format!("${}", values.len())
        } else {
            format!("?{}", values.len())
        }
    };
    if let Some(n) = &filter.number {
        let a = ph(&mut values, n);
        let b = ph(&mut values, n);
        clauses.push(format!("(from_number = {a} OR to_number = {b})"));
    }
    if let Some((x, y)) = &filter.pair {
        let (a, b, c, d) = (
            ph(&mut values, x),
            ph(&mut values, y),
            ph(&mut values, y),
            ph(&mut values, x),
        );
        clauses.push(format!(
            "((from_number = {a} AND to_number = {b}) OR (from_number = {c} AND to_number = {d}))"
        ));
    }
    if let Some(d) = &filter.direction {
        let a = ph(&mut values, d);
        clauses.push(format!("direction = {a}"));
    }
    if let Some(s) = filter.since_ms {
        clauses.push(format!("created_at >= {s}"));
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (sql, values)
}

/// Messages matching `filter`, newest first.
pub(crate) fn list(conn: &Connection, filter: &MessageFilter) -> rusqlite::Result<Vec<MessageRow>> {
    let (clause, values) = filter_sql(filter, false);
    let sql = format!(
        "SELECT {COLUMNS} FROM messages{clause} ORDER BY created_at DESC, rowid DESC LIMIT {}",
        filter.limit.max(1)
    );
    let mut q = conn.prepare(&sql)?;
    q.query_map(params_from_iter(values.into_iter().map(Value::from)), row)?
        .collect()
}

/// Outbound messages created since `since_ms` that count toward the day.
pub(crate) fn sent_since(conn: &Connection, since_ms: i64) -> rusqlite::Result<u64> {
    conn.query_row(
        &format!(
            "SELECT COUNT(*) FROM messages WHERE direction = 'outbound' AND {COUNTED} \
             AND created_at >= ?1"
        ),
        [since_ms],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

/// The writer's insert (a replayed inbound message, same carrier id, is ignored).
pub(crate) fn insert(tx: &rusqlite::Transaction<'_>, m: &NewMessage) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO messages (message_id, direction, carrier, carrier_account,
           carrier_message_id, from_number, to_number, body, status, agent, call_id, source,
           created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13)",
        params![
            m.message_id,
            m.direction,
            m.carrier,
            m.carrier_account,
            m.carrier_message_id,
            m.from,
            m.to,
            m.body,
            m.status,
            m.agent,
            m.call_id,
            m.source,
            m.created_at
        ],
    )
    .map(drop)
}

/// The writer's status update.
pub(crate) fn update(
    tx: &rusqlite::Transaction<'_>,
    message_id: &str,
    status: &str,
    carrier_message_id: Option<&str>,
    error: Option<&str>,
    at: i64,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE messages SET status = ?2,
           carrier_message_id = COALESCE(?3, carrier_message_id),
           error = COALESCE(?4, error), updated_at = ?5
         WHERE message_id = ?1",
        params![message_id, status, carrier_message_id, error, at],
    )
    .map(drop)
}

/// A fresh message id: `msg-` + 24 random hex digits.
pub fn new_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 12];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        let t = super::now_ms().to_le_bytes();
        b[..8].copy_from_slice(&t);
    }
    format!("msg-{}", hex::encode(b))
}
