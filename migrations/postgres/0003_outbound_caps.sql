-- patterd on PostgreSQL, schema 3: the cluster-wide outbound caps' reservation function.
-- Expand-only (a new function and an index; old instances keep working during a rollout).
--
-- A reservation is an `outbound_slots` row. The function serialises every reservation on the
-- `cap_keys` row 'outbound' (FOR UPDATE, held until the calling statement commits), so under READ
-- COMMITTED the counts it makes after the lock see every reservation committed before it: exactly
-- the cap, where a single conditional INSERT overshoots. Fail closed: every slot counts, a lost
-- instance's too, until the reaper deletes them.
--
-- The day's count is the slots created today plus today's outbound calls that no slot of today
-- covers: a slot is bound to its call id before the call row is queued, and deleted only once the
-- call row is committed, so a call is counted once, whether its row is committed yet or not.
CREATE INDEX outbound_slots_call ON outbound_slots (call_id) WHERE call_id IS NOT NULL;

CREATE FUNCTION patterd_reserve_outbound(p_instance TEXT, p_from TEXT, p_max_concurrent BIGINT,
    p_max_per_day BIGINT, p_day_start BIGINT, p_now BIGINT)
RETURNS TABLE (slot BIGINT, live BIGINT, today BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n_live BIGINT;
    n_today BIGINT;
    s BIGINT;
BEGIN
    PERFORM 1 FROM cap_keys WHERE key = 'outbound' FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cap_keys has no row ''outbound'' (schema 2 inserts it); refusing to place calls unchecked';
    END IF;
    SELECT count(*) INTO n_live FROM outbound_slots;
    SELECT count(*) INTO n_today FROM outbound_slots WHERE created_at >= p_day_start;
    n_today := n_today + (
        SELECT count(*) FROM calls c
        WHERE c.direction = 'outbound' AND c.created_at >= p_day_start
          AND NOT EXISTS (SELECT 1 FROM outbound_slots o
                          WHERE o.call_id = c.call_id AND o.created_at >= p_day_start));
    IF n_live >= p_max_concurrent OR n_today >= p_max_per_day THEN
        RETURN QUERY SELECT NULL::BIGINT, n_live, n_today;
        RETURN;
    END IF;
    INSERT INTO outbound_slots (instance, from_number, created_at)
        VALUES (p_instance, p_from, p_now)
        RETURNING slot_id INTO s;
    RETURN QUERY SELECT s, n_live + 1, n_today + 1;
END $$;
