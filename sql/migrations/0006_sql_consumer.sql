-- tidemark schema, version 6: the consumer's page as SQL functions, the
-- consumer contract for every language (docs/PROTOCOL.md, section 6).
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}}.
--
--   BEGIN ISOLATION LEVEL REPEATABLE READ;
--   SELECT * FROM tidemark.read_page('billing', 'orders', 100);
--   -- apply the page's effects in this transaction
--   SELECT tidemark.advance_cursor('billing', 'orders', <the last seq applied>);
--   COMMIT;
--
-- The functions run with the caller's rights (SECURITY INVOKER), so the
-- row-level security on cursors (version 2) decides which consumers a role
-- may page: a cursor row the role may not use cannot be read, created,
-- locked or moved through them.
--
-- SQLSTATEs of class TM (docs/ERRORS.md):
--   TM001  the cursor is held by another session (retry later)
--   TM002  retention removed events above the cursor: rebuild (bootstrap)
--   TM003  read_page outside a REPEATABLE READ (or SERIALIZABLE) transaction
--   TM004  advance_cursor without a read_page of that cursor in this transaction
--   TM005  advance_cursor backwards, or past the events the page returned
--   TM006  read_page again before advancing past the events it returned

-- The advisory-lock key of a (consumer, stream) cursor: a tailer holds it
-- at session level for its life, a page at transaction level. The length
-- prefix keeps ('ab', 'c') and ('a', 'bc') apart; the seed keeps schemas
-- apart. hashtextextended of a C-collated text hashes its bytes, and its
-- results do not change between major versions (hash partitioning relies
-- on that).
CREATE FUNCTION {{schema}}.cursor_lock_key(p_consumer text, p_stream text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT pg_catalog.hashtextextended(
    (pg_catalog.length(p_consumer)::text || ':' || p_consumer || p_stream) COLLATE "C",
    {{fence_key}})
$$;

-- The cursor's key, after refusing a missing, empty or over-long consumer or
-- stream name as the TypeScript client does (1-200 characters).
CREATE FUNCTION {{schema}}.checked_cursor_key(p_function text, p_consumer text, p_stream text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_consumer IS NULL OR p_consumer = '' OR pg_catalog.length(p_consumer) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: consumer must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_consumer), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_stream IS NULL OR p_stream = '' OR pg_catalog.length(p_stream) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: stream must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_stream), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN {{schema}}.cursor_lock_key(p_consumer, p_stream);
END
$$;

-- The pages open in this transaction live in the transaction-local setting
-- tidemark.pages: a JSON object from cursor_lock_key to
--   [cursor when read, highest seq an advance may reach, cursor now,
--    safe_seq, seq of the last event returned, transaction id].
-- set_config(..., true) ends it with the transaction, and a rolled-back
-- savepoint restores it with the row lock it covered. An entry whose
-- transaction id is not this transaction's (a value SET for the session by
-- hand) counts as no page.
CREATE FUNCTION {{schema}}.open_pages() RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT coalesce(nullif(pg_catalog.current_setting('tidemark.pages', true), '')::jsonb, '{}'::jsonb)
$$;

