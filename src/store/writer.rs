//! The store's writer thread: drains the write queue in batches, hands each batch to its
//! backend's [`Sink`] (SQLite here, PostgreSQL in `postgres/`) to apply in one transaction,
//! answers flushes after the commit, and prunes calls (and their recordings) older than the
//! retention at start and hourly. The thread runs at a lower
//! CPU priority than the runtime (nice [`WRITER_NICE`]): on a busy core a commit yields to the
//! calls' media instead of holding it up for a scheduler slice.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tracing::{Level, debug, enabled, info, warn};

use super::queue::{Popped, WriteQueue};
use super::{Ask, TERMINAL, Write, now_ms};

/// The writer thread's nice value (Linux). Its work can wait a few milliseconds; the runtime's
/// workers, which pace every call's audio, cannot. When both want the core, the kernel gives
/// the writer about a tenth of it (weight 110 against 1024), still several times what a
/// full core of calls makes it write, so the queue does not back up.
pub(super) const WRITER_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`WRITER_NICE`] (Linux: nice is per thread;
/// raising it needs no privilege). Elsewhere, or if refused, the thread keeps its priority.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id; no memory is passed.
        let rc = unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                libc::gettid() as libc::id_t,
                WRITER_NICE,
            )
        };
        if rc != 0 {
            debug!(error = %std::io::Error::last_os_error(), "store writer keeps its priority");
        }
    }
}

/// A backend's side of the writer thread: commits a batch in one transaction, prunes.
pub(super) trait Sink {
    /// Applies `batch` (no flushes in it) in one transaction; the error says what failed.
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), String>;
    /// Deletes the ended calls created before `cutoff_ms` and returns their ids (and the
    /// delivered or dead webhook deliveries of that age).
    fn prune(&mut self, cutoff_ms: i64) -> Result<Vec<String>, String>;
    /// Answers a lookup a caller waits on synchronously (after the batch it came in committed).
    fn ask(&mut self, ask: Ask);
}

/// The SQLite backend's writer: one connection, the typed writes applied statement by statement.
pub(super) struct SqliteSink {
    pub(super) conn: Connection,
}

impl Sink for SqliteSink {
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), String> {
        let tx = self
            .conn
            .transaction()
            .map_err(|e| format!("cannot begin a transaction: {e}"))?;
        for w in batch {
            if let Err(e) = apply(&tx, w) {
                warn!(error = %e, "call store write failed");
            }
        }
        tx.commit().map_err(|e| format!("commit failed: {e}"))
    }

    fn prune(&mut self, cutoff_ms: i64) -> Result<Vec<String>, String> {
        super::outbox::prune_sqlite(&self.conn, cutoff_ms).map_err(|e| e.to_string())?;
        self.conn
            .execute("DELETE FROM messages WHERE created_at < ?1", [cutoff_ms])
            .map_err(|e| e.to_string())?;
        self.conn
            .prepare(
                "DELETE FROM calls WHERE created_at < ?1 AND ended_at IS NOT NULL RETURNING call_id",
            )
            .and_then(|mut q| {
                q.query_map([cutoff_ms], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| e.to_string())
    }

    fn ask(&mut self, ask: Ask) {
        match ask {
            Ask::Setting(key, reply) => {
                let r = self
                    .conn
                    .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                        r.get(0)
                    })
                    .optional()
                    .map_err(|e| e.to_string());
                let _ = reply.send(r);
            }
        }
    }
}

