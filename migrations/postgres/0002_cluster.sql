-- patterd on PostgreSQL, schema 2: what N instances sharing the database coordinate through.
-- Expand-only (old instances keep working on this schema during a rolling upgrade).

-- Membership: one row per instance name (a StatefulSet pod, a host). `incarnation` is drawn at
-- each process start; the lease is judged on the database's clock (`heartbeat_at` vs now()).
CREATE TABLE instances (
    name TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL,
    internal_url TEXT NOT NULL,
    advertise_url TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('ready', 'draining', 'stopped', 'lost')),
    version TEXT NOT NULL,
    max_calls INTEGER NOT NULL,
    live_calls INTEGER NOT NULL DEFAULT 0,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The carrier's own id for a call's leg when it differs from ours (Plivo's CallUUID for our
-- request_uuid), so a peer can hang up a lost instance's legs.
ALTER TABLE calls ADD COLUMN leg_id TEXT;

-- Settings changed at runtime carry a version: peers reload on NOTIFY patterd_settings and
-- poll the versions as the fallback.
ALTER TABLE settings ADD COLUMN version BIGINT NOT NULL DEFAULT 1;

-- Replay guards shared by the cluster: Plivo V3 nonces, Telnyx event ids (pruned by age).
CREATE TABLE webhook_seen (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX webhook_seen_at ON webhook_seen (seen_at);

-- Cluster-wide outbound caps: a reservation is a row, counted under a lock on its cap's key
-- row; a lost instance's rows are deleted by the reaper, an ended call's by its owner.
CREATE TABLE cap_keys (key TEXT PRIMARY KEY);
INSERT INTO cap_keys (key) VALUES ('outbound');
CREATE TABLE outbound_slots (
    slot_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance TEXT NOT NULL,
    from_number TEXT NOT NULL,
    call_id TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX outbound_slots_instance ON outbound_slots (instance);

-- MCP sessions, so a session opened on one instance continues on another.
CREATE TABLE mcp_sessions (
    session_id TEXT PRIMARY KEY,
    state JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
