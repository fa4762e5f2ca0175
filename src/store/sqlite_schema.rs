//! The SQLite store's schema: numbered migrations, run in order by `store::migrate` and counted
//! in `PRAGMA user_version` (the PostgreSQL store's are `migrations/postgres/*.sql`).

/// Numbered schema migrations; `PRAGMA user_version` is how many have run.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: calls, turns, events, settings.
    "CREATE TABLE calls (
        call_id TEXT PRIMARY KEY,
        carrier TEXT NOT NULL,
        carrier_account TEXT NOT NULL,
        direction TEXT NOT NULL CHECK (direction IN ('inbound', 'outbound')),
        from_number TEXT NOT NULL,
        to_number TEXT NOT NULL,
        agent TEXT NOT NULL,
        status TEXT NOT NULL,
        outcome TEXT,
        answered_by TEXT,
        ended_reason TEXT,
        created_at INTEGER NOT NULL,
        answered_at INTEGER,
        ended_at INTEGER,
        duration_ms INTEGER,
        carrier_duration_s INTEGER,
        cost_usd REAL,
        cost_detail TEXT
    );
    CREATE INDEX calls_created ON calls (created_at);
    CREATE INDEX calls_status ON calls (status);
    CREATE TABLE turns (
        call_id TEXT NOT NULL REFERENCES calls (call_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        speaker TEXT NOT NULL,
        text TEXT NOT NULL,
        heard_text TEXT NOT NULL,
        interrupted INTEGER NOT NULL,
        start_ms INTEGER NOT NULL,
        end_ms INTEGER NOT NULL,
        response_latency_ms INTEGER,
        PRIMARY KEY (call_id, seq)
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        call_id TEXT NOT NULL REFERENCES calls (call_id) ON DELETE CASCADE,
        t_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL,
        at INTEGER NOT NULL
    );
    CREATE INDEX events_call ON events (call_id, id);
    CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    // 2: numbers wired by `patterd wire`, with the carrier settings `unwire` restores.
    "CREATE TABLE wirings (
        number TEXT PRIMARY KEY,
        carrier_account TEXT NOT NULL,
        previous TEXT NOT NULL,
        wired_at INTEGER NOT NULL
    );",
    // 3: the carrier applications `patterd wire` rewrote, as they were before the first wire
    // through each (several numbers may share one).
    "CREATE TABLE wiring_apps (
        carrier_account TEXT NOT NULL,
        app_id TEXT NOT NULL,
        previous TEXT NOT NULL,
        wired_at INTEGER NOT NULL,
        PRIMARY KEY (carrier_account, app_id)
    );",
    // 4: the webhook outbox (`store::outbox`): one row per event and receiver, written in the
    // transaction of what it reports, delivered and retried by `app::webhooks`; and the call's
    // summary (`[agents.X.summary]`).
    "CREATE TABLE webhook_outbox (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        event TEXT NOT NULL,
        call_id TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('held', 'pending', 'delivered', 'dead')),
        created_at INTEGER NOT NULL,
        window_start INTEGER NOT NULL,
        next_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        claimed_by TEXT,
        lease_until INTEGER,
        last_status INTEGER,
        last_error TEXT,
        done_at INTEGER
    );
    CREATE INDEX webhook_outbox_due ON webhook_outbox (next_at) WHERE state = 'pending';
    CREATE INDEX webhook_outbox_state ON webhook_outbox (state, created_at);
    CREATE INDEX webhook_outbox_call ON webhook_outbox (call_id);
    ALTER TABLE calls ADD COLUMN summary TEXT;",
    // 5: text messages sent and received (`store::messages`). An outbound row is written
    // `sending` before its carrier is asked; `max_sms_per_day` counts `sending` and `sent`.
    "CREATE TABLE messages (
        message_id TEXT PRIMARY KEY,
        direction TEXT NOT NULL CHECK (direction IN ('inbound', 'outbound')),
        carrier TEXT NOT NULL,
        carrier_account TEXT NOT NULL,
        carrier_message_id TEXT,
        from_number TEXT NOT NULL,
        to_number TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        agent TEXT,
        call_id TEXT,
        source TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX messages_created ON messages (created_at);
    CREATE INDEX messages_pair ON messages (from_number, to_number, created_at);
    CREATE UNIQUE INDEX messages_carrier_id ON messages (carrier, carrier_message_id)
        WHERE carrier_message_id IS NOT NULL;",
];
