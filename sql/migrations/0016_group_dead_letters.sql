-- tidemark schema, version 16: dead letters of consumer groups.
-- Placeholders: {{schema}} (quoted identifier).
--
-- A group member whose handler keeps failing on one event may set it aside
-- as a consumer's own tailer does (version 13, docs/PROTOCOL.md section
-- 6.3), in the page of the event's partition: record_partition_dead_letter
-- copies it into dead_letters and moves the partition's cursor past it
-- with advance_partition, so the record commits only with the cursor's
-- move, and only while the member holds the partition under a live lease
-- (the fence of section 6.4). A replay of a group's dead letter runs in a
-- transaction of the member that holds its partition (partition_replay),
-- fenced the same way: no two members deliver one partition's events at
-- once, replays included.

-- The partition of a group's dead letter (NULL: a consumer's own cursor's).
ALTER TABLE {{schema}}.dead_letters ADD COLUMN partition integer CHECK (partition >= 0);

-- Dead letters of a group filed before this version (by hand: nothing
-- recorded them) get their partition, so that their holder replays them.
UPDATE {{schema}}.dead_letters d SET partition = {{schema}}.key_partition(d.key, g.partitions)
  FROM {{schema}}.groups g
 WHERE g.consumer = d.consumer AND g.stream = d.stream AND d.partition IS NULL;

-- The partition, like the event's content, is never taken from the insert:
-- it is the event's key's partition in the consumer's group, if the
-- consumer is a group.
CREATE OR REPLACE FUNCTION {{schema}}.dead_letter_is_the_event() RETURNS trigger
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
  NEW.partition := NULL;
  SELECT {{schema}}.key_partition(NEW.key, g.partitions) INTO NEW.partition
    FROM {{schema}}.groups g
   WHERE g.consumer = NEW.consumer AND g.stream = NEW.stream;
  -- A group's dead letter is an event its partition's cursor has passed
  -- (record_partition_dead_letter moves the cursor first): one above it
  -- would be delivered by a page, then again by a replay.
  IF NEW.partition IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM {{schema}}.partition_cursors pc
        WHERE pc.consumer = NEW.consumer AND pc.stream = NEW.stream AND pc.partition = NEW.partition AND pc.seq >= NEW.seq) THEN
    RAISE EXCEPTION 'tidemark: event % of stream % is above the cursor of partition % of consumer %: a page delivers it, so it cannot be a dead letter', NEW.seq,
        pg_catalog.quote_literal(NEW.stream), NEW.partition, pg_catalog.quote_literal(NEW.consumer)
      USING ERRCODE = 'TM005';
  END IF;
  RETURN NEW;
END
$$;