-- This transaction's page of a cursor (its entry in tidemark.pages), or NULL.
CREATE FUNCTION {{schema}}.open_page(p_key bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT p FROM (SELECT {{schema}}.open_pages() -> p_key::text AS p) o
   WHERE (p ->> 5) = pg_catalog.pg_current_xact_id_if_assigned()::text
$$;

CREATE TYPE {{schema}}.locked_cursor AS (key bigint, cursor bigint, safe_seq bigint);

-- Opens a page of (consumer, stream) in the caller's transaction, or raises:
-- checks the isolation level, takes the cursor's advisory lock for the
-- transaction (TM001 when another session holds it), creates the cursor row
-- when missing, locks it FOR NO KEY UPDATE, and reads safe_seq and the
-- stream's horizon (TM002 when the horizon is above the cursor). Everything
-- is read in the transaction's snapshot, as are the events afterwards.
CREATE FUNCTION {{schema}}.lock_cursor(p_function text, p_consumer text, p_stream text) RETURNS {{schema}}.locked_cursor
LANGUAGE plpgsql AS $$
DECLARE
  v {{schema}}.locked_cursor;
  v_pruned bigint;
  v_page jsonb;
BEGIN
  v.key := {{schema}}.checked_cursor_key(p_function, p_consumer, p_stream);
  -- Reading again what this transaction read and did not advance past would
  -- hand the same events over twice.
  v_page := {{schema}}.open_page(v.key);
  IF (v_page ->> 2)::bigint < (v_page ->> 4)::bigint THEN
    RAISE EXCEPTION 'tidemark: %: this transaction read events of consumer % on stream % up to seq % and advanced only to seq %', p_function,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_page ->> 4, v_page ->> 2
      USING ERRCODE = 'TM006',
            HINT = 'Advance past the events the page returned (advance_cursor) before reading the next page in the same transaction.';
  END IF;
  IF pg_catalog.current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN
    RAISE EXCEPTION 'tidemark: % must run in a REPEATABLE READ transaction, not %', p_function, pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003',
            HINT = 'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM read_page(...); apply the events; SELECT advance_cursor(...); COMMIT;';
  END IF;
  IF NOT pg_catalog.pg_try_advisory_xact_lock(v.key) THEN
    RAISE EXCEPTION 'tidemark: the cursor of consumer % on stream % is held by another session', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM001',
            HINT = 'One session at a time pages a cursor: roll back and try again later, or page under another consumer name.';
  END IF;
  SELECT c.seq INTO v.cursor FROM {{schema}}.cursors c
   WHERE c.consumer = p_consumer AND c.stream = p_stream FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    -- First use. Row-level security refuses a consumer the role may not use.
    INSERT INTO {{schema}}.cursors (consumer, stream) VALUES (p_consumer, p_stream) ON CONFLICT DO NOTHING;
    SELECT c.seq INTO v.cursor FROM {{schema}}.cursors c
     WHERE c.consumer = p_consumer AND c.stream = p_stream FOR NO KEY UPDATE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'tidemark: %: the cursor of consumer % on stream % exists but this role may not use it', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The owner grants consumers with SELECT tidemark.grant_consumer(role, ARRAY[consumer]).';
    END IF;
  END IF;
  SELECT w.safe_seq, h.pruned_through_seq INTO v.safe_seq, v_pruned
    FROM {{schema}}.watermark w LEFT JOIN {{schema}}.horizons h ON h.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: the watermark row is missing' USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  IF v_pruned > v.cursor THEN
    RAISE EXCEPTION 'tidemark: retention removed events of stream % above the cursor of consumer % (cursor %, pruned through %)',
        pg_catalog.quote_literal(p_stream), pg_catalog.quote_literal(p_consumer), v.cursor, v_pruned
      USING ERRCODE = 'TM002',
            DETAIL = pg_catalog.format('cursor=%s pruned_through=%s', v.cursor, v_pruned),
            HINT = 'Nothing was delivered. Roll back, record it with note_resync(consumer, stream), and rebuild the consumer from a bootstrap snapshot.';
  END IF;
  RETURN v;
END
$$;

-- Records the page in tidemark.pages.
CREATE FUNCTION {{schema}}.remember_page(p_key bigint, p_cursor bigint, p_through bigint, p_safe_seq bigint, p_read_to bigint) RETURNS text
LANGUAGE sql AS $$
  SELECT pg_catalog.set_config('tidemark.pages',
    ({{schema}}.open_pages() || pg_catalog.jsonb_build_object(p_key::text,
      pg_catalog.jsonb_build_array(p_cursor, p_through, p_cursor, p_safe_seq, p_read_to, pg_catalog.pg_current_xact_id()::text)))::text,
    true)
$$;

-- The page: the events of the stream above the consumer's cursor and at or
-- below safe_seq, in seq order, at most max_events of them, read in the
-- caller's REPEATABLE READ snapshot with the cursor row locked until the
-- transaction ends. A page with fewer than max_events events holds every
-- event up to safe_seq.
CREATE FUNCTION {{schema}}.read_page(p_consumer text, p_stream text, p_max_events integer)
RETURNS TABLE (seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v {{schema}}.locked_cursor;
  v_count bigint;
  v_last bigint;
  v_through bigint;
  v_done text;
BEGIN
  IF p_max_events IS NULL OR p_max_events < 1 OR p_max_events > 100000 THEN
    RAISE EXCEPTION 'tidemark: read_page: max_events must be between 1 and 100000, got %', coalesce(p_max_events::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Assignments, not SELECT ... INTO: plpgsql evaluates a plain function
  -- call without starting an executor, which a page notices.
  v := {{schema}}.lock_cursor('read_page', p_consumer, p_stream);
  RETURN QUERY
    SELECT e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at
      FROM {{schema}}.events e
     WHERE e.stream = p_stream AND e.seq > v.cursor AND e.seq <= v.safe_seq
     ORDER BY e.seq
     LIMIT p_max_events;
  -- RETURN QUERY does not tell which row came last: find its seq again in
  -- the index (the same range, so about the cost of the read's own index
  -- walk; a RETURN NEXT loop over the rows costs more per row).
  GET DIAGNOSTICS v_count = ROW_COUNT;
  IF v_count = 0 THEN
    v_last := v.cursor;
  ELSE
    SELECT e.seq INTO v_last FROM {{schema}}.events e
     WHERE e.stream = p_stream AND e.seq > v.cursor AND e.seq <= v.safe_seq
     ORDER BY e.seq OFFSET v_count - 1 LIMIT 1;
  END IF;
  -- A short page returned every event up to safe_seq: the cursor may go
  -- there. A full page may reach its last event only.
  v_through := CASE WHEN v_count < p_max_events THEN v.safe_seq ELSE v_last END;
  v_done := {{schema}}.remember_page(v.key, v.cursor, v_through, v.safe_seq, v_last);
END
$$;

-- For clients that read a page's events ahead, outside this transaction (the
-- TypeScript client's prefetch): opens the page as read_page does, reads no
-- event, and returns the locked cursor and safe_seq. When the cursor is at
-- `after`, and (after, through] holds exactly `events` events of the stream
-- in this snapshot, through at most safe_seq, those are this page's events
-- (docs/PROTOCOL.md, section 6.2) and advance_cursor may reach `through`;
-- otherwise 22023. When the cursor is elsewhere, the page may not advance:
-- call read_page.
CREATE FUNCTION {{schema}}.lock_page(p_consumer text, p_stream text, p_after bigint, p_through bigint, p_events integer,
                                     OUT cursor bigint, OUT safe_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v {{schema}}.locked_cursor;
  v_found bigint;
  v_done text;
BEGIN
  v := {{schema}}.lock_cursor('lock_page', p_consumer, p_stream);
  cursor := v.cursor;
  safe_seq := v.safe_seq;
  IF v.cursor IS DISTINCT FROM p_after THEN
    v_done := {{schema}}.remember_page(v.key, v.cursor, v.cursor, v.safe_seq, v.cursor);
    RETURN;
  END IF;
  IF p_through IS NULL OR p_through <= p_after OR p_through > v.safe_seq OR p_events IS NULL OR p_events < 1 THEN
    RAISE EXCEPTION 'tidemark: lock_page: through must be above after (%) and at most safe_seq (%), and events positive; got through %, events %',
        p_after, v.safe_seq, coalesce(p_through::text, 'NULL'), coalesce(p_events::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT pg_catalog.count(*) INTO v_found FROM {{schema}}.events e
   WHERE e.stream = p_stream AND e.seq > p_after AND e.seq <= p_through;
  IF v_found <> p_events THEN
    RAISE EXCEPTION 'tidemark: lock_page: stream % holds % events in (%, %], not %: the events read ahead are not this page''s',
        pg_catalog.quote_literal(p_stream), v_found, p_after, p_through, p_events
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Read ahead with one statement bounded by safe_seq, or call read_page.';
  END IF;
  v_done := {{schema}}.remember_page(v.key, v.cursor, p_through, v.safe_seq, p_through);
END
$$;

-- The page of (consumer, stream) open in this transaction: the cursor when
-- it was read, the highest seq advance_cursor may reach, the cursor now, and
-- the safe_seq it was read below. No row when no page is open.
CREATE FUNCTION {{schema}}.page_info(p_consumer text, p_stream text)
RETURNS TABLE (cursor bigint, through bigint, advanced_to bigint, safe_seq bigint)
LANGUAGE sql STABLE AS $$
  SELECT (p ->> 0)::bigint, (p ->> 1)::bigint, (p ->> 2)::bigint, (p ->> 3)::bigint
    FROM (SELECT {{schema}}.open_page({{schema}}.cursor_lock_key(p_consumer, p_stream)) AS p) o
   WHERE p IS NOT NULL
$$;

-- Moves the cursor of a page read in this transaction to `seq`: the seq of
-- the last event whose effects this transaction applied. It commits with the
-- effects, or neither does. NULL, or the cursor's current position, leaves
-- it where it is (an empty page). Returns the cursor.
CREATE FUNCTION {{schema}}.advance_cursor(p_consumer text, p_stream text, p_seq bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_key text;
  v_pages jsonb;
  v_page jsonb;
  v_through bigint;
  v_at bigint;
  v_done text;
BEGIN
  v_key := {{schema}}.checked_cursor_key('advance_cursor', p_consumer, p_stream)::text;
  v_pages := {{schema}}.open_pages();
  v_page := {{schema}}.open_page(v_key::bigint);
  IF v_page IS NULL THEN
    RAISE EXCEPTION 'tidemark: advance_cursor: no page of consumer % on stream % was read in this transaction', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM004',
            HINT = 'Call read_page first, in the same REPEATABLE READ transaction.';
  END IF;
  v_through := (v_page ->> 1)::bigint;
  v_at := (v_page ->> 2)::bigint;
  IF p_seq IS NULL OR p_seq = v_at THEN
    RETURN v_at;
  END IF;
  IF p_seq < v_at THEN
    RAISE EXCEPTION 'tidemark: advance_cursor to % goes backwards: the cursor of consumer % on stream % is at %', p_seq, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_at
      USING ERRCODE = 'TM005';
  END IF;
  IF p_seq > v_through THEN
    RAISE EXCEPTION 'tidemark: advance_cursor to % skips events the page did not return: it may reach seq % at most', p_seq, v_through
      USING ERRCODE = 'TM005',
            HINT = 'Advance to the seq of the last event applied, then read the next page.';
  END IF;
  -- Compare and set: the page holds the row locked, so the cursor is where
  -- the page left it, unless the page's state was forged or the row went.
  UPDATE {{schema}}.cursors c SET seq = p_seq, updated_at = pg_catalog.now()
   WHERE c.consumer = p_consumer AND c.stream = p_stream AND c.seq = v_at;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: advance_cursor: the cursor of consumer % on stream % is not at seq %, where this transaction''s page left it: moved or deleted under the page, or not this role''s to use',
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_at
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  v_done := pg_catalog.set_config('tidemark.pages',
    pg_catalog.jsonb_set(v_pages, ARRAY[v_key, '2'], pg_catalog.to_jsonb(p_seq))::text, true);
  RETURN p_seq;
END
$$;

-- After TM002 and a ROLLBACK: records the resync on the cursor row
-- (resync_count, last_resync_at, which `tidemark status` shows) in its own
-- transaction, and returns the cursor and the horizon above it. No row when
-- the cursor is no longer behind the horizon (a bootstrap moved it meanwhile).
CREATE FUNCTION {{schema}}.note_resync(p_consumer text, p_stream text)
RETURNS TABLE (cursor bigint, pruned_through bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key('note_resync', p_consumer, p_stream);
BEGIN
  RETURN QUERY
    UPDATE {{schema}}.cursors c
       SET resync_count = c.resync_count + 1, last_resync_at = pg_catalog.now()
      FROM {{schema}}.horizons h
     WHERE c.consumer = p_consumer AND c.stream = p_stream
       AND h.stream = p_stream AND h.pruned_through_seq > c.seq
    RETURNING c.seq, h.pruned_through_seq;
END
$$;
