-- tidemark schema, version 15: consumer groups in SQL, so that a process in
-- any language can be a member.
-- Placeholders: {{schema}} (quoted identifier).
--
-- A group is a consumer of a stream split into a fixed number of
-- partitions. An event's partition is key_partition(key, partitions): the
-- first four bytes of the MD5 digest of the key (its bytes in the database's
-- encoding) read as an unsigned big-endian 32-bit integer, modulo the
-- partition count. MD5 is one algorithm on every PostgreSQL version and
-- architecture, and any language can compute it; the tests pin fixed
-- vectors. Each partition has its own durable cursor (partition_cursors).
--
-- Members hold partitions by lease (docs/PROTOCOL.md section 6.4):
--
-- - group_beat(consumer, stream, partitions, member, ttl_ms) renews the
--   member's lease and rebalances: the live members, in name order, take
--   partition p to member number p % count. A member gives up the
--   partitions that are no longer its own, and takes its own only from a
--   holder whose lease ended (or that gave them up): a partition never has
--   two holders, and moves only after its old holder's lease ended.
-- - read_partition_page / advance_partition are read_page / advance_cursor
--   for one partition, in one REPEATABLE READ transaction. The page locks
--   the partition's cursor row until it ends, so the holder cannot change
--   under it, and it commits its cursor only while its member holds the
--   partition under a live lease (a member whose lease ended is fenced).
--   The page sets idle_in_transaction_session_timeout to the member's
--   lease TTL: a member that stops (SIGSTOP, a pause) with a page open
--   loses the page, and its row lock, once its lease is over.
--
-- A page of one partition is one index range scan when the partition index
-- for the group's count exists (partition_index_ddl(partitions) gives the
-- statement; it is not created here: it costs every append, and only
-- groups need it).

CREATE TABLE {{schema}}.groups (
  consumer    text NOT NULL CHECK (consumer <> '' AND pg_catalog.length(consumer) <= 200),
  stream      text NOT NULL CHECK (stream <> '' AND pg_catalog.length(stream) <= 200),
  partitions  integer NOT NULL CHECK (partitions BETWEEN 1 AND 1024),
  created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
  PRIMARY KEY (consumer, stream)
);

CREATE TABLE {{schema}}.group_members (
  consumer          text NOT NULL,
  stream            text NOT NULL,
  member            text NOT NULL CHECK (member <> '' AND pg_catalog.length(member) <= 200),
  ttl_ms            integer NOT NULL CHECK (ttl_ms BETWEEN 100 AND 3600000),
  lease_expires_at  timestamptz NOT NULL,
  joined_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
  PRIMARY KEY (consumer, stream, member),
  FOREIGN KEY (consumer, stream) REFERENCES {{schema}}.groups ON DELETE CASCADE
);

CREATE TABLE {{schema}}.partition_cursors (
  consumer    text NOT NULL,
  stream      text NOT NULL,
  partition   integer NOT NULL CHECK (partition >= 0),
  seq         bigint NOT NULL DEFAULT 0 CHECK (seq >= 0),
  -- The member that holds it; NULL: free to take.
  holder      text,
  -- How many times it changed hands (a rebalance count).
  moves       bigint NOT NULL DEFAULT 0,
  updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
  PRIMARY KEY (consumer, stream, partition),
  FOREIGN KEY (consumer, stream) REFERENCES {{schema}}.groups ON DELETE CASCADE
);

-- A consumer role sees and uses the groups of the consumers granted to it,
-- as with cursors.
ALTER TABLE {{schema}}.groups ENABLE ROW LEVEL SECURITY;
CREATE POLICY groups_granted_consumers ON {{schema}}.groups
  USING (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = groups.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
  WITH CHECK (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = groups.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));
ALTER TABLE {{schema}}.group_members ENABLE ROW LEVEL SECURITY;
CREATE POLICY group_members_granted_consumers ON {{schema}}.group_members
  USING (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = group_members.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
  WITH CHECK (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = group_members.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));
ALTER TABLE {{schema}}.partition_cursors ENABLE ROW LEVEL SECURITY;
CREATE POLICY partition_cursors_granted_consumers ON {{schema}}.partition_cursors
  USING (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = partition_cursors.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
  WITH CHECK (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = partition_cursors.consumer AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));