/// The writer thread: batches from the queue to `sink`, flushes answered after each commit,
/// retention applied at start and hourly. `data_dir` holds the recordings pruned with their calls;
/// `what` names the store in logs.
pub(super) fn writer_loop(
    mut sink: impl Sink,
    rx: &WriteQueue,
    retention_days: u32,
    data_dir: &Path,
    what: &str,
    stats: &super::stats::StoreStats,
) {
    const PRUNE_EVERY: Duration = Duration::from_secs(3600);
    // How long a batch waits for more writes after its first (a flush ends it at once).
    const LINGER: Duration = Duration::from_millis(100);
    lower_own_priority();
    prune(&mut sink, retention_days, data_dir);
    let mut last_prune = std::time::Instant::now();
    loop {
        let batch = match rx.pop_batch(256, PRUNE_EVERY, LINGER) {
            Popped::Batch(b) => b,
            Popped::Idle => {
                prune(&mut sink, retention_days, data_dir);
                last_prune = std::time::Instant::now();
                continue;
            }
            Popped::Closed => return,
        };
        let mut flushes = Vec::new();
        let mut asks = Vec::new();
        // Turns of this batch, logged at debug once committed (tests wait on these lines).
        let log_turns = enabled!(Level::DEBUG);
        let mut stored = Vec::new();
        let mut writes = Vec::with_capacity(batch.len());
        for w in batch {
            match w {
                Write::Flush(done) => flushes.push(done),
                Write::Ask(ask) => asks.push(ask),
                w => {
                    if let (
                        true,
                        Write::Turn {
                            call_id,
                            seq,
                            entry,
                        },
                    ) = (log_turns, &w)
                    {
                        stored.push((call_id.clone(), *seq, entry.heard_text.len()));
                    }
                    writes.push(w);
                }
            }
        }
        if !writes.is_empty() {
            let rows = writes.len();
            let began = std::time::Instant::now();
            let committed = sink.commit(writes);
            stats.batch(rows, began.elapsed(), committed.is_ok());
            match committed {
                Ok(()) => {
                    for (call_id, seq, heard_bytes) in stored {
                        debug!(%call_id, seq, heard_bytes, "turn stored");
                    }
                }
                Err(e) => warn!(error = %e, store = what, "call store commit failed"),
            }
        }
        for ask in asks {
            sink.ask(ask);
        }
        for done in flushes {
            let _ = done.send(());
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            prune(&mut sink, retention_days, data_dir);
            last_prune = std::time::Instant::now();
        }
    }
}

/// Deletes calls older than the retention, and their recordings (in `data_dir`).
fn prune(sink: &mut impl Sink, retention_days: u32, data_dir: &Path) {
    if retention_days == 0 {
        return;
    }
    let cutoff = now_ms() - i64::from(retention_days) * 86_400_000;
    match sink.prune(cutoff) {
        Ok(ids) if ids.is_empty() => {}
        Ok(ids) => {
            let mut recordings = 0;
            for id in &ids {
                let Some(file) = crate::call::recording::path(data_dir, id) else {
                    continue;
                };
                match std::fs::remove_file(&file) {
                    Ok(()) => recordings += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        warn!(path = %file.display(), error = %e, "could not delete an expired recording")
                    }
                }
            }
            info!(
                calls = ids.len(),
                recordings, retention_days, "pruned old calls from the store"
            );
        }
        Err(e) => warn!(error = %e, "call store prune failed"),
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, w: Write) -> Result<(), rusqlite::Error> {
    match w {
        Write::Call(c) => {
            tx.execute(
                "INSERT OR IGNORE INTO calls (call_id, carrier, carrier_account, direction,
                   from_number, to_number, agent, status, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    c.call_id,
                    c.carrier,
                    c.carrier_account,
                    c.direction,
                    c.from,
                    c.to,
                    c.agent,
                    c.status,
                    now_ms()
                ],
            )?;
        }
        Write::Status {
            call_id,
            status,
            outcome,
            answered_by,
            carrier_duration_s,
        } => apply_status(
            tx,
            &call_id,
            status,
            outcome,
            answered_by,
            carrier_duration_s,
        )?,
        Write::Turn {
            call_id,
            seq,
            entry,
        } => apply_turn(tx, &call_id, seq, &entry)?,
        Write::Event { call_id, event, at } => {
            tx.execute(
                "INSERT INTO events (call_id, t_ms, kind, detail, at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    call_id,
                    event.t_ms as i64,
                    event.kind.as_str(),
                    event.detail,
                    at
                ],
            )?;
        }
        Write::Answered { call_id, at } => {
            tx.execute(
                "UPDATE calls SET status = 'in-progress', answered_at = COALESCE(answered_at, ?2)
                 WHERE call_id = ?1",
                params![call_id, at],
            )?;
        }
        Write::ReplyLatency {
            call_id,
            latency_us,
        } => {
            tx.execute(
                "UPDATE turns SET response_latency_ms = ?2 WHERE call_id = ?1
                   AND response_latency_ms IS NULL AND seq = (SELECT MAX(seq) FROM turns
                   WHERE call_id = ?1 AND speaker = 'caller')",
                params![call_id, (latency_us / 1000) as i64],
            )?;
        }
        Write::Ended {
            call_id,
            reason,
            at,
            outbox,
        } => {
            tx.execute(
                "UPDATE calls SET ended_at = ?2, ended_reason = ?3,
                   duration_ms = CASE WHEN answered_at IS NULL THEN 0 ELSE ?2 - answered_at END,
                   status = CASE WHEN status IN ('completed','busy','failed','no-answer','canceled')
                     THEN status WHEN answered_at IS NOT NULL OR outcome IN ('answered', 'voicemail')
                     THEN 'completed' ELSE 'failed' END,
                   outcome = COALESCE(outcome, CASE WHEN answered_at IS NOT NULL THEN 'answered'
                     ELSE 'failed' END)
                 WHERE call_id = ?1",
                params![call_id, at, reason],
            )?;
            // After the end row (and the cost and turns queued before it): `call.ended`
            // reports the call as it now stands.
            super::outbox::insert_sqlite(tx, outbox, now_ms())?;
        }
        Write::Outbox(events) => super::outbox::insert_sqlite(tx, events, now_ms())?,
        Write::Summary { call_id, summary } => {
            tx.execute(
                "UPDATE calls SET summary = ?2 WHERE call_id = ?1",
                params![call_id, summary.to_string()],
            )?;
            super::outbox::release_held_sqlite(tx, &call_id, now_ms())?;
        }
        Write::Cost { call_id, cost } => {
            let detail = serde_json::to_string(&cost).unwrap_or_default();
            tx.execute(
                "UPDATE calls SET cost_usd = ?2, cost_detail = ?3 WHERE call_id = ?1",
                params![call_id, cost.total_usd, detail],
            )?;
        }
        Write::Setting { key, value } => {
            tx.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )?;
        }
        Write::Message(m) => super::messages::insert(tx, &m)?,
        Write::MessageStatus {
            message_id,
            status,
            carrier_message_id,
            error,
            at,
        } => super::messages::update(
            tx,
            &message_id,
            status,
            carrier_message_id.as_deref(),
            error.as_deref(),
            at,
        )?,
        // One instance: the leg id lives in memory only (`carrier::dial::Outbound`).
        Write::Flush(_) | Write::Ask(_) | Write::Leg { .. } => {}
    }
    Ok(())
}