-- record_dead_letter for one partition of a group: event p_seq, the
-- partition's next event above its cursor in the partition page open in
-- this transaction, recorded as a dead letter, and the partition's cursor
-- moved past it by advance_partition (its fence: TM008 when p_member does
-- not hold the partition under a live lease). Returns the dead letter's id.
-- An event already dead for this group has its tries, error and time
-- updated, and any replay request cleared.
CREATE FUNCTION {{schema}}.record_partition_dead_letter(p_consumer text, p_stream text, p_partition integer, p_member text,
  p_seq bigint, p_attempts integer, p_error text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_page jsonb;
  v_partitions integer;
  v_before boolean;
  v_id bigint;
BEGIN
  PERFORM {{schema}}.checked_cursor_key('record_partition_dead_letter', p_consumer, p_stream);
  PERFORM {{schema}}.checked_member('record_partition_dead_letter', p_member);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: partition must be 0 or more, got %', coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_page := {{schema}}.open_page({{schema}}.partition_key(p_consumer, p_stream, p_partition));
  IF v_page IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: no page of partition % of consumer % on stream % was read in this transaction', p_partition,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM004',
            HINT = 'Call read_partition_page first, in the same REPEATABLE READ transaction, then record_partition_dead_letter, then advance_partition.';
  END IF;
  IF p_seq IS NULL OR p_seq <= (v_page ->> 2)::bigint OR p_seq > (v_page ->> 1)::bigint THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: seq % is not an event of this page above the cursor (at %, the page reaches %)',
        coalesce(p_seq::text, 'NULL'), v_page ->> 2, v_page ->> 1
      USING ERRCODE = 'TM005';
  END IF;
  IF p_attempts IS NULL OR p_attempts < 1 OR p_error IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: attempts must be at least 1 and the error given (got %, %)',
        coalesce(p_attempts::text, 'NULL'), CASE WHEN p_error IS NULL THEN 'NULL' ELSE 'an error' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- The page was read, so the group exists (read_partition_page locked its
  -- partition's row).
  SELECT g.partitions INTO v_partitions FROM {{schema}}.groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  -- The event is this partition's, and its next one above the cursor (the
  -- events before it applied and advanced past): one range scan of the
  -- partition index when it exists.
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.events e
                  WHERE e.stream = p_stream AND e.seq = p_seq
                    AND {{schema}}.key_partition(e.key, v_partitions) = p_partition) THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: seq % is not an event of partition % of stream %', p_seq, p_partition, pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM005';
  END IF;
  EXECUTE pg_catalog.format(
    'SELECT EXISTS (SELECT 1 FROM {{schema}}.events e
      WHERE e.stream = $1 AND e.seq > $2 AND e.seq < $3 AND %s = $4)', {{schema}}.partition_expression('e.key', v_partitions))
    INTO v_before
    USING p_stream, (v_page ->> 2)::bigint, p_seq, p_partition::pg_catalog.int8;
  IF v_before THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: seq % is not the next event of partition % above its cursor (at %): apply the events before it and advance past them first', p_seq, p_partition, v_page ->> 2
      USING ERRCODE = 'TM005';
  END IF;
  -- The cursor's move first: the fence (refused, and the transaction with
  -- it, unless p_member holds the partition under a live lease), and the
  -- dead letter is then at the cursor, as the insert's trigger requires.
  PERFORM {{schema}}.advance_partition(p_consumer, p_stream, p_partition, p_member, p_seq);
  INSERT INTO {{schema}}.dead_letters AS d (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error)
  SELECT p_consumer, p_stream, e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at, p_attempts, pg_catalog.left(p_error, 8192)
    FROM {{schema}}.events e
   WHERE e.seq = p_seq AND e.stream = p_stream
  ON CONFLICT (consumer, stream, seq) DO UPDATE
     SET attempts = d.attempts + excluded.attempts, last_error = excluded.last_error,
         dead_at = pg_catalog.now(), replay_requested_at = NULL
  RETURNING d.id INTO v_id;
  RETURN v_id;
END
$$;

-- The next dead letter of partition p_partition asked to be replayed (not
-- one of p_tried), locked for this transaction, which replays it: deletes
-- it in the handler's transaction, or notes a failed try. The transaction
-- holds the partition as a page does (lock_partition: held by p_member
-- under a live lease, its cursor row locked until the transaction ends,
-- the idle timeout set to the lease TTL), and commits only while the lease
-- lasts (the COMMIT fence of partition_cursors, armed by writing the
-- cursor's own value back). Only dead letters at or below the partition's
-- cursor: one above it is delivered again by the pages.
CREATE FUNCTION {{schema}}.partition_replay(p_consumer text, p_stream text, p_partition integer, p_member text, p_tried bigint[])
RETURNS TABLE (id bigint, attempts integer, seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v record;
BEGIN
  SELECT * INTO v FROM {{schema}}.lock_partition('partition_replay', p_consumer, p_stream, p_partition, p_member);
  UPDATE {{schema}}.partition_cursors pc SET seq = pc.seq
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition;
  RETURN QUERY
    SELECT d.id, d.attempts, d.seq, d.kind, d.key, d.payload, d.headers, d.occurred_at
      FROM {{schema}}.dead_letters d
     WHERE d.consumer = p_consumer AND d.stream = p_stream AND d.partition = p_partition
       AND d.replay_requested_at IS NOT NULL AND d.seq <= v.cursor
       AND d.id <> ALL (coalesce(p_tried, '{}'::pg_catalog.int8[]))
     ORDER BY d.seq
     LIMIT 1
       FOR UPDATE OF d SKIP LOCKED;
END
$$;

-- How long until the first lease of another member of the group ends, in
-- milliseconds (negative: ended; NULL: no other member). A member beats
-- again then when that is sooner than its next beat, so that a dead
-- member's partitions move once its lease ends (docs/PROTOCOL.md 6.4).
CREATE FUNCTION {{schema}}.others_lease_end_ms(p_consumer text, p_stream text, p_member text) RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT pg_catalog.date_part('epoch', pg_catalog.min(m.lease_expires_at) - pg_catalog.clock_timestamp()) * 1000
            FROM {{schema}}.group_members m
           WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member <> p_member);
END
$$;
