-- patterd on PostgreSQL, schema 5: text messages sent and received, and the cluster-wide
-- daily cap on the ones sent. Expand-only (a new table, a cap key row and a function; old
-- instances keep working during a rollout).
--
-- An outbound message is inserted `sending` by patterd_reserve_sms, which serialises every
-- reservation on the `cap_keys` row 'sms' (FOR UPDATE, held until the calling statement
-- commits) and counts the day's outbound rows that are `sending` or `sent` first: N instances
-- sending at once hold exactly `max_sms_per_day`. A failed send is set `failed` and stops
-- counting; a row whose instance died mid-send stays `sending` and counts (fail closed).
CREATE TABLE messages (
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
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX messages_created ON messages (created_at);
CREATE INDEX messages_pair ON messages (from_number, to_number, created_at);
CREATE UNIQUE INDEX messages_carrier_id ON messages (carrier, carrier_message_id)
    WHERE carrier_message_id IS NOT NULL;

INSERT INTO cap_keys (key) VALUES ('sms') ON CONFLICT DO NOTHING;

CREATE FUNCTION patterd_reserve_sms(p_message_id TEXT, p_carrier TEXT, p_account TEXT,
    p_from TEXT, p_to TEXT, p_body TEXT, p_agent TEXT, p_call_id TEXT, p_source TEXT,
    p_max_per_day BIGINT, p_day_start BIGINT, p_now BIGINT)
RETURNS TABLE (granted BOOLEAN, today BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n_today BIGINT;
BEGIN
    PERFORM 1 FROM cap_keys WHERE key = 'sms' FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cap_keys has no row ''sms'' (schema 5 inserts it); refusing to send unchecked';
    END IF;
    SELECT count(*) INTO n_today FROM messages
        WHERE direction = 'outbound' AND status IN ('sending', 'sent') AND created_at >= p_day_start;
    IF n_today >= p_max_per_day THEN
        RETURN QUERY SELECT false, n_today;
        RETURN;
    END IF;
    INSERT INTO messages (message_id, direction, carrier, carrier_account, from_number,
        to_number, body, status, agent, call_id, source, created_at, updated_at)
        VALUES (p_message_id, 'outbound', p_carrier, p_account, p_from, p_to, p_body, 'sending',
                p_agent, p_call_id, p_source, p_now, p_now);
    RETURN QUERY SELECT true, n_today + 1;
END $$;
