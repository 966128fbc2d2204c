-- tidemark schema, version 17: re-partitioning a consumer group at a
-- barrier seq (docs/PROTOCOL.md section 6.6).
-- Placeholders: {{schema}} (quoted identifier).
--
-- A group's partition count changes only here, in two steps:
--
-- - repartition_group(consumer, stream, partitions) asks for the new
--   count: it records it with a barrier, the safe_seq of the moment. From
--   then on a page of the old split reads no event above the barrier
--   (lock_partition caps its safe_seq there), so the old partitions drain
--   up to the barrier and stop.
-- - finish_repartition(consumer, stream) switches, once every old
--   partition has applied its events up to the barrier and no page of the
--   group is open: every partition cursor of the new split starts at the
--   barrier, under the new count. An event at or below the barrier was
--   applied under the old split, one above it is applied under the new:
--   each once, and a key's events in order (its events up to the barrier
--   were all applied before any of its later ones can be read).
--
-- A page that began before the barrier was recorded does not see it and
-- may read past it; the switch then raises the barrier to the highest
-- cursor and waits for the other partitions to drain up to that.

ALTER TABLE {{schema}}.groups
  ADD COLUMN next_partitions integer CHECK (next_partitions BETWEEN 1 AND 1024),
  ADD COLUMN barrier bigint CHECK (barrier >= 0),
  -- Where the current split began: 0, or the barrier of the last switch.
  ADD COLUMN since_seq bigint NOT NULL DEFAULT 0 CHECK (since_seq >= 0),
  ADD COLUMN repartitioned_at timestamptz,
  ADD CONSTRAINT groups_repartition_pending CHECK ((next_partitions IS NULL) = (barrier IS NULL));

-- The count changes only by the switch: to the count asked for, with
-- nothing pending after it.
CREATE OR REPLACE FUNCTION {{schema}}.group_partitions_fixed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.partitions IS DISTINCT FROM OLD.partitions
     AND (OLD.next_partitions IS DISTINCT FROM NEW.partitions OR NEW.next_partitions IS NOT NULL) THEN
    RAISE EXCEPTION 'tidemark: the group of consumer % on stream % has % partitions: the count changes only by repartition_group and finish_repartition', pg_catalog.quote_literal(OLD.consumer), pg_catalog.quote_literal(OLD.stream), OLD.partitions
      USING ERRCODE = 'TM007';
  END IF;
  RETURN NEW;
END
$$;

-- The state of a group's re-partition, as repartition_group and
-- finish_repartition return it.
CREATE TYPE {{schema}}.repartition_state AS (
  partitions integer,        -- the count now
  next_partitions integer,   -- the count asked for (NULL: nothing pending)
  barrier bigint,            -- the old split's pages read up to here
  since_seq bigint,          -- where the current split began
  behind integer             -- old partitions with events still to apply up to the barrier
);

