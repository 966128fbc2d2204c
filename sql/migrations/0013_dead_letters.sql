-- tidemark schema, version 13: dead letters.
-- Placeholders: {{schema}} (quoted identifier).
--
-- A consumer whose handler keeps failing on one event may set it aside and
-- go on (the `failures` option, onExhausted 'dead-letter'): in the page that
-- read the event, record_dead_letter copies it into dead_letters, and the
-- page's advance_cursor moves past it in the same transaction, so either
-- both commit or neither does (docs/PROTOCOL.md, section 6.3). A dead
-- letter stays until it is discarded, or replayed: delivered again to the
-- consumer's handler by the consumer's own tailer, and deleted in the
-- handler's transaction.
--
-- The copy keeps the event as it was stored (jsonb to jsonb, no text
-- round trip), so retention may remove the event from events meanwhile.

CREATE TABLE {{schema}}.dead_letters (
  id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer            text NOT NULL CHECK (consumer <> ''),
  stream              text NOT NULL CHECK (stream <> ''),
  seq                 bigint NOT NULL,
  kind                text NOT NULL,
  key                 text NOT NULL,
  payload             jsonb NOT NULL,
  headers             jsonb NOT NULL,
  occurred_at         timestamptz NOT NULL,
  attempts            integer NOT NULL CHECK (attempts >= 1),
  last_error          text NOT NULL,
  dead_at             timestamptz NOT NULL DEFAULT pg_catalog.now(),
  -- Set by a replay request; the consumer's tailer delivers it again.
  replay_requested_at timestamptz,
  UNIQUE (consumer, stream, seq)
);

-- A dead letter is the event as stored, whoever inserts it: its content is
-- copied from events, never taken from the insert, so a consumer role
-- (which may insert its own consumers' dead letters) cannot make up an
-- event for a replay to deliver. Only its tries, error, time and replay
-- request may be updated (grant_consumer, below).
CREATE FUNCTION {{schema}}.dead_letter_is_the_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  SELECT e.kind, e.key, e.payload, e.headers, e.occurred_at
    INTO NEW.kind, NEW.key, NEW.payload, NEW.headers, NEW.occurred_at
    FROM {{schema}}.events e
   WHERE e.seq = NEW.seq AND e.stream = NEW.stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: stream % has no event %', pg_catalog.quote_literal(NEW.stream), NEW.seq
      USING ERRCODE = 'TM005';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER dead_letters_event BEFORE INSERT ON {{schema}}.dead_letters
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.dead_letter_is_the_event();

-- The same rows as the consumer's cursors: a consumer role sees, records,
-- replays and discards the dead letters of the consumers granted to it.
ALTER TABLE {{schema}}.dead_letters ENABLE ROW LEVEL SECURITY;
CREATE POLICY dead_letters_granted_consumers ON {{schema}}.dead_letters
  USING (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = dead_letters.consumer
       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
  WITH CHECK (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = dead_letters.consumer
       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));

-- Records event p_seq of p_stream as a dead letter of p_consumer and moves
-- the cursor past it, in the page of that cursor open in this transaction.
-- The page must have returned it, and it must be the stream's next event
-- above the cursor (the events before it applied and advanced past);
-- returns the dead letter's id. An advance_cursor to p_seq after it
-- changes nothing. An event already dead for this consumer has its tries,
-- error and time updated, and any replay request cleared.
CREATE FUNCTION {{schema}}.record_dead_letter(p_consumer text, p_stream text, p_seq bigint, p_attempts integer, p_error text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_page jsonb;
  v_id   bigint;
BEGIN
  v_page := {{schema}}.open_page({{schema}}.checked_cursor_key('record_dead_letter', p_consumer, p_stream));
  IF v_page IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: no page of consumer % on stream % was read in this transaction', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM004',
            HINT = 'Call read_page first, in the same REPEATABLE READ transaction, then record_dead_letter, then advance_cursor.';
  END IF;
  IF p_seq IS NULL OR p_seq <= (v_page ->> 2)::bigint OR p_seq > (v_page ->> 1)::bigint THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: seq % is not an event of this page above the cursor (at %, the page reaches %)',
        coalesce(p_seq::text, 'NULL'), v_page ->> 2, v_page ->> 1
      USING ERRCODE = 'TM005';
  END IF;
  IF EXISTS (SELECT 1 FROM {{schema}}.events e
              WHERE e.stream = p_stream AND e.seq > (v_page ->> 2)::bigint AND e.seq < p_seq) THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: seq % is not the next event above the cursor (at %): apply the events before it and advance past them first', p_seq, v_page ->> 2
      USING ERRCODE = 'TM005';
  END IF;
  IF p_attempts IS NULL OR p_attempts < 1 OR p_error IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: attempts must be at least 1 and the error given (got %, %)',
        coalesce(p_attempts::text, 'NULL'), CASE WHEN p_error IS NULL THEN 'NULL' ELSE 'an error' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  INSERT INTO {{schema}}.dead_letters AS d (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error)
  SELECT p_consumer, p_stream, e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at, p_attempts, pg_catalog.left(p_error, 8192)
    FROM {{schema}}.events e
   WHERE e.seq = p_seq AND e.stream = p_stream
  ON CONFLICT (consumer, stream, seq) DO UPDATE
     SET attempts = d.attempts + excluded.attempts, last_error = excluded.last_error,
         dead_at = pg_catalog.now(), replay_requested_at = NULL
  RETURNING d.id INTO v_id;
  IF v_id IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: stream % has no event %', pg_catalog.quote_literal(p_stream), p_seq
      USING ERRCODE = 'TM005';
  END IF;
  PERFORM {{schema}}.advance_cursor(p_consumer, p_stream, p_seq);
  RETURN v_id;
END
$$;

-- Consumer roles get the dead letters of their consumers (row-level
-- security above); the owner keeps full rights.
CREATE OR REPLACE FUNCTION {{schema}}.grant_consumer(p_role text, p_consumers text[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_consumers IS NULL OR pg_catalog.cardinality(p_consumers) = 0 THEN
    RAISE EXCEPTION 'grant_consumer: name the consumers % may use, e.g. ARRAY[''billing'']', p_role
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA {{schema}} TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT ON {{schema}}.events, {{schema}}.watermark, {{schema}}.horizons TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT ON {{schema}}.consumer_grants TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON {{schema}}.cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (seq, updated_at, resync_count, last_resync_at) ON {{schema}}.cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON {{schema}}.dead_letters TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (attempts, last_error, dead_at, replay_requested_at) ON {{schema}}.dead_letters TO %I', p_role);
  INSERT INTO {{schema}}.consumer_grants (role_id, consumer)
  SELECT r.oid, c FROM pg_catalog.pg_roles r, pg_catalog.unnest(p_consumers) AS c
   WHERE r.rolname = p_role
  ON CONFLICT DO NOTHING;
END
$$;

-- Roles granted before this version get the same rights on dead letters.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT DISTINCT ro.rolname FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles ro ON ro.oid = g.role_id LOOP
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON {{schema}}.dead_letters TO %I', r.rolname);
    EXECUTE pg_catalog.format('GRANT UPDATE (attempts, last_error, dead_at, replay_requested_at) ON {{schema}}.dead_letters TO %I', r.rolname);
  END LOOP;
END
$$;
