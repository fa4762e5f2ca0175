//! What the store hands back: rows for calls, turns and events as serializable structs (the
//! REST API's JSON shapes), the list filter, per-call and total metrics, and the SQL that reads
//! them. Everything here runs on the store's read connection.

use rusqlite::{Connection, OptionalExtension, Row, params_from_iter, types::Value};
use serde::{Deserialize, Serialize};

/// A call as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRow {
    pub call_id: String,
    pub carrier: String,
    pub carrier_account: String,
    pub direction: String,
    pub from: String,
    pub to: String,
    pub agent: String,
    /// `queued`, `ringing`, `in-progress`, `completed`, `busy`, `failed`, `no-answer`,
    /// `canceled`.
    pub status: String,
    /// `answered`, `voicemail`, `no_answer`, `busy`, `failed` once known.
    pub outcome: Option<String>,
    pub answered_by: Option<String>,
    pub ended_reason: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub(crate) created_at: i64,
    pub(crate) answered_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// Answer to end (0 if never answered); `None` while live.
    pub duration_ms: Option<i64>,
    /// The carrier's billed duration, from its status callback.
    pub carrier_duration_s: Option<i64>,
    /// What the call cost in US dollars (usage × `[pricing]`), once it has ended.
    pub cost_usd: Option<f64>,
    /// The usage and the cost per provider behind `cost_usd` ([`crate::store::CallCost`]).
    pub cost: Option<crate::store::CallCost>,
    pub turns: i64,
    /// What `[agents.X.summary]` wrote after the call: `{"text", "data", "llm", "error"}`.
    pub summary: Option<serde_json::Value>,
}