/// A carrier's status callback: each field it carries, a terminal status never replaced.
fn apply_status(
    tx: &rusqlite::Transaction<'_>,
    call_id: &str,
    status: Option<String>,
    outcome: Option<String>,
    answered_by: Option<String>,
    carrier_duration_s: Option<u64>,
) -> Result<(), rusqlite::Error> {
    // A terminal status is never replaced by a late progress callback.
    if let Some(s) = status {
        let terminal = TERMINAL.contains(&s.as_str());
        tx.execute(
            "UPDATE calls SET status = ?2 WHERE call_id = ?1
               AND (?3 OR status NOT IN ('completed','busy','failed','no-answer','canceled'))",
            params![call_id, s, terminal],
        )?;
    }
    if let Some(o) = outcome {
        tx.execute(
            "UPDATE calls SET outcome = ?2 WHERE call_id = ?1",
            params![call_id, o],
        )?;
    }
    if let Some(a) = answered_by {
        tx.execute(
            "UPDATE calls SET answered_by = ?2 WHERE call_id = ?1",
            params![call_id, a],
        )?;
    }
    if let Some(d) = carrier_duration_s {
        tx.execute(
            "UPDATE calls SET carrier_duration_s = ?2 WHERE call_id = ?1",
            params![call_id, d as i64],
        )?;
    }
    Ok(())
}

/// A transcript entry, inserted or (as the agent's heard text grows) updated.
fn apply_turn(
    tx: &rusqlite::Transaction<'_>,
    call_id: &str,
    seq: usize,
    entry: &crate::call::TranscriptEntry,
) -> Result<(), rusqlite::Error> {
    let speaker = match entry.speaker {
        crate::call::Speaker::Caller => "caller",
        crate::call::Speaker::Agent => "agent",
    };
    tx.execute(
        "INSERT INTO turns (call_id, seq, speaker, text, heard_text, interrupted, start_ms, end_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (call_id, seq) DO UPDATE SET text = excluded.text,
           heard_text = excluded.heard_text, interrupted = excluded.interrupted,
           start_ms = excluded.start_ms, end_ms = excluded.end_ms",
        params![
            call_id,
            seq as i64,
            speaker,
            entry.text,
            entry.heard_text,
            entry.interrupted,
            entry.start_ms as i64,
            entry.end_ms as i64
        ],
    )?;
    Ok(())
}