-- Switches the group of (consumer, stream) to the count asked for, if it
-- can now: every old partition's events up to the barrier applied. Waits
-- for the pages of the group open now (each holds its partition's row
-- until it ends; the caller's lock_timeout bounds the wait) and holds
-- every partition row meanwhile, so no page runs beside the switch.
-- Returns the state after (next_partitions NULL: switched, or nothing was
-- pending; behind NULL: not every row could be held, call again). The
-- schema owner's call, like repartition_group.
--
-- Lock order: the partition rows, then the groups row, then (for the
-- switch only) the group's advisory lock. Pages hold one row each and wait
-- for no other; beats pass over locked rows and take the advisory lock
-- only; repartition_group takes only the groups row: no cycle.
CREATE FUNCTION {{schema}}.finish_repartition(p_consumer text, p_stream text) RETURNS {{schema}}.repartition_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  g record;
  r record;
  v_state {{schema}}.repartition_state;
  v_rows integer;
  v_held integer;
  v_max bigint;
  v_min bigint;
  v_pruned bigint;
  v_barrier bigint;
  v_behind boolean;
BEGIN
  PERFORM {{schema}}.checked_cursor_key('finish_repartition', p_consumer, p_stream);
  IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'tidemark: finish_repartition must run in a READ COMMITTED transaction (it reads the partitions'' latest cursors), not %', pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003';
  END IF;
  SELECT x.next_partitions INTO g FROM {{schema}}.groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: finish_repartition: consumer % on stream % is not a group', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007';
  END IF;
  IF g.next_partitions IS NOT NULL THEN
    -- Every partition row, locked in partition order, waiting for the
    -- page that holds one. In READ COMMITTED the rows locked are their
    -- latest versions.
    PERFORM FROM {{schema}}.partition_cursors x
      WHERE x.consumer = p_consumer AND x.stream = p_stream
      ORDER BY x.partition
        FOR NO KEY UPDATE;
  END IF;
  -- The group's row: one re-partition request or switch at a time, and
  -- what is pending read again under it (a request may have committed
  -- since the read above, which saw none and locked nothing).
  SELECT x.partitions, x.next_partitions, x.barrier, x.since_seq INTO g FROM {{schema}}.groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream
     FOR NO KEY UPDATE;
  v_state := ROW(g.partitions, g.next_partitions, g.barrier, g.since_seq, 0);
  IF g.next_partitions IS NULL THEN
    RETURN v_state;
  END IF;
  -- Every row of the group held by this transaction now (rows it locked
  -- above come back; an unlocked one is locked here; one a page holds is
  -- skipped): otherwise a page may be open, and the switch waits for a
  -- later call (the first review of section 6.6: a request committed
  -- between the first read and this one left the rows unlocked, and the
  -- switch wrote the barrier over a page's newer cursor).
  SELECT pg_catalog.count(*)::integer INTO v_rows FROM {{schema}}.partition_cursors x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  SELECT pg_catalog.count(*)::integer INTO v_held FROM (
    SELECT 1 FROM {{schema}}.partition_cursors x
     WHERE x.consumer = p_consumer AND x.stream = p_stream
       FOR NO KEY UPDATE SKIP LOCKED) l;
  IF v_held < v_rows THEN
    v_state.behind := NULL;
    RETURN v_state;
  END IF;
  SELECT pg_catalog.max(x.seq), pg_catalog.min(x.seq) INTO v_max, v_min FROM {{schema}}.partition_cursors x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  -- A partition whose events retention removed before it applied them
  -- must resync (TM002), as its pages say: the switch would move its
  -- cursor past the loss in silence (the first review).
  SELECT h.pruned_through_seq INTO v_pruned FROM {{schema}}.horizons h WHERE h.stream = p_stream;
  IF v_pruned > v_min THEN
    RAISE EXCEPTION 'tidemark: finish_repartition: retention removed events of stream % above a partition cursor of consumer % (cursor %, pruned through %)',
        pg_catalog.quote_literal(p_stream), pg_catalog.quote_literal(p_consumer), v_min, v_pruned
      USING ERRCODE = 'TM002',
            HINT = 'Stop the members, rebuild from a bootstrap snapshot (tail --partitions N --bootstrap), then finish or cancel the re-partition.';
  END IF;
  -- A page that began before the barrier was recorded may have read past
  -- it: the new split then starts at its cursor, and every other old
  -- partition drains up to there first.
  v_barrier := GREATEST(g.barrier, v_max);
  IF v_barrier > g.barrier THEN
    UPDATE {{schema}}.groups x SET barrier = v_barrier
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
    v_state.barrier := v_barrier;
  END IF;
  -- Which old partitions still have events to apply up to the barrier.
  -- Every event at or below it is final: the barrier is a safe_seq, or a
  -- cursor, which never passes one. (No advisory lock yet: beats go on.)
  FOR r IN SELECT x.partition, x.seq FROM {{schema}}.partition_cursors x
            WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.seq < v_barrier LOOP
    EXECUTE pg_catalog.format(
      'SELECT EXISTS (SELECT 1 FROM {{schema}}.events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4)', {{schema}}.partition_expression('e.key', g.partitions))
      INTO v_behind
      USING p_stream, r.seq, v_barrier, r.partition::pg_catalog.int8;
    IF v_behind THEN
      v_state.behind := v_state.behind + 1;
    END IF;
  END LOOP;
  IF v_state.behind > 0 THEN
    RETURN v_state;
  END IF;
  -- The switch, under the group's advisory lock: no beat decides from the
  -- old split meanwhile.
  PERFORM pg_catalog.pg_advisory_xact_lock({{schema}}.partition_key(p_consumer, p_stream, -1));

  -- The switch. Every cursor starts at the barrier. A partition number
  -- keeps a live holder (the split gives partition p to live member
  -- number p % count whatever the count); one whose holder's lease ended
  -- is freed (the COMMIT fence of section 6.4 refuses to move the cursor
  -- of a holder whose lease ended). Partitions beyond the new count go,
  -- their change-of-hands count added to a remaining one's (the group's
  -- total stays); new ones start free.
  IF g.next_partitions < g.partitions THEN
    UPDATE {{schema}}.partition_cursors pc SET moves = pc.moves + d.moves
      FROM (SELECT x.partition % g.next_partitions AS partition, pg_catalog.sum(x.moves)::bigint AS moves
              FROM {{schema}}.partition_cursors x
             WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.partition >= g.next_partitions
             GROUP BY 1) d
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = d.partition;
    DELETE FROM {{schema}}.partition_cursors pc
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition >= g.next_partitions;
  END IF;
  UPDATE {{schema}}.partition_cursors pc
     SET seq = v_barrier, updated_at = pg_catalog.now(),
         holder = CASE WHEN EXISTS (SELECT 1 FROM {{schema}}.group_members m
                                     WHERE m.consumer = pc.consumer AND m.stream = pc.stream AND m.member = pc.holder
                                       AND m.lease_expires_at > pg_catalog.clock_timestamp()) THEN pc.holder END
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream;
  INSERT INTO {{schema}}.partition_cursors (consumer, stream, partition, seq)
  SELECT p_consumer, p_stream, p, v_barrier FROM pg_catalog.generate_series(g.partitions, g.next_partitions - 1) p;
  UPDATE {{schema}}.groups x
     SET partitions = g.next_partitions, next_partitions = NULL, barrier = NULL,
         since_seq = v_barrier, repartitioned_at = pg_catalog.now()
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  -- The group's dead letters belong to their key's partition of the new
  -- split: its holder replays them. Each is at or below its old
  -- partition's cursor, so at or below the barrier, where every new
  -- cursor starts.
  UPDATE {{schema}}.dead_letters d SET partition = {{schema}}.key_partition(d.key, g.next_partitions)
   WHERE d.consumer = p_consumer AND d.stream = p_stream AND d.partition IS NOT NULL;
  RETURN ROW(g.next_partitions, NULL, NULL, v_barrier, 0)::{{schema}}.repartition_state;
END
$$;

-- Asks for the group of (consumer, stream) to have p_partitions
-- partitions: records the count and the barrier (safe_seq now); the switch
-- is finish_repartition's, called after this commits. Asked again with another count while one is pending, it changes the
-- count asked for (the barrier stays); with the current count, it cancels
-- the pending one (nothing was moved: the old split just reads on). The
-- schema's owner's call (it is not granted to members).
CREATE FUNCTION {{schema}}.repartition_group(p_consumer text, p_stream text, p_partitions integer) RETURNS {{schema}}.repartition_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  g record;
  v_safe bigint;
BEGIN
  PERFORM {{schema}}.checked_cursor_key('repartition_group', p_consumer, p_stream);
  IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: repartition_group: partitions must be between 1 and 1024, got %', coalesce(p_partitions::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- The groups row serialises requests and switches (finish_repartition
  -- takes it after the partition rows, and this takes no other lock).
  SELECT x.partitions, x.next_partitions, x.barrier INTO g FROM {{schema}}.groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream
     FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: repartition_group: consumer % on stream % is not a group', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007',
            HINT = 'A group is created by its first member (tail --partitions N, StreamClient.tailGroup, group_beat).';
  END IF;
  IF p_partitions = g.partitions THEN
    UPDATE {{schema}}.groups x SET next_partitions = NULL, barrier = NULL
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  ELSIF g.next_partitions IS NOT NULL THEN
    UPDATE {{schema}}.groups x SET next_partitions = p_partitions
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  ELSE
    SELECT w.safe_seq INTO v_safe FROM {{schema}}.watermark w;
    UPDATE {{schema}}.groups x SET next_partitions = p_partitions, barrier = v_safe
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  END IF;
  RETURN (SELECT ROW(x.partitions, x.next_partitions, x.barrier, x.since_seq, NULL)::{{schema}}.repartition_state
            FROM {{schema}}.groups x WHERE x.consumer = p_consumer AND x.stream = p_stream);
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.repartition_group(text, text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.finish_repartition(text, text) FROM PUBLIC;

-- Creates the group of (consumer, stream) with p_partitions partitions,
-- every cursor at 0, unless it exists; the caller holds the group's
-- advisory lock (group_beat, lock_group). A consumer's own cursor of the
-- same name would be a second position of the same consumer: refused. The
-- cursor's lock key makes a tailer creating that cursor meanwhile wait (or
-- fail).
CREATE FUNCTION {{schema}}.create_group(p_function text, p_consumer text, p_stream text, p_partitions integer) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key(p_function, p_consumer, p_stream);
  v_partitions integer;
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.groups g WHERE g.consumer = p_consumer AND g.stream = p_stream) THEN
    RETURN;
  END IF;
  IF NOT pg_catalog.pg_try_advisory_xact_lock(v_key)
     OR EXISTS (SELECT 1 FROM {{schema}}.cursors c WHERE c.consumer = p_consumer AND c.stream = p_stream) THEN
    RAISE EXCEPTION 'tidemark: %: consumer % on stream % already has a cursor of its own: a group needs a consumer name of its own', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007';
  END IF;
  INSERT INTO {{schema}}.groups (consumer, stream, partitions) VALUES (p_consumer, p_stream, p_partitions)
  ON CONFLICT DO NOTHING;
  SELECT g.partitions INTO v_partitions FROM {{schema}}.groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: %: the group of consumer % on stream % exists but this role may not use it', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'insufficient_privilege',
            HINT = 'The owner grants consumers with SELECT tidemark.grant_consumer(role, ARRAY[consumer]).';
  END IF;
  INSERT INTO {{schema}}.partition_cursors (consumer, stream, partition)
  SELECT p_consumer, p_stream, p FROM pg_catalog.generate_series(0, v_partitions - 1) p
  ON CONFLICT DO NOTHING;