impl CallRow {
    /// Seconds, for display: the stored duration, or the time since answer while live.
    pub fn duration_s(&self, now_ms: i64) -> i64 {
        match (self.duration_ms, self.answered_at) {
            (Some(d), _) => d / 1000,
            (None, Some(a)) => (now_ms - a).max(0) / 1000,
            (None, None) => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRow {
    pub seq: i64,
    /// `caller` or `agent`.
    pub speaker: String,
    pub text: String,
    pub heard_text: String,
    pub interrupted: bool,
    /// Milliseconds since the call was answered.
    pub start_ms: i64,
    pub end_ms: i64,
    /// Caller turns: end of the turn to the first audio of the reply.
    pub response_latency_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    /// Milliseconds since the call was created.
    pub t_ms: i64,
    pub kind: String,
    pub detail: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
}

/// Filters for listing calls.
#[derive(Debug, Clone, Default)]
pub struct CallFilter {
    pub status: Option<String>,
    pub direction: Option<String>,
    /// Matches either party.
    pub number: Option<String>,
    /// Created at or after (ms since the epoch).
    pub(crate) since_ms: Option<i64>,
    pub limit: usize,
}

/// Latency and count figures, for one call or all of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub calls: i64,
    pub answered: i64,
    pub turns: i64,
    pub caller_turns: i64,
    pub(crate) agent_turns: i64,
    pub interruptions: i64,
    pub(crate) duration_s_total: i64,
    /// Caller turn end → first reply audio.
    pub(crate) response_latency_ms_avg: Option<f64>,
    pub(crate) response_latency_ms_p50: Option<i64>,
    pub(crate) response_latency_ms_max: Option<i64>,
    /// Media start → first greeting audio.
    pub(crate) greeting_latency_ms_avg: Option<f64>,
    pub(crate) llm_errors: i64,
    pub(crate) tts_errors: i64,
    pub(crate) stt_errors: i64,
    pub fillers: i64,
    /// Sum of the calls' `cost_usd` (ended calls with a cost).
    pub cost_usd_total: f64,
}

const CALL_COLUMNS: &str = "c.call_id, c.carrier, c.carrier_account, c.direction, c.from_number,
    c.to_number, c.agent, c.status, c.outcome, c.answered_by, c.ended_reason, c.created_at,
    c.answered_at, c.ended_at, c.duration_ms, c.carrier_duration_s, c.cost_usd,
    (SELECT COUNT(*) FROM turns t WHERE t.call_id = c.call_id), c.cost_detail, c.summary";

fn call_row(r: &Row<'_>) -> Result<CallRow, rusqlite::Error> {
    Ok(CallRow {
        call_id: r.get(0)?,
        carrier: r.get(1)?,
        carrier_account: r.get(2)?,
        direction: r.get(3)?,
        from: r.get(4)?,
        to: r.get(5)?,
        agent: r.get(6)?,
        status: r.get(7)?,
        outcome: r.get(8)?,
        answered_by: r.get(9)?,
        ended_reason: r.get(10)?,
        created_at: r.get(11)?,
        answered_at: r.get(12)?,
        ended_at: r.get(13)?,
        duration_ms: r.get(14)?,
        carrier_duration_s: r.get(15)?,
        cost_usd: r.get(16)?,
        turns: r.get(17)?,
        // A detail this version cannot read is left out rather than failing the listing.
        cost: r
            .get::<_, Option<String>>(18)?
            .and_then(|t| serde_json::from_str(&t).ok()),
        summary: r
            .get::<_, Option<String>>(19)?
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

pub(crate) fn list_calls(c: &Connection, f: &CallFilter) -> Result<Vec<CallRow>, rusqlite::Error> {
    let mut sql = format!("SELECT {CALL_COLUMNS} FROM calls c WHERE 1 = 1");
    let mut args: Vec<Value> = Vec::new();
    if let Some(s) = &f.status {
        args.push(Value::Text(s.clone()));
        sql.push_str(&format!(" AND c.status = ?{}", args.len()));
    }
    if let Some(d) = &f.direction {
        args.push(Value::Text(d.clone()));
        sql.push_str(&format!(" AND c.direction = ?{}", args.len()));
    }
    if let Some(n) = &f.number {
        args.push(Value::Text(n.clone()));
        let i = args.len();
        sql.push_str(&format!(
            " AND (c.from_number = ?{i} OR c.to_number = ?{i})"
        ));
    }
    if let Some(s) = f.since_ms {
        args.push(Value::Integer(s));
        sql.push_str(&format!(" AND c.created_at >= ?{}", args.len()));
    }
    args.push(Value::Integer(f.limit.clamp(1, 1000) as i64));
    sql.push_str(&format!(
        " ORDER BY c.created_at DESC, c.rowid DESC LIMIT ?{}",
        args.len()
    ));
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt.query_map(params_from_iter(args), call_row)?;
    rows.collect()
}

pub(crate) fn get_call(c: &Connection, call_id: &str) -> Result<Option<CallRow>, rusqlite::Error> {
    c.query_row(
        &format!("SELECT {CALL_COLUMNS} FROM calls c WHERE c.call_id = ?1"),
        [call_id],
        call_row,
    )
    .optional()
}

pub fn turns(c: &Connection, call_id: &str) -> Result<Vec<TurnRow>, rusqlite::Error> {
    let mut stmt = c.prepare(
        "SELECT seq, speaker, text, heard_text, interrupted, start_ms, end_ms, response_latency_ms
         FROM turns WHERE call_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([call_id], |r| {
        Ok(TurnRow {
            seq: r.get(0)?,
            speaker: r.get(1)?,
            text: r.get(2)?,
            heard_text: r.get(3)?,
            interrupted: r.get(4)?,
            start_ms: r.get(5)?,
            end_ms: r.get(6)?,
            response_latency_ms: r.get(7)?,
        })
    })?;
    rows.collect()
}

pub fn events(c: &Connection, call_id: &str) -> Result<Vec<EventRow>, rusqlite::Error> {
    let mut stmt =
        c.prepare("SELECT t_ms, kind, detail, at FROM events WHERE call_id = ?1 ORDER BY id")?;
    let rows = stmt.query_map([call_id], |r| {
        Ok(EventRow {
            t_ms: r.get(0)?,
            kind: r.get(1)?,
            detail: r.get(2)?,
            at: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Metrics of one call, or of every stored call.
pub fn metrics(c: &Connection, call_id: Option<&str>) -> Result<Metrics, rusqlite::Error> {
    let (scope, arg) = match call_id {
        Some(id) => ("call_id = ?1", id.to_string()),
        None => ("?1 = ?1", String::new()),
    };
    let mut m = Metrics::default();
    c.query_row(
        &format!(
            "SELECT COUNT(*), COUNT(answered_at), COALESCE(SUM(duration_ms), 0) / 1000,
               COALESCE(SUM(cost_usd), 0.0)
             FROM calls WHERE {scope}"
        ),
        [&arg],
        |r| {
            m.calls = r.get(0)?;
            m.answered = r.get(1)?;
            m.duration_s_total = r.get(2)?;
            m.cost_usd_total = r.get(3)?;
            Ok(())
        },
    )?;
    c.query_row(
        &format!(
            "SELECT COUNT(*), COALESCE(SUM(speaker = 'caller'), 0),
               COALESCE(SUM(speaker = 'agent'), 0), COALESCE(SUM(interrupted), 0),
               AVG(response_latency_ms), MAX(response_latency_ms)
             FROM turns WHERE {scope}"
        ),
        [&arg],
        |r| {
            m.turns = r.get(0)?;
            m.caller_turns = r.get(1)?;
            m.agent_turns = r.get(2)?;
            m.interruptions = r.get(3)?;
            m.response_latency_ms_avg = r.get(4)?;
            m.response_latency_ms_max = r.get(5)?;
            Ok(())
        },
    )?;
    let mut stmt = c.prepare(&format!(
        "SELECT response_latency_ms FROM turns WHERE {scope} AND response_latency_ms IS NOT NULL
         ORDER BY response_latency_ms"
    ))?;
    let lat: Vec<i64> = stmt
        .query_map([&arg], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    m.response_latency_ms_p50 = lat.get(lat.len() / 2).copied();
    c.query_row(
        &format!(
            "SELECT COALESCE(SUM(kind = 'llm_error'), 0), COALESCE(SUM(kind = 'tts_error'), 0),
               COALESCE(SUM(kind = 'stt_error'), 0), COALESCE(SUM(kind = 'filler'), 0),
               AVG(CASE WHEN kind = 'greeting_first_frame' THEN CAST(detail AS REAL) / 1000 END)
             FROM events WHERE {scope}"
        ),
        [&arg],
        |r| {
            m.llm_errors = r.get(0)?;
            m.tts_errors = r.get(1)?;
            m.stt_errors = r.get(2)?;
            m.fillers = r.get(3)?;
            m.greeting_latency_ms_avg = r.get(4)?;
            Ok(())
        },
    )?;
    Ok(m)
}
