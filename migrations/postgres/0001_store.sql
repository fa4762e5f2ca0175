-- patterd call store on PostgreSQL, schema 1: the same tables as the SQLite store (times stay
-- epoch milliseconds in BIGINT so the API's JSON does not change), plus `calls.owner_id` (the
-- instance that admitted the call) and a per-call event sequence assigned by the writer, so a
-- batch retried after a lost COMMIT acknowledgement inserts nothing twice.
-- Migrations are expand-only within a release: old and new instances share the database during
-- a rolling upgrade.
CREATE TABLE calls (
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
    created_at BIGINT NOT NULL,
    answered_at BIGINT,
    ended_at BIGINT,
    duration_ms BIGINT,
    carrier_duration_s BIGINT,
    cost_usd DOUBLE PRECISION,
    cost_detail TEXT,
    owner_id TEXT NOT NULL,
    ins BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX calls_created ON calls (created_at);
CREATE INDEX calls_status ON calls (status);
CREATE INDEX calls_live_by_owner ON calls (owner_id) WHERE ended_at IS NULL;
CREATE INDEX calls_outbound_day ON calls (created_at) WHERE direction = 'outbound';
CREATE INDEX calls_from ON calls (from_number);
CREATE INDEX calls_to ON calls (to_number);
CREATE TABLE turns (
    call_id TEXT NOT NULL REFERENCES calls (call_id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    speaker TEXT NOT NULL,
    text TEXT NOT NULL,
    heard_text TEXT NOT NULL,
    interrupted BOOLEAN NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT NOT NULL,
    response_latency_ms BIGINT,
    PRIMARY KEY (call_id, seq)
);
CREATE TABLE events (
    call_id TEXT NOT NULL REFERENCES calls (call_id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    t_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (call_id, seq)
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE wirings (
    number TEXT PRIMARY KEY,
    carrier_account TEXT NOT NULL,
    previous TEXT NOT NULL,
    wired_at BIGINT NOT NULL
);