END
$$;

-- Bootstrap of a group (docs/PROTOCOL.md section 7): in the REPEATABLE
-- READ transaction of the snapshot, creates the group (p_partitions) if it
-- is new, and locks every partition row until the transaction ends, so
-- that set_group_cursors moves them all to the snapshot's seq at its
-- commit. Refused while a member's lease is live (TM001: stop the members
-- first, as a consumer's own bootstrap is refused while a tailer holds its
-- cursor), while a page of the group is open (55P03), with another count
-- than the group's (TM007), and while a re-partition is pending (TM007).
-- Returns the lowest cursor before.
CREATE FUNCTION {{schema}}.lock_group(p_consumer text, p_stream text, p_partitions integer) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  g record;
  v_member text;
  v_prior bigint;
BEGIN
  PERFORM {{schema}}.checked_cursor_key('lock_group', p_consumer, p_stream);
  IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: lock_group: partitions must be between 1 and 1024, got %', coalesce(p_partitions::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF pg_catalog.current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN
    RAISE EXCEPTION 'tidemark: lock_group must run in the REPEATABLE READ transaction of the snapshot, not %', pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003';
  END IF;
  PERFORM pg_catalog.pg_advisory_xact_lock({{schema}}.partition_key(p_consumer, p_stream, -1));
  PERFORM {{schema}}.create_group('lock_group', p_consumer, p_stream, p_partitions);
  SELECT x.partitions, x.next_partitions INTO g FROM {{schema}}.groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  IF g.partitions <> p_partitions OR g.next_partitions IS NOT NULL THEN
    RAISE EXCEPTION 'tidemark: lock_group: the group of consumer % on stream % has % partitions, not %', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), g.partitions,
        p_partitions::text || CASE WHEN g.next_partitions IS NOT NULL THEN pg_catalog.format(' (a re-partition to %s is pending: finish or cancel it first)', g.next_partitions) ELSE '' END
      USING ERRCODE = 'TM007';
  END IF;
  -- The members' leases as they are now (by the clock, read in this
  -- snapshot: a member that joined since is refused at its first page,
  -- since it can take no locked row).
  SELECT m.member INTO v_member FROM {{schema}}.group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at > pg_catalog.clock_timestamp()
   ORDER BY m.member LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'tidemark: lock_group: member % of the group of consumer % on stream % holds a live lease: stop the members first', pg_catalog.quote_literal(v_member), pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM001';
  END IF;
  SELECT pg_catalog.min(l.seq) INTO v_prior FROM (
    SELECT x.seq FROM {{schema}}.partition_cursors x
     WHERE x.consumer = p_consumer AND x.stream = p_stream
     ORDER BY x.partition
       FOR NO KEY UPDATE NOWAIT) l;
  PERFORM pg_catalog.set_config('tidemark.group_locked', {{schema}}.checked_cursor_key('lock_group', p_consumer, p_stream)::text, true);
  RETURN v_prior;
