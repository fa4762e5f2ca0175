-- patterd on PostgreSQL, schema 4: the webhook outbox and the call's summary. Expand-only (a new
-- table and a nullable column; old instances keep working during a rollout).
--
-- One row per event and receiver (`[[webhooks]]` url), written by the store's writer in the
-- transaction of what it reports (a call's end row and its `call.ended` rows commit together).
-- `id` is the Standard Webhooks `webhook-id`, fixed before the first attempt, so a batch
-- retried after a lost COMMIT acknowledgement inserts nothing twice. Instances claim due rows
-- with FOR UPDATE SKIP LOCKED and a lease (`claimed_by`, `lease_until`, on the database's
-- clock in epoch milliseconds): a lost instance's claims are taken again once their lease runs
-- out. `held` rows wait for the call's summary; `dead` is the dead-letter list.
CREATE TABLE webhook_outbox (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    event TEXT NOT NULL,
    call_id TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('held', 'pending', 'delivered', 'dead')),
    created_at BIGINT NOT NULL,
    window_start BIGINT NOT NULL,
    next_at BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    claimed_by TEXT,
    lease_until BIGINT,
    last_status INTEGER,
    last_error TEXT,
    done_at BIGINT
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (next_at) WHERE state = 'pending';
CREATE INDEX webhook_outbox_state ON webhook_outbox (state, created_at);
CREATE INDEX webhook_outbox_call ON webhook_outbox (call_id);

-- The summary `[agents.X.summary]` wrote after the call (JSON: text and extracted data).
ALTER TABLE calls ADD COLUMN summary TEXT;