-- The partition of a key among p_partitions: the first four bytes of
-- MD5(key) as an unsigned big-endian integer, modulo p_partitions. In
-- JavaScript: createHash('md5').update(key).digest().readUInt32BE(0) % n.
CREATE FUNCTION {{schema}}.key_partition(p_key text, p_partitions integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: key_partition: partitions must be between 1 and 1024, got %', p_partitions
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN (('x' || pg_catalog.substr(pg_catalog.md5(p_key), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 % p_partitions)::integer;
END
$$;

-- The statement that creates the index a group of p_partitions pages
-- with: one index range scan per page of a partition. Run it (it is
-- CONCURRENTLY: outside a transaction block) as the table's owner. The
-- page's query repeats its expression exactly, which is how the planner
-- matches it.
CREATE FUNCTION {{schema}}.partition_index_ddl(p_partitions integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: partition_index_ddl: partitions must be between 1 and 1024, got %', p_partitions
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN pg_catalog.format(
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON {{schema}}.events (stream, %s, seq)',
    'events_partition_' || p_partitions, {{schema}}.partition_expression('key', p_partitions));
END
$$;

-- Whether the group index of p_partitions exists, and is valid (a
-- CONCURRENTLY build that was cancelled leaves an invalid one), with the
-- statement that creates it.
CREATE FUNCTION {{schema}}.partition_index_state(p_partitions integer, OUT ddl text, OUT present boolean, OUT valid boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  ddl := {{schema}}.partition_index_ddl(p_partitions);
  SELECT true, i.indisvalid INTO present, valid
    FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
   WHERE c.relname = 'events_partition_' || p_partitions::text
     AND c.relnamespace = '{{schema}}'::pg_catalog.regnamespace;
  present := coalesce(present, false);
  valid := coalesce(valid, false);
END
$$;

-- The partition expression over column p_column, with the count as a
-- literal (an index matches only the same constant).
CREATE FUNCTION {{schema}}.partition_expression(p_column text, p_partitions integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- Every name qualified, the type of the literal too: the index's DDL
  -- runs on its owner's search_path (a text domain there would otherwise
  -- become part of the index).
  IF p_column NOT IN ('key', 'e.key') OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: partition_expression: over key or e.key with 1 to 1024 partitions, got % and %', pg_catalog.quote_literal(p_column), p_partitions
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN pg_catalog.format(
    '((((''x''::pg_catalog.text OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(%s), 1, 8))::pg_catalog.bit(32))::pg_catalog.int8 OPERATOR(pg_catalog.%%) (%s)::pg_catalog.int8))',
    p_column, p_partitions);
END
$$;

-- The page memory's key of a partition (the `tidemark.pages` setting of
-- read_page, section 6), distinct from every consumer's own key; partition
-- -1 is the group's: the advisory lock that serialises its beats.
CREATE FUNCTION {{schema}}.partition_key(p_consumer text, p_stream text, p_partition integer) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.hashtextextended(
    ('partition:' || p_partition::text || ':' || pg_catalog.length(p_consumer)::text || ':' || p_consumer || p_stream) COLLATE "C",
    (-8344625403455539058)::bigint);
END
$$;

CREATE FUNCTION {{schema}}.checked_member(p_function text, p_member text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_member IS NULL OR p_member = '' OR pg_catalog.length(p_member) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: member must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_member), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN p_member;
END
$$;

-- Renews p_member's lease on the group (consumer, stream), creating the
-- group (with p_partitions partitions, every cursor at 0) on first use, and
-- rebalances; returns the partitions p_member holds now, with their
-- cursors. A group of another partition count is refused (TM007).
CREATE FUNCTION {{schema}}.group_beat(p_consumer text, p_stream text, p_partitions integer, p_member text, p_ttl_ms integer)
RETURNS TABLE (partition integer, seq bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key('group_beat', p_consumer, p_stream);
  v_member text := {{schema}}.checked_member('group_beat', p_member);
  v_partitions integer;
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
  SELECT g.partitions INTO v_partitions FROM {{schema}}.groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  IF NOT FOUND THEN
    -- First use. A consumer's own cursor of the same name would be a
    -- second position of the same consumer: refused. The cursor's lock
    -- key makes a tailer creating that cursor meanwhile wait (or fail).
    IF NOT pg_catalog.pg_try_advisory_xact_lock(v_key)
       OR EXISTS (SELECT 1 FROM {{schema}}.cursors c WHERE c.consumer = p_consumer AND c.stream = p_stream) THEN
      RAISE EXCEPTION 'tidemark: group_beat: consumer % on stream % already has a cursor of its own: a group needs a consumer name of its own', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
        USING ERRCODE = 'TM007';
    END IF;
    INSERT INTO {{schema}}.groups (consumer, stream, partitions) VALUES (p_consumer, p_stream, p_partitions)
    ON CONFLICT DO NOTHING;
    SELECT g.partitions INTO v_partitions FROM {{schema}}.groups g
     WHERE g.consumer = p_consumer AND g.stream = p_stream;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'tidemark: group_beat: the group of consumer % on stream % exists but this role may not use it', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The owner grants consumers with SELECT tidemark.grant_consumer(role, ARRAY[consumer]).';
    END IF;
    INSERT INTO {{schema}}.partition_cursors (consumer, stream, partition)
    SELECT p_consumer, p_stream, p FROM pg_catalog.generate_series(0, v_partitions - 1) p
    ON CONFLICT DO NOTHING;
  END IF;
  IF v_partitions <> p_partitions THEN
    RAISE EXCEPTION 'tidemark: group_beat: the group of consumer % on stream % has % partitions, not %', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_partitions, p_partitions
      USING ERRCODE = 'TM007',
            HINT = 'Start every member with the same partition count.';
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

-- p_member leaves the group: its lease ends now, and its partitions are
-- free for the others' next beats. It waits for nothing: a partition whose
-- row a page of the member still holds is taken by a later beat, once that
-- page ended (it may still commit: its snapshot shows the member as it was;
-- the row lock keeps every other member out until it ends). Returns how
-- many partitions it gave up now.
CREATE FUNCTION {{schema}}.leave_group(p_consumer text, p_stream text, p_member text) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key bigint := {{schema}}.checked_cursor_key('leave_group', p_consumer, p_stream);
  v_member text := {{schema}}.checked_member('leave_group', p_member);
  v_released integer;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock({{schema}}.partition_key(p_consumer, p_stream, -1));
  DELETE FROM {{schema}}.group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member = v_member;
  UPDATE {{schema}}.partition_cursors pc
     SET holder = NULL, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM {{schema}}.partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.holder = v_member
             FOR NO KEY UPDATE SKIP LOCKED);
  GET DIAGNOSTICS v_released = ROW_COUNT;
  RETURN v_released;
END
$$;

-- The partition's cursor row, locked for this page, held by p_member under
-- a live lease (TM008 otherwise), with safe_seq and the stream's horizon
-- checked as lock_cursor does for a consumer's own cursor.
CREATE FUNCTION {{schema}}.lock_partition(p_function text, p_consumer text, p_stream text, p_partition integer, p_member text,
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
  SELECT pc.seq, pc.holder, g.partitions INTO cursor, v_holder, partitions
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
  IF v_pruned > cursor THEN
    RAISE EXCEPTION 'tidemark: retention removed events of stream % above partition % of consumer % (cursor %, pruned through %)',
        pg_catalog.quote_literal(p_stream), p_partition, pg_catalog.quote_literal(p_consumer), cursor, v_pruned
      USING ERRCODE = 'TM002',
            DETAIL = pg_catalog.format('cursor=%s pruned_through=%s', cursor, v_pruned),
            HINT = 'Nothing was delivered. Roll back, and rebuild the consumer from a bootstrap snapshot.';
  END IF;
END
$$;

-- read_page for one partition of a group: the events of the partition
-- above its cursor, up to safe_seq, in seq order, at most p_max_events.
CREATE FUNCTION {{schema}}.read_partition_page(p_consumer text, p_stream text, p_partition integer, p_member text, p_max_events integer)
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
  v_done := {{schema}}.remember_page(v.key, v.cursor, v_through, v.safe_seq, v_last);
END
$$;

-- page_info for the partition page open in this transaction.
CREATE FUNCTION {{schema}}.partition_page_info(p_consumer text, p_stream text, p_partition integer)
RETURNS TABLE (cursor bigint, through bigint, advanced_to bigint, safe_seq bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_page jsonb := {{schema}}.open_page({{schema}}.partition_key(p_consumer, p_stream, p_partition));
BEGIN
  IF v_page IS NOT NULL THEN
    RETURN QUERY SELECT (v_page ->> 0)::bigint, (v_page ->> 1)::bigint, (v_page ->> 2)::bigint, (v_page ->> 3)::bigint;
  END IF;
END
$$;

-- advance_cursor for one partition: within what the page returned, and
-- only while p_member still holds the partition under a live lease, read
-- by the clock now (TM008 otherwise: the page must roll back).
CREATE FUNCTION {{schema}}.advance_partition(p_consumer text, p_stream text, p_partition integer, p_member text, p_seq bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text;
  v_pages jsonb;
  v_page jsonb;
  v_through bigint;
  v_at bigint;
  v_done text;
BEGIN
  PERFORM {{schema}}.checked_cursor_key('advance_partition', p_consumer, p_stream);
  PERFORM {{schema}}.checked_member('advance_partition', p_member);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: advance_partition: partition must be 0 or more, got %', coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_key := {{schema}}.partition_key(p_consumer, p_stream, p_partition)::text;
  v_pages := {{schema}}.open_pages();
  v_page := {{schema}}.open_page(v_key::bigint);
  IF v_page IS NULL THEN
    RAISE EXCEPTION 'tidemark: advance_partition: no page of partition % of consumer % on stream % was read in this transaction', p_partition, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM004',
            HINT = 'Call read_partition_page first, in the same REPEATABLE READ transaction.';
  END IF;
  v_through := (v_page ->> 1)::bigint;
  v_at := (v_page ->> 2)::bigint;
  IF p_seq IS NOT NULL AND p_seq < v_at THEN
    RAISE EXCEPTION 'tidemark: advance_partition to % goes backwards: partition % of consumer % on stream % is at %', p_seq, p_partition, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), v_at
      USING ERRCODE = 'TM005';
  END IF;
  IF p_seq > v_through THEN
    RAISE EXCEPTION 'tidemark: advance_partition to % skips events the page did not return: it may reach seq % at most', p_seq, v_through
      USING ERRCODE = 'TM005',
            HINT = 'Advance to the seq of the last event applied, then read the next page.';
  END IF;
  -- The fence: whatever the page did commits only while its member holds
  -- the partition (the page has held its row locked since it read it, so
  -- no beat moved it) under a lease that has not ended by the clock now.
  -- The lease is group_members as this REPEATABLE READ page's snapshot
  -- has it: the member's last renewal before the page began. A lease only
  -- moves later while its member lives (its own beats), so the lease read
  -- ends no later than the member's current one: a member whose lease
  -- ended cannot commit, and a page that outlives the lease it began under
  -- is refused even if its member renewed meanwhile.
  UPDATE {{schema}}.partition_cursors pc SET seq = coalesce(p_seq, v_at), updated_at = pg_catalog.now()
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition AND pc.seq = v_at
     AND pc.holder = p_member
     AND EXISTS (SELECT 1 FROM {{schema}}.group_members m
                  WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member = p_member
                    AND m.lease_expires_at > pg_catalog.clock_timestamp());
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: advance_partition: partition % of consumer % on stream % is no longer held by member % under a live lease (or its cursor moved under the page)', p_partition,
        pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), pg_catalog.quote_literal(p_member)
      USING ERRCODE = 'TM008',
            HINT = 'Roll back: the page''s effects must not commit. Renew the lease with group_beat and page the partitions it returns.';
  END IF;
  IF p_seq IS NULL OR p_seq = v_at THEN
    RETURN v_at;
  END IF;
  v_done := pg_catalog.set_config('tidemark.pages',
    pg_catalog.jsonb_set(v_pages, ARRAY[v_key, '2'], pg_catalog.to_jsonb(p_seq))::text, true);
  RETURN p_seq;
END
$$;

-- The partitions of every group this role may see, for `tidemark status`:
-- holder (and whether its lease is live), cursor, the partition's events
-- above it up to safe_seq (counted up to p_cap, through the partition
-- index when it exists), and how often it changed hands.
CREATE FUNCTION {{schema}}.group_partitions(p_cap integer DEFAULT 1000000)
RETURNS TABLE (consumer text, stream text, partition integer, partitions integer, holder text, holder_live boolean, seq bigint, lag bigint, moves bigint, updated_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  r record;
  v_safe bigint;
BEGIN
  SELECT w.safe_seq INTO v_safe FROM {{schema}}.watermark w;
  FOR r IN
    SELECT pc.consumer, pc.stream, pc.partition, g.partitions, pc.holder, pc.seq, pc.moves, pc.updated_at,
           EXISTS (SELECT 1 FROM {{schema}}.group_members m
                    WHERE m.consumer = pc.consumer AND m.stream = pc.stream AND m.member = pc.holder
                      AND m.lease_expires_at > pg_catalog.clock_timestamp()) AS live
      FROM {{schema}}.partition_cursors pc JOIN {{schema}}.groups g ON g.consumer = pc.consumer AND g.stream = pc.stream
     ORDER BY pc.consumer, pc.stream, pc.partition
  LOOP
    consumer := r.consumer;
    stream := r.stream;
    partition := r.partition;
    partitions := r.partitions;
    holder := r.holder;
    holder_live := r.live;
    seq := r.seq;
    moves := r.moves;
    updated_at := r.updated_at;
    EXECUTE pg_catalog.format(
      'SELECT count(*) FROM (SELECT 1 FROM {{schema}}.events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4 LIMIT $5) l', {{schema}}.partition_expression('e.key', r.partitions))
      INTO lag
      USING r.stream, r.seq, v_safe, r.partition::pg_catalog.int8, p_cap;
    RETURN NEXT;
  END LOOP;
END
$$;

-- The fence again at COMMIT (a deferred constraint trigger): a page whose
-- member paused between advance_partition and COMMIT past the lease the
-- page began under does not commit either.
CREATE FUNCTION {{schema}}.partition_fence() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.holder IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM {{schema}}.group_members m
        WHERE m.consumer = NEW.consumer AND m.stream = NEW.stream AND m.member = NEW.holder
          AND m.lease_expires_at > pg_catalog.clock_timestamp()) THEN
    RAISE EXCEPTION 'tidemark: partition % of consumer % on stream % moved at COMMIT after the lease of member % ended', NEW.partition,
        pg_catalog.quote_literal(NEW.consumer), pg_catalog.quote_literal(NEW.stream), pg_catalog.quote_literal(NEW.holder)
      USING ERRCODE = 'TM008';
  END IF;
  RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER partition_cursors_fence AFTER UPDATE OF seq ON {{schema}}.partition_cursors
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{schema}}.partition_fence();

-- A consumer is a group or has a cursor of its own, not both: two
-- positions of one consumer would deliver its events twice. group_beat
-- refuses a name with a cursor (or whose cursor lock a tailer holds); this
-- refuses a cursor for a group's name, however it is created (read_page, a
-- tailer, `tidemark cursor set`). It takes no lock (a tailer holds the
-- cursor's key for as long as it runs): a group and a cursor of one name
-- created at the same instant, each before the other committed, are not
-- refused (docs/PROTOCOL.md section 6.4).
CREATE FUNCTION {{schema}}.cursor_not_a_group() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.groups g WHERE g.consumer = NEW.consumer AND g.stream = NEW.stream) THEN
    RAISE EXCEPTION 'tidemark: consumer % on stream % is a group: it has a cursor per partition, not one of its own', pg_catalog.quote_literal(NEW.consumer), pg_catalog.quote_literal(NEW.stream)
      USING ERRCODE = 'TM007',
            HINT = 'Run it as a group member (tail --partitions N, StreamClient.tailGroup, read_partition_page), or use another consumer name.';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER cursors_not_a_group BEFORE INSERT ON {{schema}}.cursors
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.cursor_not_a_group();

-- The partition count is fixed: changing it would split the keys anew
-- under the partitions' cursors.
CREATE FUNCTION {{schema}}.group_partitions_fixed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.partitions IS DISTINCT FROM OLD.partitions THEN
    RAISE EXCEPTION 'tidemark: the group of consumer % on stream % has % partitions: the count cannot change under its cursors', pg_catalog.quote_literal(OLD.consumer), pg_catalog.quote_literal(OLD.stream), OLD.partitions
      USING ERRCODE = 'TM007';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER groups_partitions_fixed BEFORE UPDATE ON {{schema}}.groups
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.group_partitions_fixed();

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
  -- Groups: a member creates its group on first use, renews its own lease
  -- and moves partitions (group_beat); never the partition count.
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON {{schema}}.groups TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON {{schema}}.group_members TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (ttl_ms, lease_expires_at) ON {{schema}}.group_members TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON {{schema}}.partition_cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (seq, holder, moves, updated_at) ON {{schema}}.partition_cursors TO %I', p_role);
  INSERT INTO {{schema}}.consumer_grants (role_id, consumer)
  SELECT r.oid, c FROM pg_catalog.pg_roles r, pg_catalog.unnest(p_consumers) AS c
   WHERE r.rolname = p_role
  ON CONFLICT DO NOTHING;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.grant_consumer(text, text[]) FROM PUBLIC;

-- The roles an earlier grant_consumer named may be group members too:
-- grant_consumer again, as it stands now (each of its grants is idempotent,
-- and the consumer_grants rows are there already).
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT ro.rolname, pg_catalog.array_agg(g.consumer) AS consumers
             FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles ro ON ro.oid = g.role_id
            GROUP BY ro.rolname LOOP
    PERFORM {{schema}}.grant_consumer(r.rolname, r.consumers);
  END LOOP;
END
$$;