END
$$;

-- Bootstrap's commit for a group: every partition cursor to p_seq (the
-- snapshot's point), free, in the transaction lock_group locked them in.
CREATE FUNCTION {{schema}}.set_group_cursors(p_consumer text, p_stream text, p_seq bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key('set_group_cursors', p_consumer, p_stream);
BEGIN
  -- Only in lock_group's transaction, which locked the rows.
  IF pg_catalog.current_setting('tidemark.group_locked', true) IS DISTINCT FROM v_key::text THEN
    RAISE EXCEPTION 'tidemark: set_group_cursors: the group of consumer % on stream % was not locked in this transaction', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM004',
            HINT = 'Call lock_group first, in the same REPEATABLE READ transaction as the snapshot.';
  END IF;
  IF p_seq IS NULL OR p_seq < 0 THEN
    RAISE EXCEPTION 'tidemark: set_group_cursors: seq must be 0 or more, got %', coalesce(p_seq::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  UPDATE {{schema}}.partition_cursors pc SET seq = p_seq, holder = NULL, updated_at = pg_catalog.now()
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream;
END
$$;

-- group_beat (version 15), but a member with a live lease is let in whatever
-- count it gives, and one may join with a pending re-partition's count.
CREATE OR REPLACE FUNCTION {{schema}}.group_beat(p_consumer text, p_stream text, p_partitions integer, p_member text, p_ttl_ms integer)
RETURNS TABLE (partition integer, seq bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key('group_beat', p_consumer, p_stream);
  v_member text := {{schema}}.checked_member('group_beat', p_member);
  v_partitions integer;
  v_next integer;
  v_since bigint;
  v_now timestamptz;
  v_members text[];
  v_count integer;
  v_index integer;
BEGIN
  IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: group_beat: partitions must be between 1 and 1024, got %', coalesce(p_partitions::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_ttl_ms IS NULL OR p_ttl_ms < 100 OR p_ttl_ms > 3600000 THEN
    RAISE EXCEPTION 'tidemark: group_beat: ttl_ms must be between 100 and 3600000, got %', coalesce(p_ttl_ms::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- One beat of a group at a time: each decides from the members and
  -- holders as the one before left them (a transaction-level advisory lock
  -- of the group: a consumer role may not lock the groups row itself).
  PERFORM pg_catalog.pg_advisory_xact_lock({{schema}}.partition_key(p_consumer, p_stream, -1));
  SELECT g.partitions, g.next_partitions, g.since_seq INTO v_partitions, v_next, v_since FROM {{schema}}.groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  IF NOT FOUND THEN
    PERFORM {{schema}}.create_group('group_beat', p_consumer, p_stream, p_partitions);
    SELECT g.partitions INTO v_partitions FROM {{schema}}.groups g
     WHERE g.consumer = p_consumer AND g.stream = p_stream;
  END IF;
  -- A member joins with the group's count, or with the count a pending
  -- re-partition asks for (version 17); one already in (a live lease)
  -- follows the group whatever count it was started with, so that a
  -- re-partition goes on under running members.
  IF p_partitions <> v_partitions AND p_partitions IS DISTINCT FROM v_next
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.group_members m
                      WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member = v_member
                        AND m.lease_expires_at > pg_catalog.clock_timestamp()) THEN
    RAISE EXCEPTION 'tidemark: group_beat: the group of consumer % on stream % has % partitions, not %', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_partitions, p_partitions::text ||
        CASE WHEN v_next IS NOT NULL THEN pg_catalog.format(' (a re-partition to %s is pending)', v_next)
             WHEN v_since > 0 THEN pg_catalog.format(' (re-partitioned at seq %s)', v_since)
             ELSE '' END
      USING ERRCODE = 'TM007',
            HINT = 'Start every member with the group''s partition count; tidemark group repartition changes it.';
  END IF;

  v_now := pg_catalog.clock_timestamp();
  INSERT INTO {{schema}}.group_members AS m (consumer, stream, member, ttl_ms, lease_expires_at)
  VALUES (p_consumer, p_stream, v_member, p_ttl_ms, v_now + p_ttl_ms * interval '1 millisecond')
  ON CONFLICT (consumer, stream, member) DO UPDATE
    SET ttl_ms = excluded.ttl_ms, lease_expires_at = excluded.lease_expires_at;
  -- Members whose lease ended hold nothing any more (below): forget them.
  DELETE FROM {{schema}}.group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at <= v_now;

  SELECT pg_catalog.array_agg(m.member ORDER BY m.member COLLATE "C") INTO v_members
    FROM {{schema}}.group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream;
  v_count := pg_catalog.cardinality(v_members);
  v_index := pg_catalog.array_position(v_members, v_member) - 1;

  -- Give up the partitions that are another member's now. One that a page
  -- of this member has open stays until the next beat (the page holds its
  -- row, and its commit still counts: the member holds it until then).
  UPDATE {{schema}}.partition_cursors pc
     SET holder = NULL, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM {{schema}}.partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.holder = v_member
             AND x.partition % v_count <> v_index
             FOR NO KEY UPDATE SKIP LOCKED);

  -- Take this member's own partitions that are free, or whose holder's
  -- lease ended (it is no live member). One whose row a page still holds
  -- (that page's member was alive when it read) is taken at a later beat:
  -- the page ends by its commit, its rollback, or the idle timeout its
  -- read set.
  UPDATE {{schema}}.partition_cursors pc
     SET holder = v_member, moves = pc.moves + 1, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM {{schema}}.partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream
             AND x.partition % v_count = v_index
             AND x.holder IS DISTINCT FROM v_member
             AND (x.holder IS NULL OR x.holder <> ALL (v_members))
             FOR NO KEY UPDATE SKIP LOCKED);

  RETURN QUERY
    SELECT pc.partition, pc.seq FROM {{schema}}.partition_cursors pc
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.holder = v_member
     ORDER BY pc.partition;
END
$$;

-- lock_partition (version 15), with a pending re-partition's barrier as
-- the page's upper bound.
CREATE OR REPLACE FUNCTION {{schema}}.lock_partition(p_function text, p_consumer text, p_stream text, p_partition integer, p_member text,
  OUT key bigint, OUT cursor bigint, OUT safe_seq bigint, OUT partitions integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_member text := {{schema}}.checked_member(p_function, p_member);
  v_holder text;
  v_ttl_ms integer;
  v_live integer;
  v_index integer;
  v_page jsonb;
  v_pruned bigint;
  v_barrier bigint;
BEGIN
  PERFORM {{schema}}.checked_cursor_key(p_function, p_consumer, p_stream);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: %: partition must be 0 or more, got %', p_function, coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  key := {{schema}}.partition_key(p_consumer, p_stream, p_partition);
  v_page := {{schema}}.open_page(key);
  IF (v_page ->> 2)::bigint < (v_page ->> 4)::bigint THEN
    RAISE EXCEPTION 'tidemark: %: this transaction read partition % of consumer % on stream % up to seq % and advanced only to seq %', p_function, p_partition,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_page ->> 4, v_page ->> 2
      USING ERRCODE = 'TM006',
            HINT = 'Advance past the events the page returned (advance_partition) before reading the next page in the same transaction.';
  END IF;
  IF pg_catalog.current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN
    RAISE EXCEPTION 'tidemark: % must run in a REPEATABLE READ transaction, not %', p_function, pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003',
            HINT = 'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM read_partition_page(...); apply the events; SELECT advance_partition(...); COMMIT;';
  END IF;
  -- Held by this member, under a live lease, and still its own by the
  -- group's split (partition p to live member number p % count, by name):
  -- a member stops paging a partition that is another's now, so that its
  -- next beat can give it up (a beat skips the row of an open page). Read
  -- before locking, so a member that is not the holder fails at once
  -- rather than waiting for the holder's page.
  -- The live members (as group_beat counts them): how many, this one's
  -- number among them by name, and its lease's TTL (NULL: not live).
  SELECT pg_catalog.count(*)::integer,
         (pg_catalog.count(*) FILTER (WHERE m.member COLLATE "C" < v_member COLLATE "C"))::integer,
         pg_catalog.max(m.ttl_ms) FILTER (WHERE m.member = v_member)
    INTO v_live, v_index, v_ttl_ms
    FROM {{schema}}.group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at > pg_catalog.clock_timestamp();
  SELECT pc.holder INTO v_holder FROM {{schema}}.partition_cursors pc
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition;
  IF FOUND AND (v_holder IS DISTINCT FROM v_member OR v_ttl_ms IS NULL OR p_partition % v_live <> v_index) THEN
    RAISE EXCEPTION 'tidemark: %: partition % of consumer % on stream % is not held by member % under a live lease, or is another member''s now', p_function, p_partition,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), pg_catalog.quote_literal(v_member)
      USING ERRCODE = 'TM008',
            HINT = 'Renew the lease with group_beat, and page only the partitions it returns.';
  END IF;
  -- The row stays locked until the page ends: the holder cannot change
  -- under the page (group_beat skips a locked row).
  SELECT pc.seq, pc.holder, g.partitions, g.barrier INTO cursor, v_holder, partitions, v_barrier
    FROM {{schema}}.partition_cursors pc JOIN {{schema}}.groups g ON g.consumer = pc.consumer AND g.stream = pc.stream
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition
     FOR NO KEY UPDATE OF pc;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: %: consumer % on stream % has no partition % (no such group, or a group with fewer partitions)', p_function,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), p_partition
      USING ERRCODE = 'TM008',
            HINT = 'Join the group with group_beat, and page only the partitions it returns.';
  END IF;
  IF v_holder IS DISTINCT FROM v_member THEN
    RAISE EXCEPTION 'tidemark: %: partition % of consumer % on stream % is not held by member % under a live lease', p_function, p_partition,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), pg_catalog.quote_literal(v_member)
      USING ERRCODE = 'TM008',
            HINT = 'Renew the lease with group_beat, and page only the partitions it returns.';
  END IF;
  -- A member that stops with this page open loses it once its lease is
  -- over: the server ends the session, and the page's row lock with it.
  PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', v_ttl_ms::text, true);
  -- And one whose client stops reading (a result it never takes) is cut
  -- off by TCP once unacknowledged data waits that long.
  PERFORM pg_catalog.set_config('tcp_user_timeout', v_ttl_ms::text, true);
  SELECT w.safe_seq, h.pruned_through_seq INTO safe_seq, v_pruned
    FROM {{schema}}.watermark w LEFT JOIN {{schema}}.horizons h ON h.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: the watermark row is missing' USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  -- A re-partition is pending (version 17): the old split reads nothing
  -- above its barrier, which the new split starts from.
  -- Never below the cursor: a page that read past a barrier it did not
  -- see moved the cursor above it, and finish_repartition raises the
  -- barrier there (a bound below the cursor would refuse every advance).
  IF v_barrier < safe_seq THEN
    safe_seq := LEAST(safe_seq, GREATEST(v_barrier, cursor));
  END IF;
  IF v_pruned > cursor THEN
    RAISE EXCEPTION 'tidemark: retention removed events of stream % above partition % of consumer % (cursor %, pruned through %)',
        pg_catalog.quote_literal(p_stream), p_partition, pg_catalog.quote_literal(p_consumer), cursor, v_pruned
      USING ERRCODE = 'TM002',
            DETAIL = pg_catalog.format('cursor=%s pruned_through=%s', cursor, v_pruned),
            HINT = 'Nothing was delivered. Roll back, and rebuild the consumer from a bootstrap snapshot.';
  END IF;
END
$$;

-- read_partition_page (version 15): the page's memory keeps the published
-- safe_seq (what partition_page_info shows, and a member waits to pass)
-- when the barrier of a pending re-partition bounds the read, so that a
-- member whose partitions drained to the barrier waits for the next
-- publication instead of paging again at once.
CREATE OR REPLACE FUNCTION {{schema}}.read_partition_page(p_consumer text, p_stream text, p_partition integer, p_member text, p_max_events integer)
RETURNS TABLE (seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v record;
  v_count bigint;
  v_last bigint;
  v_through bigint;
  v_safe bigint;
  v_done text;
BEGIN
  IF p_max_events IS NULL OR p_max_events < 1 OR p_max_events > 100000 THEN
    RAISE EXCEPTION 'tidemark: read_partition_page: max_events must be between 1 and 100000, got %', coalesce(p_max_events::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO v FROM {{schema}}.lock_partition('read_partition_page', p_consumer, p_stream, p_partition, p_member);
  -- The count is a literal, so the group's partition index (when created)
  -- matches: one range scan.
  RETURN QUERY EXECUTE pg_catalog.format(
    'SELECT e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at FROM {{schema}}.events e
      WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4
      ORDER BY e.seq LIMIT $5', {{schema}}.partition_expression('e.key', v.partitions))
    USING p_stream, v.cursor, v.safe_seq, p_partition::pg_catalog.int8, p_max_events;
  GET DIAGNOSTICS v_count = ROW_COUNT;
  IF v_count = 0 THEN
    v_last := v.cursor;
    -- Nothing of this partition up to safe_seq: the cursor may go there.
    -- Retention's horizon is the stream's, so a partition whose keys are
    -- quiet must not stay behind the others' events, or it would be told
    -- to resync for events that were never its own. At most every 10 s
    -- (an empty page is the common case of a woken partition), in the
    -- page's transaction: it commits with the page, under the same fence.
    UPDATE {{schema}}.partition_cursors pc SET seq = v.safe_seq, updated_at = pg_catalog.now()
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition
       AND pc.seq = v.cursor AND v.safe_seq > v.cursor
       AND pc.updated_at < pg_catalog.now() - interval '10 seconds';
    IF FOUND THEN
      v.cursor := v.safe_seq;
      v_last := v.safe_seq;
    END IF;
  ELSE
    EXECUTE pg_catalog.format(
      'SELECT e.seq FROM {{schema}}.events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4
        ORDER BY e.seq OFFSET $5 LIMIT 1', {{schema}}.partition_expression('e.key', v.partitions))
      INTO v_last
      USING p_stream, v.cursor, v.safe_seq, p_partition::pg_catalog.int8, v_count - 1;
  END IF;
  -- A short page returned every event of the partition up to safe_seq.
  v_through := CASE WHEN v_count < p_max_events THEN v.safe_seq ELSE v_last END;
  SELECT w.safe_seq INTO v_safe FROM {{schema}}.watermark w;
  v_done := {{schema}}.remember_page(v.key, v.cursor, v_through, v_safe, v_last);
END
$$;
