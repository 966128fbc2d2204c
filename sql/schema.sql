-- The tidemark schema as every migration in sql/migrations/ builds it, dumped by
-- `npm run schema` (pg_dump --schema-only --no-owner, PostgreSQL major 15).
-- Generated: do not edit. CI fails when it differs from a fresh dump.
--
-- PostgreSQL database dump
--

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: tidemark; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA tidemark;

--
-- Name: locked_cursor; Type: TYPE; Schema: tidemark; Owner: -
--

CREATE TYPE tidemark.locked_cursor AS (
	key bigint,
	cursor bigint,
	safe_seq bigint
);

--
-- Name: repartition_state; Type: TYPE; Schema: tidemark; Owner: -
--

CREATE TYPE tidemark.repartition_state AS (
	partitions integer,
	next_partitions integer,
	barrier bigint,
	since_seq bigint,
	behind integer
);

--
-- Name: watermark_candidate; Type: TYPE; Schema: tidemark; Owner: -
--

CREATE TYPE tidemark.watermark_candidate AS (
	seq bigint,
	holders text[],
	taken_at timestamp with time zone
);

--
-- Name: watermarker_loop; Type: TYPE; Schema: tidemark; Owner: -
--

CREATE TYPE tidemark.watermarker_loop AS (
	owner text,
	deadline timestamp with time zone,
	lease_ttl_ms integer,
	renew_ms integer,
	poll_min_ms integer,
	poll_max_ms integer,
	idle_grace_ms integer,
	synchronous_commit boolean,
	try_lock boolean,
	max_steps_per_second integer,
	standby boolean,
	done boolean,
	sleep_s double precision,
	committed_at timestamp with time zone,
	step_started_at timestamp with time zone,
	wake_at timestamp with time zone,
	renew_at timestamp with time zone,
	last_advance_at timestamp with time zone,
	delay_ms double precision,
	tick_at timestamp with time zone,
	lease_seen_at timestamp with time zone,
	not_before timestamp with time zone,
	defer_since timestamp with time zone,
	tokens double precision,
	rewound_to bigint,
	reason text,
	steps bigint,
	polls bigint,
	advanced bigint,
	pending bigint,
	idle bigint,
	try_lock_reads bigint,
	pg_locks_reads bigint,
	pg_locks_read_us_total double precision,
	step_us_total double precision,
	step_us_max double precision,
	step_us_hist integer[],
	safe_seq bigint,
	leader boolean,
	lease_owner text,
	lease_expires_at timestamp with time zone,
	oldest_pending_at timestamp with time zone,
	sleep_ok boolean,
	resume boolean,
	run_ms integer,
	arming boolean
);

--
-- Name: acquire_lease(text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.acquire_lease(p_owner text, p_ttl_ms integer) RETURNS TABLE(held boolean, lease_owner text, lease_expires_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
  IF p_owner IS NULL OR p_owner = '' OR p_ttl_ms IS NULL OR p_ttl_ms < 1 THEN
    RAISE EXCEPTION 'acquire_lease: need an owner name and a positive TTL in milliseconds (got %, %)', p_owner, p_ttl_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH acquired AS (
    UPDATE "tidemark".watermark w
       SET lease_owner = p_owner,
           lease_expires_at = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms / 1000.0)
     WHERE w.lease_owner = p_owner OR w.lease_owner IS NULL OR w.lease_expires_at <= pg_catalog.clock_timestamp()
    RETURNING w.lease_owner, w.lease_expires_at)
  SELECT true, a.lease_owner, a.lease_expires_at FROM acquired a
  UNION ALL
  SELECT false, w.lease_owner, w.lease_expires_at FROM "tidemark".watermark w
   WHERE NOT EXISTS (SELECT 1 FROM acquired);
END
$$;

--
-- Name: advance_cursor(text, text, bigint); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.advance_cursor(p_consumer text, p_stream text, p_seq bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_key text;
  v_pages jsonb;
  v_page jsonb;
  v_through bigint;
  v_at bigint;
  v_done text;
BEGIN
  v_key := "tidemark".checked_cursor_key('advance_cursor', p_consumer, p_stream)::text;
  v_pages := "tidemark".open_pages();
  v_page := "tidemark".open_page(v_key::bigint);
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
  UPDATE "tidemark".cursors c SET seq = p_seq, updated_at = pg_catalog.now()
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

--
-- Name: advance_partition(text, text, integer, text, bigint); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.advance_partition(p_consumer text, p_stream text, p_partition integer, p_member text, p_seq bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_key text;
  v_pages jsonb;
  v_page jsonb;
  v_through bigint;
  v_at bigint;
  v_done text;
BEGIN
  PERFORM "tidemark".checked_cursor_key('advance_partition', p_consumer, p_stream);
  PERFORM "tidemark".checked_member('advance_partition', p_member);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: advance_partition: partition must be 0 or more, got %', coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_key := "tidemark".partition_key(p_consumer, p_stream, p_partition)::text;
  v_pages := "tidemark".open_pages();
  v_page := "tidemark".open_page(v_key::bigint);
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
  UPDATE "tidemark".partition_cursors pc SET seq = coalesce(p_seq, v_at), updated_at = pg_catalog.now()
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition AND pc.seq = v_at
     AND pc.holder = p_member
     AND EXISTS (SELECT 1 FROM "tidemark".group_members m
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

--
-- Name: beat(text, text, jsonb, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.beat(p_operation text, p_owner text, p_details jsonb, p_lock_timeout_ms integer) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  v_at timestamptz := clock_timestamp();
BEGIN
  PERFORM pg_catalog.set_config('lock_timeout', p_lock_timeout_ms::text, true);
  INSERT INTO "tidemark".heartbeats AS h (operation, owner, beat_at, details)
  VALUES (p_operation, p_owner, v_at, p_details)
  ON CONFLICT (operation, owner) DO UPDATE
    SET beat_at = excluded.beat_at, details = excluded.details;
  RETURN v_at;
END
$$;

--
-- Name: blocking_writers(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.blocking_writers() RETURNS TABLE(pid integer, virtualtransaction text, application_name text, client_addr inet, xact_start timestamp with time zone, age_seconds double precision, state text, query text, prepared_gid text, pending_seq bigint, waiting_since timestamp with time zone)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
  WITH oldest AS (
    SELECT c.seq, c.holders, c.taken_at
      FROM "tidemark".watermark w, pg_catalog.unnest(w.candidates) WITH ORDINALITY AS c(seq, holders, taken_at, n)
     WHERE w.candidates_epoch = pg_catalog.pg_postmaster_start_time() AND c.seq > w.safe_seq
     ORDER BY c.n LIMIT 1)
  SELECT h.*, o.seq, o.taken_at
    FROM "tidemark".fence_holders() h, oldest o
   WHERE h.virtualtransaction = ANY (o.holders) OR h.pid IS NULL
   ORDER BY h.xact_start NULLS LAST, h.pid
$$;

--
-- Name: checked_cursor_key(text, text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.checked_cursor_key(p_function text, p_consumer text, p_stream text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF p_consumer IS NULL OR p_consumer = '' OR pg_catalog.length(p_consumer) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: consumer must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_consumer), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_stream IS NULL OR p_stream = '' OR pg_catalog.length(p_stream) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: stream must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_stream), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN "tidemark".cursor_lock_key(p_consumer, p_stream);
END
$$;

--
-- Name: checked_member(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.checked_member(p_function text, p_member text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF p_member IS NULL OR p_member = '' OR pg_catalog.length(p_member) > 200 THEN
    RAISE EXCEPTION 'tidemark: %: member must be a name of 1-200 characters, got %', p_function, coalesce(pg_catalog.quote_literal(p_member), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN p_member;
END
$$;

--
-- Name: claim_owner(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.claim_owner(p_owner text, p_instance text, p_ttl_ms integer) RETURNS TABLE(claimed boolean, instance text, claimed_at timestamp with time zone, expires_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
  IF p_owner IS NULL OR p_owner = '' OR p_instance IS NULL OR p_instance = '' OR p_ttl_ms IS NULL OR p_ttl_ms < 1 THEN
    RAISE EXCEPTION 'claim_owner: need an owner name, an instance id and a positive TTL in milliseconds (got %, %, %)', p_owner, p_instance, p_ttl_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Read first: its own claim not yet due, or another's live one, is
  -- answered without a write (an idle loop claims before every run, and
  -- a refused process keeps looking).
  RETURN QUERY
  SELECT c.instance = p_instance, c.instance, c.claimed_at, c.expires_at
    FROM "tidemark".owner_claims c
   WHERE c.owner = p_owner
     AND CASE WHEN c.instance = p_instance
              THEN c.expires_at >= pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms * 0.75 / 1000.0)
              ELSE c.expires_at > pg_catalog.clock_timestamp() END;
  IF FOUND THEN
    RETURN;
  END IF;
  -- Claims left by processes that died, a day after they expired.
  DELETE FROM "tidemark".owner_claims c
   WHERE c.expires_at < pg_catalog.clock_timestamp() - interval '1 day' AND c.owner <> p_owner;
  -- A row deleted between the two statements (its holder released it):
  -- claim again.
  FOR i IN 1 .. 3 LOOP
    RETURN QUERY
    INSERT INTO "tidemark".owner_claims AS c (owner, instance, claimed_at, expires_at)
    VALUES (p_owner, p_instance, pg_catalog.clock_timestamp(),
            pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms / 1000.0))
    ON CONFLICT (owner) DO UPDATE
       SET instance = excluded.instance,
           claimed_at = CASE WHEN c.instance = excluded.instance THEN c.claimed_at ELSE excluded.claimed_at END,
           expires_at = excluded.expires_at
     WHERE c.instance = excluded.instance
        OR c.expires_at <= pg_catalog.clock_timestamp()
    RETURNING true, c.instance, c.claimed_at, c.expires_at;
    IF FOUND THEN
      RETURN;
    END IF;
    -- A statement of its own: its snapshot sees the claim that refused
    -- this one, even one committed while the INSERT waited for it.
    RETURN QUERY
    SELECT c.instance = p_instance, c.instance, c.claimed_at, c.expires_at
      FROM "tidemark".owner_claims c
     WHERE c.owner = p_owner;
    IF FOUND THEN
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'claim_owner: the claim of owner % kept changing under this one', p_owner
    USING ERRCODE = 'serialization_failure';
END
$$;

--
-- Name: create_group(text, text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.create_group(p_function text, p_consumer text, p_stream text, p_partitions integer) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_key bigint := "tidemark".checked_cursor_key(p_function, p_consumer, p_stream);
  v_partitions integer;
BEGIN
  IF EXISTS (SELECT 1 FROM "tidemark".groups g WHERE g.consumer = p_consumer AND g.stream = p_stream) THEN
    RETURN;
  END IF;
  IF NOT pg_catalog.pg_try_advisory_xact_lock(v_key)
     OR EXISTS (SELECT 1 FROM "tidemark".cursors c WHERE c.consumer = p_consumer AND c.stream = p_stream) THEN
    RAISE EXCEPTION 'tidemark: %: consumer % on stream % already has a cursor of its own: a group needs a consumer name of its own', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007';
  END IF;
  INSERT INTO "tidemark".groups (consumer, stream, partitions) VALUES (p_consumer, p_stream, p_partitions)
  ON CONFLICT DO NOTHING;
  SELECT g.partitions INTO v_partitions FROM "tidemark".groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: %: the group of consumer % on stream % exists but this role may not use it', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'insufficient_privilege',
            HINT = 'The owner grants consumers with SELECT tidemark.grant_consumer(role, ARRAY[consumer]).';
  END IF;
  INSERT INTO "tidemark".partition_cursors (consumer, stream, partition)
  SELECT p_consumer, p_stream, p FROM pg_catalog.generate_series(0, v_partitions - 1) p
  ON CONFLICT DO NOTHING;
END
$$;

--
-- Name: cursor_lock_key(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.cursor_lock_key(p_consumer text, p_stream text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RETURN pg_catalog.hashtextextended(
    (pg_catalog.length(p_consumer)::text || ':' || p_consumer || p_stream) COLLATE "C",
    (-8344625403455539058)::bigint);
END
$$;

--
-- Name: cursor_not_a_group(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.cursor_not_a_group() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM "tidemark".groups g WHERE g.consumer = NEW.consumer AND g.stream = NEW.stream) THEN
    RAISE EXCEPTION 'tidemark: consumer % on stream % is a group: it has a cursor per partition, not one of its own', pg_catalog.quote_literal(NEW.consumer), pg_catalog.quote_literal(NEW.stream)
      USING ERRCODE = 'TM007',
            HINT = 'Run it as a group member (tail --partitions N, StreamClient.tailGroup, read_partition_page), or use another consumer name.';
  END IF;
  RETURN NEW;
END
$$;

--
-- Name: dead_letter_is_the_event(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.dead_letter_is_the_event() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  SELECT e.kind, e.key, e.payload, e.headers, e.occurred_at
    INTO NEW.kind, NEW.key, NEW.payload, NEW.headers, NEW.occurred_at
    FROM "tidemark".events e
   WHERE e.seq = NEW.seq AND e.stream = NEW.stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: stream % has no event %', pg_catalog.quote_literal(NEW.stream), NEW.seq
      USING ERRCODE = 'TM005';
  END IF;
  NEW.partition := NULL;
  SELECT "tidemark".key_partition(NEW.key, g.partitions) INTO NEW.partition
    FROM "tidemark".groups g
   WHERE g.consumer = NEW.consumer AND g.stream = NEW.stream;
  -- A group's dead letter is an event its partition's cursor has passed
  -- (record_partition_dead_letter moves the cursor first): one above it
  -- would be delivered by a page, then again by a replay.
  IF NEW.partition IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM "tidemark".partition_cursors pc
        WHERE pc.consumer = NEW.consumer AND pc.stream = NEW.stream AND pc.partition = NEW.partition AND pc.seq >= NEW.seq) THEN
    RAISE EXCEPTION 'tidemark: event % of stream % is above the cursor of partition % of consumer %: a page delivers it, so it cannot be a dead letter', NEW.seq,
        pg_catalog.quote_literal(NEW.stream), NEW.partition, pg_catalog.quote_literal(NEW.consumer)
      USING ERRCODE = 'TM005';
  END IF;
  RETURN NEW;
END
$$;

--
-- Name: fence_holders(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.fence_holders() RETURNS TABLE(pid integer, virtualtransaction text, application_name text, client_addr inet, xact_start timestamp with time zone, age_seconds double precision, state text, query text, prepared_gid text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
  WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.virtualtransaction, l.pid, l.transactionid, l.classid, l.objid, l.objsubid, l.mode, l.granted
      FROM pg_catalog.pg_locks l
     WHERE l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
        OR l.locktype = 'transactionid'),
  holders AS (
    SELECT l.pid, l.virtualtransaction
      FROM locks l
     WHERE l.locktype = 'advisory'
       AND l.classid = ((((-8344625403455539058)::bigint) >> 32) & 4294967295)::oid
       AND l.objid = (((-8344625403455539058)::bigint) & 4294967295)::oid
       AND l.objsubid = 1 AND l.mode = 'ShareLock' AND l.granted)
  SELECT h.pid, h.virtualtransaction, a.application_name, a.client_addr,
         coalesce(a.xact_start, p.prepared),
         extract(epoch FROM pg_catalog.clock_timestamp() - coalesce(a.xact_start, p.prepared))::float8,
         CASE WHEN h.pid IS NULL THEN 'prepared' ELSE a.state END,
         CASE WHEN h.pid IS NULL THEN NULL ELSE pg_catalog.left(a.query, 200) END,
         p.gid
    FROM holders h
    LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
    LEFT JOIN locks x ON h.pid IS NULL AND x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock'
                     AND x.virtualtransaction = h.virtualtransaction
    LEFT JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = x.transactionid
   ORDER BY 5 NULLS LAST, 1
$$;

--
-- Name: fence_owner_claim(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.fence_owner_claim() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_instance text := pg_catalog.current_setting('tidemark.instance', true);
  v_owner    text := coalesce(NEW.lease_owner, OLD.lease_owner);
  c          record;
BEGIN
  IF v_instance IS NULL OR v_instance = '' OR v_owner IS NULL THEN
    RETURN NEW;
  END IF;
  -- Locked (FOR SHARE conflicts with claim_owner's update of the row), so
  -- a claim another process is taking (uncommitted) is waited for and
  -- then seen: decided on its latest version, not on a snapshot.
  SELECT x.instance, x.expires_at INTO c
    FROM "tidemark".owner_claims x
   WHERE x.owner = v_owner
     FOR SHARE;
  IF FOUND AND c.instance <> v_instance AND c.expires_at > pg_catalog.clock_timestamp() THEN
    RAISE EXCEPTION 'tidemark: owner % is claimed by another live watermarker instance; instance % wrote nothing', v_owner, v_instance
      USING ERRCODE = 'object_in_use';
  END IF;
  -- A lease renewed (or taken) extends the renewing instance's claim to
  -- it: a run that outlasts the claim's TTL keeps its claim as long as it
  -- keeps the lease.
  IF FOUND AND c.instance = v_instance AND NEW.lease_owner IS NOT NULL
     AND NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at AND c.expires_at < NEW.lease_expires_at THEN
    UPDATE "tidemark".owner_claims x SET expires_at = NEW.lease_expires_at WHERE x.owner = v_owner;
  END IF;
  RETURN NEW;
END
$$;

--
-- Name: finish_repartition(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.finish_repartition(p_consumer text, p_stream text) RETURNS tidemark.repartition_state
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
  g record;
  r record;
  v_state "tidemark".repartition_state;
  v_rows integer;
  v_held integer;
  v_max bigint;
  v_min bigint;
  v_pruned bigint;
  v_barrier bigint;
  v_behind boolean;
BEGIN
  PERFORM "tidemark".checked_cursor_key('finish_repartition', p_consumer, p_stream);
  IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'tidemark: finish_repartition must run in a READ COMMITTED transaction (it reads the partitions'' latest cursors), not %', pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003';
  END IF;
  SELECT x.next_partitions INTO g FROM "tidemark".groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: finish_repartition: consumer % on stream % is not a group', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007';
  END IF;
  IF g.next_partitions IS NOT NULL THEN
    -- Every partition row, locked in partition order, waiting for the
    -- page that holds one. In READ COMMITTED the rows locked are their
    -- latest versions.
    PERFORM FROM "tidemark".partition_cursors x
      WHERE x.consumer = p_consumer AND x.stream = p_stream
      ORDER BY x.partition
        FOR NO KEY UPDATE;
  END IF;
  -- The group's row: one re-partition request or switch at a time, and
  -- what is pending read again under it (a request may have committed
  -- since the read above, which saw none and locked nothing).
  SELECT x.partitions, x.next_partitions, x.barrier, x.since_seq INTO g FROM "tidemark".groups x
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
  SELECT pg_catalog.count(*)::integer INTO v_rows FROM "tidemark".partition_cursors x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  SELECT pg_catalog.count(*)::integer INTO v_held FROM (
    SELECT 1 FROM "tidemark".partition_cursors x
     WHERE x.consumer = p_consumer AND x.stream = p_stream
       FOR NO KEY UPDATE SKIP LOCKED) l;
  IF v_held < v_rows THEN
    v_state.behind := NULL;
    RETURN v_state;
  END IF;
  SELECT pg_catalog.max(x.seq), pg_catalog.min(x.seq) INTO v_max, v_min FROM "tidemark".partition_cursors x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  -- A partition whose events retention removed before it applied them
  -- must resync (TM002), as its pages say: the switch would move its
  -- cursor past the loss in silence (the first review).
  SELECT h.pruned_through_seq INTO v_pruned FROM "tidemark".horizons h WHERE h.stream = p_stream;
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
    UPDATE "tidemark".groups x SET barrier = v_barrier
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
    v_state.barrier := v_barrier;
  END IF;
  -- Which old partitions still have events to apply up to the barrier.
  -- Every event at or below it is final: the barrier is a safe_seq, or a
  -- cursor, which never passes one. (No advisory lock yet: beats go on.)
  FOR r IN SELECT x.partition, x.seq FROM "tidemark".partition_cursors x
            WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.seq < v_barrier LOOP
    EXECUTE pg_catalog.format(
      'SELECT EXISTS (SELECT 1 FROM "tidemark".events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4)', "tidemark".partition_expression('e.key', g.partitions))
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
  PERFORM pg_catalog.pg_advisory_xact_lock("tidemark".partition_key(p_consumer, p_stream, -1));

  -- The switch. Every cursor starts at the barrier. A partition number
  -- keeps a live holder (the split gives partition p to live member
  -- number p % count whatever the count); one whose holder's lease ended
  -- is freed (the COMMIT fence of section 6.4 refuses to move the cursor
  -- of a holder whose lease ended). Partitions beyond the new count go,
  -- their change-of-hands count added to a remaining one's (the group's
  -- total stays); new ones start free.
  IF g.next_partitions < g.partitions THEN
    UPDATE "tidemark".partition_cursors pc SET moves = pc.moves + d.moves
      FROM (SELECT x.partition % g.next_partitions AS partition, pg_catalog.sum(x.moves)::bigint AS moves
              FROM "tidemark".partition_cursors x
             WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.partition >= g.next_partitions
             GROUP BY 1) d
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = d.partition;
    DELETE FROM "tidemark".partition_cursors pc
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition >= g.next_partitions;
  END IF;
  UPDATE "tidemark".partition_cursors pc
     SET seq = v_barrier, updated_at = pg_catalog.now(),
         holder = CASE WHEN EXISTS (SELECT 1 FROM "tidemark".group_members m
                                     WHERE m.consumer = pc.consumer AND m.stream = pc.stream AND m.member = pc.holder
                                       AND m.lease_expires_at > pg_catalog.clock_timestamp()) THEN pc.holder END
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream;
  INSERT INTO "tidemark".partition_cursors (consumer, stream, partition, seq)
  SELECT p_consumer, p_stream, p, v_barrier FROM pg_catalog.generate_series(g.partitions, g.next_partitions - 1) p;
  UPDATE "tidemark".groups x
     SET partitions = g.next_partitions, next_partitions = NULL, barrier = NULL,
         since_seq = v_barrier, repartitioned_at = pg_catalog.now()
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  -- The group's dead letters belong to their key's partition of the new
  -- split: its holder replays them. Each is at or below its old
  -- partition's cursor, so at or below the barrier, where every new
  -- cursor starts.
  UPDATE "tidemark".dead_letters d SET partition = "tidemark".key_partition(d.key, g.next_partitions)
   WHERE d.consumer = p_consumer AND d.stream = p_stream AND d.partition IS NOT NULL;
  RETURN ROW(g.next_partitions, NULL, NULL, v_barrier, 0)::"tidemark".repartition_state;
END
$_$;

--
-- Name: grant_consumer(text, text[]); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.grant_consumer(p_role text, p_consumers text[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF p_consumers IS NULL OR pg_catalog.cardinality(p_consumers) = 0 THEN
    RAISE EXCEPTION 'grant_consumer: name the consumers % may use, e.g. ARRAY[''billing'']', p_role
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA "tidemark" TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT ON "tidemark".events, "tidemark".watermark, "tidemark".horizons TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT ON "tidemark".consumer_grants TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON "tidemark".cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (seq, updated_at, resync_count, last_resync_at) ON "tidemark".cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON "tidemark".dead_letters TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (attempts, last_error, dead_at, replay_requested_at) ON "tidemark".dead_letters TO %I', p_role);
  -- Groups: a member creates its group on first use, renews its own lease
  -- and moves partitions (group_beat); never the partition count.
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON "tidemark".groups TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON "tidemark".group_members TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (ttl_ms, lease_expires_at) ON "tidemark".group_members TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON "tidemark".partition_cursors TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT UPDATE (seq, holder, moves, updated_at) ON "tidemark".partition_cursors TO %I', p_role);
  INSERT INTO "tidemark".consumer_grants (role_id, consumer)
  SELECT r.oid, c FROM pg_catalog.pg_roles r, pg_catalog.unnest(p_consumers) AS c
   WHERE r.rolname = p_role
  ON CONFLICT DO NOTHING;
END
$$;

--
-- Name: grant_writer(text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.grant_writer(p_role text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA "tidemark" TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT INSERT (stream, kind, key, payload, headers) ON "tidemark".events TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT (seq) ON "tidemark".events TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT (safe_seq, updated_at, lease_owner, lease_expires_at) ON "tidemark".watermark TO %I', p_role);
END
$$;

--
-- Name: group_beat(text, text, integer, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.group_beat(p_consumer text, p_stream text, p_partitions integer, p_member text, p_ttl_ms integer) RETURNS TABLE(partition integer, seq bigint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  v_key bigint := "tidemark".checked_cursor_key('group_beat', p_consumer, p_stream);
  v_member text := "tidemark".checked_member('group_beat', p_member);
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
  PERFORM pg_catalog.pg_advisory_xact_lock("tidemark".partition_key(p_consumer, p_stream, -1));
  SELECT g.partitions, g.next_partitions, g.since_seq INTO v_partitions, v_next, v_since FROM "tidemark".groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  IF NOT FOUND THEN
    PERFORM "tidemark".create_group('group_beat', p_consumer, p_stream, p_partitions);
    SELECT g.partitions INTO v_partitions FROM "tidemark".groups g
     WHERE g.consumer = p_consumer AND g.stream = p_stream;
  END IF;
  -- A member joins with the group's count, or with the count a pending
  -- re-partition asks for (version 17); one already in (a live lease)
  -- follows the group whatever count it was started with, so that a
  -- re-partition goes on under running members.
  IF p_partitions <> v_partitions AND p_partitions IS DISTINCT FROM v_next
     AND NOT EXISTS (SELECT 1 FROM "tidemark".group_members m
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
  INSERT INTO "tidemark".group_members AS m (consumer, stream, member, ttl_ms, lease_expires_at)
  VALUES (p_consumer, p_stream, v_member, p_ttl_ms, v_now + p_ttl_ms * interval '1 millisecond')
  ON CONFLICT (consumer, stream, member) DO UPDATE
    SET ttl_ms = excluded.ttl_ms, lease_expires_at = excluded.lease_expires_at;
  -- Members whose lease ended hold nothing any more (below): forget them.
  DELETE FROM "tidemark".group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at <= v_now;

  SELECT pg_catalog.array_agg(m.member ORDER BY m.member COLLATE "C") INTO v_members
    FROM "tidemark".group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream;
  v_count := pg_catalog.cardinality(v_members);
  v_index := pg_catalog.array_position(v_members, v_member) - 1;

  -- Give up the partitions that are another member's now. One that a page
  -- of this member has open stays until the next beat (the page holds its
  -- row, and its commit still counts: the member holds it until then).
  UPDATE "tidemark".partition_cursors pc
     SET holder = NULL, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM "tidemark".partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.holder = v_member
             AND x.partition % v_count <> v_index
             FOR NO KEY UPDATE SKIP LOCKED);

  -- Take this member's own partitions that are free, or whose holder's
  -- lease ended (it is no live member). One whose row a page still holds
  -- (that page's member was alive when it read) is taken at a later beat:
  -- the page ends by its commit, its rollback, or the idle timeout its
  -- read set.
  UPDATE "tidemark".partition_cursors pc
     SET holder = v_member, moves = pc.moves + 1, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM "tidemark".partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream
             AND x.partition % v_count = v_index
             AND x.holder IS DISTINCT FROM v_member
             AND (x.holder IS NULL OR x.holder <> ALL (v_members))
             FOR NO KEY UPDATE SKIP LOCKED);

  RETURN QUERY
    SELECT pc.partition, pc.seq FROM "tidemark".partition_cursors pc
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.holder = v_member
     ORDER BY pc.partition;
END
$$;

--
-- Name: group_partitions(integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.group_partitions(p_cap integer DEFAULT 1000000) RETURNS TABLE(consumer text, stream text, partition integer, partitions integer, holder text, holder_live boolean, seq bigint, lag bigint, moves bigint, updated_at timestamp with time zone)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
  r record;
  v_safe bigint;
BEGIN
  SELECT w.safe_seq INTO v_safe FROM "tidemark".watermark w;
  FOR r IN
    SELECT pc.consumer, pc.stream, pc.partition, g.partitions, pc.holder, pc.seq, pc.moves, pc.updated_at,
           EXISTS (SELECT 1 FROM "tidemark".group_members m
                    WHERE m.consumer = pc.consumer AND m.stream = pc.stream AND m.member = pc.holder
                      AND m.lease_expires_at > pg_catalog.clock_timestamp()) AS live
      FROM "tidemark".partition_cursors pc JOIN "tidemark".groups g ON g.consumer = pc.consumer AND g.stream = pc.stream
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
      'SELECT count(*) FROM (SELECT 1 FROM "tidemark".events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4 LIMIT $5) l', "tidemark".partition_expression('e.key', r.partitions))
      INTO lag
      USING r.stream, r.seq, v_safe, r.partition::pg_catalog.int8, p_cap;
    RETURN NEXT;
  END LOOP;
END
$_$;

--
-- Name: group_partitions_fixed(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.group_partitions_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
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

--
-- Name: key_partition(text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.key_partition(p_key text, p_partitions integer) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: key_partition: partitions must be between 1 and 1024, got %', p_partitions
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN (('x' || pg_catalog.substr(pg_catalog.md5(p_key), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 % p_partitions)::integer;
END
$$;

--
-- Name: leave_group(text, text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.leave_group(p_consumer text, p_stream text, p_member text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_key bigint := "tidemark".checked_cursor_key('leave_group', p_consumer, p_stream);
  v_member text := "tidemark".checked_member('leave_group', p_member);
  v_released integer;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock("tidemark".partition_key(p_consumer, p_stream, -1));
  DELETE FROM "tidemark".group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member = v_member;
  UPDATE "tidemark".partition_cursors pc
     SET holder = NULL, updated_at = pg_catalog.now()
   WHERE (pc.consumer, pc.stream, pc.partition) IN (
          SELECT x.consumer, x.stream, x.partition FROM "tidemark".partition_cursors x
           WHERE x.consumer = p_consumer AND x.stream = p_stream AND x.holder = v_member
             FOR NO KEY UPDATE SKIP LOCKED);
  GET DIAGNOSTICS v_released = ROW_COUNT;
  RETURN v_released;
END
$$;

--
-- Name: lock_cursor(text, text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.lock_cursor(p_function text, p_consumer text, p_stream text) RETURNS tidemark.locked_cursor
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v "tidemark".locked_cursor;
  v_pruned bigint;
  v_page jsonb;
BEGIN
  v.key := "tidemark".checked_cursor_key(p_function, p_consumer, p_stream);
  -- Reading again what this transaction read and did not advance past would
  -- hand the same events over twice.
  v_page := "tidemark".open_page(v.key);
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
  SELECT c.seq INTO v.cursor FROM "tidemark".cursors c
   WHERE c.consumer = p_consumer AND c.stream = p_stream FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    -- First use. Row-level security refuses a consumer the role may not use.
    INSERT INTO "tidemark".cursors (consumer, stream) VALUES (p_consumer, p_stream) ON CONFLICT DO NOTHING;
    SELECT c.seq INTO v.cursor FROM "tidemark".cursors c
     WHERE c.consumer = p_consumer AND c.stream = p_stream FOR NO KEY UPDATE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'tidemark: %: the cursor of consumer % on stream % exists but this role may not use it', p_function, pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The owner grants consumers with SELECT tidemark.grant_consumer(role, ARRAY[consumer]).';
    END IF;
  END IF;
  SELECT w.safe_seq, h.pruned_through_seq INTO v.safe_seq, v_pruned
    FROM "tidemark".watermark w LEFT JOIN "tidemark".horizons h ON h.stream = p_stream;
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

--
-- Name: lock_group(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.lock_group(p_consumer text, p_stream text, p_partitions integer) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  g record;
  v_member text;
  v_prior bigint;
BEGIN
  PERFORM "tidemark".checked_cursor_key('lock_group', p_consumer, p_stream);
  IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: lock_group: partitions must be between 1 and 1024, got %', coalesce(p_partitions::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF pg_catalog.current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN
    RAISE EXCEPTION 'tidemark: lock_group must run in the REPEATABLE READ transaction of the snapshot, not %', pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'TM003';
  END IF;
  PERFORM pg_catalog.pg_advisory_xact_lock("tidemark".partition_key(p_consumer, p_stream, -1));
  PERFORM "tidemark".create_group('lock_group', p_consumer, p_stream, p_partitions);
  SELECT x.partitions, x.next_partitions INTO g FROM "tidemark".groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream;
  IF g.partitions <> p_partitions OR g.next_partitions IS NOT NULL THEN
    RAISE EXCEPTION 'tidemark: lock_group: the group of consumer % on stream % has % partitions, not %', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream), g.partitions,
        p_partitions::text || CASE WHEN g.next_partitions IS NOT NULL THEN pg_catalog.format(' (a re-partition to %s is pending: finish or cancel it first)', g.next_partitions) ELSE '' END
      USING ERRCODE = 'TM007';
  END IF;
  -- The members' leases as they are now (by the clock, read in this
  -- snapshot: a member that joined since is refused at its first page,
  -- since it can take no locked row).
  SELECT m.member INTO v_member FROM "tidemark".group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at > pg_catalog.clock_timestamp()
   ORDER BY m.member LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'tidemark: lock_group: member % of the group of consumer % on stream % holds a live lease: stop the members first', pg_catalog.quote_literal(v_member), pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM001';
  END IF;
  SELECT pg_catalog.min(l.seq) INTO v_prior FROM (
    SELECT x.seq FROM "tidemark".partition_cursors x
     WHERE x.consumer = p_consumer AND x.stream = p_stream
     ORDER BY x.partition
       FOR NO KEY UPDATE NOWAIT) l;
  PERFORM pg_catalog.set_config('tidemark.group_locked', "tidemark".checked_cursor_key('lock_group', p_consumer, p_stream)::text, true);
  RETURN v_prior;
END
$$;

--
-- Name: lock_page(text, text, bigint, bigint, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.lock_page(p_consumer text, p_stream text, p_after bigint, p_through bigint, p_events integer, OUT cursor bigint, OUT safe_seq bigint) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v "tidemark".locked_cursor;
  v_found bigint;
  v_done text;
BEGIN
  v := "tidemark".lock_cursor('lock_page', p_consumer, p_stream);
  cursor := v.cursor;
  safe_seq := v.safe_seq;
  IF v.cursor IS DISTINCT FROM p_after THEN
    v_done := "tidemark".remember_page(v.key, v.cursor, v.cursor, v.safe_seq, v.cursor);
    RETURN;
  END IF;
  IF p_through IS NULL OR p_through <= p_after OR p_through > v.safe_seq OR p_events IS NULL OR p_events < 1 THEN
    RAISE EXCEPTION 'tidemark: lock_page: through must be above after (%) and at most safe_seq (%), and events positive; got through %, events %',
        p_after, v.safe_seq, coalesce(p_through::text, 'NULL'), coalesce(p_events::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT pg_catalog.count(*) INTO v_found FROM "tidemark".events e
   WHERE e.stream = p_stream AND e.seq > p_after AND e.seq <= p_through;
  IF v_found <> p_events THEN
    RAISE EXCEPTION 'tidemark: lock_page: stream % holds % events in (%, %], not %: the events read ahead are not this page''s',
        pg_catalog.quote_literal(p_stream), v_found, p_after, p_through, p_events
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Read ahead with one statement bounded by safe_seq, or call read_page.';
  END IF;
  v_done := "tidemark".remember_page(v.key, v.cursor, p_through, v.safe_seq, p_through);
END
$$;

--
-- Name: lock_partition(text, text, text, integer, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.lock_partition(p_function text, p_consumer text, p_stream text, p_partition integer, p_member text, OUT key bigint, OUT cursor bigint, OUT safe_seq bigint, OUT partitions integer) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_member text := "tidemark".checked_member(p_function, p_member);
  v_holder text;
  v_ttl_ms integer;
  v_live integer;
  v_index integer;
  v_page jsonb;
  v_pruned bigint;
  v_barrier bigint;
BEGIN
  PERFORM "tidemark".checked_cursor_key(p_function, p_consumer, p_stream);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: %: partition must be 0 or more, got %', p_function, coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  key := "tidemark".partition_key(p_consumer, p_stream, p_partition);
  v_page := "tidemark".open_page(key);
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
    FROM "tidemark".group_members m
   WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.lease_expires_at > pg_catalog.clock_timestamp();
  SELECT pc.holder INTO v_holder FROM "tidemark".partition_cursors pc
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
    FROM "tidemark".partition_cursors pc JOIN "tidemark".groups g ON g.consumer = pc.consumer AND g.stream = pc.stream
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
    FROM "tidemark".watermark w LEFT JOIN "tidemark".horizons h ON h.stream = p_stream;
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

--
-- Name: note_resync(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.note_resync(p_consumer text, p_stream text) RETURNS TABLE(cursor bigint, pruned_through bigint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  v_key bigint := "tidemark".checked_cursor_key('note_resync', p_consumer, p_stream);
BEGIN
  RETURN QUERY
    UPDATE "tidemark".cursors c
       SET resync_count = c.resync_count + 1, last_resync_at = pg_catalog.now()
      FROM "tidemark".horizons h
     WHERE c.consumer = p_consumer AND c.stream = p_stream
       AND h.stream = p_stream AND h.pruned_through_seq > c.seq
    RETURNING c.seq, h.pruned_through_seq;
END
$$;

--
-- Name: open_page(bigint); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.open_page(p_key bigint) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_page jsonb := "tidemark".open_pages() -> p_key::text;
BEGIN
  -- An entry of another transaction (a value SET for the session by hand)
  -- is no page.
  IF (v_page ->> 5) = pg_catalog.pg_current_xact_id_if_assigned()::text THEN
    RETURN v_page;
  END IF;
  RETURN NULL;
END
$$;

--
-- Name: open_pages(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.open_pages() RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RETURN coalesce(nullif(pg_catalog.current_setting('tidemark.pages', true), '')::jsonb, '{}'::jsonb);
END
$$;

--
-- Name: others_lease_end_ms(text, text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.others_lease_end_ms(p_consumer text, p_stream text, p_member text) RETURNS double precision
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RETURN (SELECT pg_catalog.date_part('epoch', pg_catalog.min(m.lease_expires_at) - pg_catalog.clock_timestamp()) * 1000
            FROM "tidemark".group_members m
           WHERE m.consumer = p_consumer AND m.stream = p_stream AND m.member <> p_member);
END
$$;

--
-- Name: page_info(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.page_info(p_consumer text, p_stream text) RETURNS TABLE(cursor bigint, through bigint, advanced_to bigint, safe_seq bigint)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_page jsonb := "tidemark".open_page("tidemark".cursor_lock_key(p_consumer, p_stream));
BEGIN
  IF v_page IS NOT NULL THEN
    RETURN QUERY SELECT (v_page ->> 0)::bigint, (v_page ->> 1)::bigint, (v_page ->> 2)::bigint, (v_page ->> 3)::bigint;
  END IF;
END
$$;

--
-- Name: partition_expression(text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_expression(p_column text, p_partitions integer) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'pg_temp'
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

--
-- Name: partition_fence(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_fence() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF NEW.holder IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM "tidemark".group_members m
        WHERE m.consumer = NEW.consumer AND m.stream = NEW.stream AND m.member = NEW.holder
          AND m.lease_expires_at > pg_catalog.clock_timestamp()) THEN
    RAISE EXCEPTION 'tidemark: partition % of consumer % on stream % moved at COMMIT after the lease of member % ended', NEW.partition,
        pg_catalog.quote_literal(NEW.consumer), pg_catalog.quote_literal(NEW.stream), pg_catalog.quote_literal(NEW.holder)
      USING ERRCODE = 'TM008';
  END IF;
  RETURN NULL;
END
$$;

--
-- Name: partition_index_ddl(integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_index_ddl(p_partitions integer) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  IF p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: partition_index_ddl: partitions must be between 1 and 1024, got %', p_partitions
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN pg_catalog.format(
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON "tidemark".events (stream, %s, seq)',
    'events_partition_' || p_partitions, "tidemark".partition_expression('key', p_partitions));
END
$$;

--
-- Name: partition_index_state(integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_index_state(p_partitions integer, OUT ddl text, OUT present boolean, OUT valid boolean) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  ddl := "tidemark".partition_index_ddl(p_partitions);
  SELECT true, i.indisvalid INTO present, valid
    FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
   WHERE c.relname = 'events_partition_' || p_partitions::text
     AND c.relnamespace = '"tidemark"'::pg_catalog.regnamespace;
  present := coalesce(present, false);
  valid := coalesce(valid, false);
END
$$;

--
-- Name: partition_key(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_key(p_consumer text, p_stream text, p_partition integer) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RETURN pg_catalog.hashtextextended(
    ('partition:' || p_partition::text || ':' || pg_catalog.length(p_consumer)::text || ':' || p_consumer || p_stream) COLLATE "C",
    (-8344625403455539058)::bigint);
END
$$;

--
-- Name: partition_page_info(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_page_info(p_consumer text, p_stream text, p_partition integer) RETURNS TABLE(cursor bigint, through bigint, advanced_to bigint, safe_seq bigint)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_page jsonb := "tidemark".open_page("tidemark".partition_key(p_consumer, p_stream, p_partition));
BEGIN
  IF v_page IS NOT NULL THEN
    RETURN QUERY SELECT (v_page ->> 0)::bigint, (v_page ->> 1)::bigint, (v_page ->> 2)::bigint, (v_page ->> 3)::bigint;
  END IF;
END
$$;

--
-- Name: partition_replay(text, text, integer, text, bigint[]); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.partition_replay(p_consumer text, p_stream text, p_partition integer, p_member text, p_tried bigint[]) RETURNS TABLE(id bigint, attempts integer, seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  v record;
BEGIN
  SELECT * INTO v FROM "tidemark".lock_partition('partition_replay', p_consumer, p_stream, p_partition, p_member);
  UPDATE "tidemark".partition_cursors pc SET seq = pc.seq
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition;
  RETURN QUERY
    SELECT d.id, d.attempts, d.seq, d.kind, d.key, d.payload, d.headers, d.occurred_at
      FROM "tidemark".dead_letters d
     WHERE d.consumer = p_consumer AND d.stream = p_stream AND d.partition = p_partition
       AND d.replay_requested_at IS NOT NULL AND d.seq <= v.cursor
       AND d.id <> ALL (coalesce(p_tried, '{}'::pg_catalog.int8[]))
     ORDER BY d.seq
     LIMIT 1
       FOR UPDATE OF d SKIP LOCKED;
END
$$;

--
-- Name: read_page(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.read_page(p_consumer text, p_stream text, p_max_events integer) RETURNS TABLE(seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  v "tidemark".locked_cursor;
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
  v := "tidemark".lock_cursor('read_page', p_consumer, p_stream);
  RETURN QUERY
    SELECT e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at
      FROM "tidemark".events e
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
    SELECT e.seq INTO v_last FROM "tidemark".events e
     WHERE e.stream = p_stream AND e.seq > v.cursor AND e.seq <= v.safe_seq
     ORDER BY e.seq OFFSET v_count - 1 LIMIT 1;
  END IF;
  -- A short page returned every event up to safe_seq: the cursor may go
  -- there. A full page may reach its last event only.
  v_through := CASE WHEN v_count < p_max_events THEN v.safe_seq ELSE v_last END;
  v_done := "tidemark".remember_page(v.key, v.cursor, v_through, v.safe_seq, v_last);
END
$$;

--
-- Name: read_partition_page(text, text, integer, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.read_partition_page(p_consumer text, p_stream text, p_partition integer, p_member text, p_max_events integer) RETURNS TABLE(seq bigint, kind text, key text, payload jsonb, headers jsonb, occurred_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
  SELECT * INTO v FROM "tidemark".lock_partition('read_partition_page', p_consumer, p_stream, p_partition, p_member);
  -- The count is a literal, so the group's partition index (when created)
  -- matches: one range scan.
  RETURN QUERY EXECUTE pg_catalog.format(
    'SELECT e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at FROM "tidemark".events e
      WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4
      ORDER BY e.seq LIMIT $5', "tidemark".partition_expression('e.key', v.partitions))
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
    UPDATE "tidemark".partition_cursors pc SET seq = v.safe_seq, updated_at = pg_catalog.now()
     WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition
       AND pc.seq = v.cursor AND v.safe_seq > v.cursor
       AND pc.updated_at < pg_catalog.now() - interval '10 seconds';
    IF FOUND THEN
      v.cursor := v.safe_seq;
      v_last := v.safe_seq;
    END IF;
  ELSE
    EXECUTE pg_catalog.format(
      'SELECT e.seq FROM "tidemark".events e
        WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4
        ORDER BY e.seq OFFSET $5 LIMIT 1', "tidemark".partition_expression('e.key', v.partitions))
      INTO v_last
      USING p_stream, v.cursor, v.safe_seq, p_partition::pg_catalog.int8, v_count - 1;
  END IF;
  -- A short page returned every event of the partition up to safe_seq.
  v_through := CASE WHEN v_count < p_max_events THEN v.safe_seq ELSE v_last END;
  SELECT w.safe_seq INTO v_safe FROM "tidemark".watermark w;
  v_done := "tidemark".remember_page(v.key, v.cursor, v_through, v_safe, v_last);
END
$_$;

--
-- Name: record_dead_letter(text, text, bigint, integer, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.record_dead_letter(p_consumer text, p_stream text, p_seq bigint, p_attempts integer, p_error text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_page jsonb;
  v_id   bigint;
BEGIN
  v_page := "tidemark".open_page("tidemark".checked_cursor_key('record_dead_letter', p_consumer, p_stream));
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
  IF EXISTS (SELECT 1 FROM "tidemark".events e
              WHERE e.stream = p_stream AND e.seq > (v_page ->> 2)::bigint AND e.seq < p_seq) THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: seq % is not the next event above the cursor (at %): apply the events before it and advance past them first', p_seq, v_page ->> 2
      USING ERRCODE = 'TM005';
  END IF;
  IF p_attempts IS NULL OR p_attempts < 1 OR p_error IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: attempts must be at least 1 and the error given (got %, %)',
        coalesce(p_attempts::text, 'NULL'), CASE WHEN p_error IS NULL THEN 'NULL' ELSE 'an error' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  INSERT INTO "tidemark".dead_letters AS d (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error)
  SELECT p_consumer, p_stream, e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at, p_attempts, pg_catalog.left(p_error, 8192)
    FROM "tidemark".events e
   WHERE e.seq = p_seq AND e.stream = p_stream
  ON CONFLICT (consumer, stream, seq) DO UPDATE
     SET attempts = d.attempts + excluded.attempts, last_error = excluded.last_error,
         dead_at = pg_catalog.now(), replay_requested_at = NULL
  RETURNING d.id INTO v_id;
  IF v_id IS NULL THEN
    RAISE EXCEPTION 'tidemark: record_dead_letter: stream % has no event %', pg_catalog.quote_literal(p_stream), p_seq
      USING ERRCODE = 'TM005';
  END IF;
  PERFORM "tidemark".advance_cursor(p_consumer, p_stream, p_seq);
  RETURN v_id;
END
$$;

--
-- Name: record_partition_dead_letter(text, text, integer, text, bigint, integer, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.record_partition_dead_letter(p_consumer text, p_stream text, p_partition integer, p_member text, p_seq bigint, p_attempts integer, p_error text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
  v_page jsonb;
  v_partitions integer;
  v_before boolean;
  v_id bigint;
BEGIN
  PERFORM "tidemark".checked_cursor_key('record_partition_dead_letter', p_consumer, p_stream);
  PERFORM "tidemark".checked_member('record_partition_dead_letter', p_member);
  IF p_partition IS NULL OR p_partition < 0 THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: partition must be 0 or more, got %', coalesce(p_partition::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_page := "tidemark".open_page("tidemark".partition_key(p_consumer, p_stream, p_partition));
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
  SELECT g.partitions INTO v_partitions FROM "tidemark".groups g
   WHERE g.consumer = p_consumer AND g.stream = p_stream;
  -- The event is this partition's, and its next one above the cursor (the
  -- events before it applied and advanced past): one range scan of the
  -- partition index when it exists.
  IF NOT EXISTS (SELECT 1 FROM "tidemark".events e
                  WHERE e.stream = p_stream AND e.seq = p_seq
                    AND "tidemark".key_partition(e.key, v_partitions) = p_partition) THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: seq % is not an event of partition % of stream %', p_seq, p_partition, pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM005';
  END IF;
  EXECUTE pg_catalog.format(
    'SELECT EXISTS (SELECT 1 FROM "tidemark".events e
      WHERE e.stream = $1 AND e.seq > $2 AND e.seq < $3 AND %s = $4)', "tidemark".partition_expression('e.key', v_partitions))
    INTO v_before
    USING p_stream, (v_page ->> 2)::bigint, p_seq, p_partition::pg_catalog.int8;
  IF v_before THEN
    RAISE EXCEPTION 'tidemark: record_partition_dead_letter: seq % is not the next event of partition % above its cursor (at %): apply the events before it and advance past them first', p_seq, p_partition, v_page ->> 2
      USING ERRCODE = 'TM005';
  END IF;
  -- The cursor's move first: the fence (refused, and the transaction with
  -- it, unless p_member holds the partition under a live lease), and the
  -- dead letter is then at the cursor, as the insert's trigger requires.
  PERFORM "tidemark".advance_partition(p_consumer, p_stream, p_partition, p_member, p_seq);
  INSERT INTO "tidemark".dead_letters AS d (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error)
  SELECT p_consumer, p_stream, e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at, p_attempts, pg_catalog.left(p_error, 8192)
    FROM "tidemark".events e
   WHERE e.seq = p_seq AND e.stream = p_stream
  ON CONFLICT (consumer, stream, seq) DO UPDATE
     SET attempts = d.attempts + excluded.attempts, last_error = excluded.last_error,
         dead_at = pg_catalog.now(), replay_requested_at = NULL
  RETURNING d.id INTO v_id;
  RETURN v_id;
END
$_$;

--
-- Name: refuse_event(text, bigint, bigint, text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.refuse_event(p_column text, p_size bigint, p_limit bigint, p_unit text, p_constraint text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RAISE EXCEPTION 'tidemark events.%: % %, over the limit of %', p_column, p_size, p_unit, p_limit
    USING ERRCODE = 'check_violation',
          COLUMN = p_column,
          TABLE = 'events',
          CONSTRAINT = p_constraint,
          HINT = 'Every writer is held to the same limits: see "Event limits" in the tidemark README.';
END
$$;

--
-- Name: reject_event_update(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.reject_event_update() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RAISE EXCEPTION 'tidemark events are immutable: UPDATE on %.events is not allowed', TG_TABLE_SCHEMA
    USING ERRCODE = 'feature_not_supported',
          HINT = 'Append a new event instead.';
END
$$;

--
-- Name: release_lease(text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.release_lease(p_owner text) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
  WITH released AS (
    UPDATE "tidemark".watermark w SET lease_owner = NULL, lease_expires_at = NULL
     WHERE w.lease_owner = p_owner RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM released)
$$;

--
-- Name: release_owner(text, text); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.release_owner(p_owner text, p_instance text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  c record;
BEGIN
  PERFORM 1 FROM "tidemark".watermark w FOR NO KEY UPDATE;
  SELECT x.instance INTO c
    FROM "tidemark".owner_claims x
   WHERE x.owner = p_owner
     FOR UPDATE;
  IF FOUND AND c.instance IS DISTINCT FROM p_instance THEN
    RETURN false;
  END IF;
  DELETE FROM "tidemark".owner_claims x WHERE x.owner = p_owner;
  RETURN "tidemark".release_lease(p_owner);
END
$$;

--
-- Name: remember_page(bigint, bigint, bigint, bigint, bigint); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.remember_page(p_key bigint, p_cursor bigint, p_through bigint, p_safe_seq bigint, p_read_to bigint) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  RETURN pg_catalog.set_config('tidemark.pages',
    ("tidemark".open_pages() || pg_catalog.jsonb_build_object(p_key::text,
      pg_catalog.jsonb_build_array(p_cursor, p_through, p_cursor, p_safe_seq, p_read_to, pg_catalog.pg_current_xact_id()::text)))::text,
    true);
END
$$;

--
-- Name: repartition_group(text, text, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.repartition_group(p_consumer text, p_stream text, p_partitions integer) RETURNS tidemark.repartition_state
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  g record;
  v_safe bigint;
BEGIN
  PERFORM "tidemark".checked_cursor_key('repartition_group', p_consumer, p_stream);
  IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 1024 THEN
    RAISE EXCEPTION 'tidemark: repartition_group: partitions must be between 1 and 1024, got %', coalesce(p_partitions::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- The groups row serialises requests and switches (finish_repartition
  -- takes it after the partition rows, and this takes no other lock).
  SELECT x.partitions, x.next_partitions, x.barrier INTO g FROM "tidemark".groups x
   WHERE x.consumer = p_consumer AND x.stream = p_stream
     FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark: repartition_group: consumer % on stream % is not a group', pg_catalog.quote_literal(p_consumer), pg_catalog.quote_literal(p_stream)
      USING ERRCODE = 'TM007',
            HINT = 'A group is created by its first member (tail --partitions N, StreamClient.tailGroup, group_beat).';
  END IF;
  IF p_partitions = g.partitions THEN
    UPDATE "tidemark".groups x SET next_partitions = NULL, barrier = NULL
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  ELSIF g.next_partitions IS NOT NULL THEN
    UPDATE "tidemark".groups x SET next_partitions = p_partitions
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  ELSE
    SELECT w.safe_seq INTO v_safe FROM "tidemark".watermark w;
    UPDATE "tidemark".groups x SET next_partitions = p_partitions, barrier = v_safe
     WHERE x.consumer = p_consumer AND x.stream = p_stream;
  END IF;
  RETURN (SELECT ROW(x.partitions, x.next_partitions, x.barrier, x.since_seq, NULL)::"tidemark".repartition_state
            FROM "tidemark".groups x WHERE x.consumer = p_consumer AND x.stream = p_stream);
END
$$;

--
-- Name: run_watermarker(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer, boolean, boolean, text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, double precision, double precision, double precision, integer[], bigint, boolean, text, timestamp with time zone, timestamp with time zone); Type: PROCEDURE; Schema: tidemark; Owner: -
--

CREATE PROCEDURE tidemark.run_watermarker(IN p_owner text, IN p_run_ms integer DEFAULT 60000, IN p_lease_ttl_ms integer DEFAULT 10000, IN p_lease_renew_ms integer DEFAULT NULL::integer, IN p_poll_min_ms integer DEFAULT 1, IN p_poll_max_ms integer DEFAULT 100, IN p_idle_grace_ms integer DEFAULT 1000, IN p_synchronous_commit boolean DEFAULT false, IN p_try_lock boolean DEFAULT true, IN p_max_steps_per_second integer DEFAULT 100, IN p_sleep boolean DEFAULT false, IN p_resume boolean DEFAULT false, INOUT reason text DEFAULT NULL::text, INOUT steps bigint DEFAULT NULL::bigint, INOUT polls bigint DEFAULT NULL::bigint, INOUT advanced bigint DEFAULT NULL::bigint, INOUT pending bigint DEFAULT NULL::bigint, INOUT idle bigint DEFAULT NULL::bigint, INOUT try_lock_reads bigint DEFAULT NULL::bigint, INOUT pg_locks_reads bigint DEFAULT NULL::bigint, INOUT pg_locks_read_us_total double precision DEFAULT NULL::double precision, INOUT step_us_total double precision DEFAULT NULL::double precision, INOUT step_us_max double precision DEFAULT NULL::double precision, INOUT step_us_hist integer[] DEFAULT NULL::integer[], INOUT safe_seq bigint DEFAULT NULL::bigint, INOUT leader boolean DEFAULT NULL::boolean, INOUT lease_owner text DEFAULT NULL::text, INOUT lease_expires_at timestamp with time zone DEFAULT NULL::timestamp with time zone, INOUT oldest_pending_at timestamp with time zone DEFAULT NULL::timestamp with time zone)
    LANGUAGE plpgsql
    AS $$
DECLARE
  r "tidemark".watermarker_loop;
BEGIN
  r := "tidemark".watermarker_start(p_owner, p_run_ms, p_lease_ttl_ms, p_lease_renew_ms, p_poll_min_ms, p_poll_max_ms,
                                    p_idle_grace_ms, p_synchronous_commit, p_try_lock, p_max_steps_per_second,
                                    p_sleep, p_resume);
  LOOP
    r := "tidemark".watermarker_tick(r);
    -- Every turn commits: a step is published at once, and the next turn
    -- sleeps (first thing) in a transaction that holds no lock.
    COMMIT;
    r.committed_at := pg_catalog.clock_timestamp();
    EXIT WHEN r.done;
  END LOOP;
  r := "tidemark".watermarker_finish(r);
  reason := r.reason;
  steps := r.steps;
  polls := r.polls;
  advanced := r.advanced;
  pending := r.pending;
  idle := r.idle;
  try_lock_reads := r.try_lock_reads;
  pg_locks_reads := r.pg_locks_reads;
  pg_locks_read_us_total := r.pg_locks_read_us_total;
  step_us_total := r.step_us_total;
  step_us_max := r.step_us_max;
  step_us_hist := r.step_us_hist;
  safe_seq := r.safe_seq;
  leader := r.leader;
  lease_owner := r.lease_owner;
  lease_expires_at := r.lease_expires_at;
  oldest_pending_at := r.oldest_pending_at;
END
$$;

--
-- Name: set_group_cursors(text, text, bigint); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.set_group_cursors(p_consumer text, p_stream text, p_seq bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_key bigint := "tidemark".checked_cursor_key('set_group_cursors', p_consumer, p_stream);
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
  UPDATE "tidemark".partition_cursors pc SET seq = p_seq, holder = NULL, updated_at = pg_catalog.now()
   WHERE pc.consumer = p_consumer AND pc.stream = p_stream;
END
$$;

--
-- Name: take_shared_fence(); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.take_shared_fence() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared((-8344625403455539058)::bigint);
  IF pg_catalog.pg_sequence_last_value('"tidemark".wake'::pg_catalog.regclass)
     > pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000 THEN
    -- The loop never sleeps where a transaction may be prepared (PREPARE
    -- refuses one that has notified), so this is only a guard. A queue at
    -- half its size is left alone, as the step's NOTIFY does: a full one
    -- would make this commit fail; the loop wakes by itself within a run.
    IF pg_catalog.current_setting('max_prepared_transactions')::integer = 0
       AND pg_catalog.pg_notification_queue_usage() < 0.5 THEN
      PERFORM pg_catalog.pg_notify('tidemark_wake', '');
    END IF;
  END IF;
  RETURN NULL;
END
$$;

--
-- Name: watermark_step(text, boolean, boolean); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermark_step(p_owner text, p_synchronous_commit boolean DEFAULT false, p_try_lock boolean DEFAULT true) RETURNS TABLE(outcome text, safe_seq bigint, prior_seq bigint, last_seq bigint, holders integer, pending integer, holder_path text, holder_read_us double precision, oldest_pending_at timestamp with time zone, lease_owner text, lease_expires_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  w          record;
  v_epoch    timestamptz := pg_catalog.pg_postmaster_start_time();
  v_cands    "tidemark".watermark_candidate[];
  v_s        bigint;
  v_h        text[];
  v_orphan   boolean := false;
  v_free     boolean := false;
  v_path     text;
  v_read_us  double precision;
  v_t        timestamptz;
  v_rewound  boolean := false;
  v_drop     integer;
  v_gap      interval;
  v_file     oid;
  v_params   record;
  v_lock_timeout text;
  v_publish  bigint;
  v_keep     integer := 1;
  v_new      bigint;
  v_owner    text;
  v_expires  timestamptz;
BEGIN
  -- Each statement below must see the watermark row as committed when it
  -- runs: only READ COMMITTED takes a fresh snapshot per statement.
  IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'tidemark watermark_step must run in READ COMMITTED, not %',
      pg_catalog.current_setting('transaction_isolation')
      USING ERRCODE = 'invalid_transaction_state';
  END IF;

  -- (1) S, with the row: every seq <= S was drawn before this read, by a
  -- writer that took the shared fence before drawing it.
  -- pg_sequence_last_value reads the tuple under the buffer lock (a plain
  -- SELECT from the sequence may pair a torn last_value and is_called); it
  -- is NULL while the sequence has handed out nothing since it was created
  -- or last set. It also locks the sequence (RowExclusiveLock) to the end
  -- of this transaction: no ALTER SEQUENCE can commit until then, and the
  -- lock's acquisition processed the invalidations of any that committed
  -- before.
  SELECT x.safe_seq, x.lease_owner, x.lease_expires_at, x.candidates, x.candidates_epoch, x.seq_filenode, x.seq_high,
         pg_catalog.pg_sequence_last_value('"tidemark".events_seq_seq'::regclass) AS s
    INTO w FROM "tidemark".watermark x;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark watermark row is missing in %; was the schema migrated?', '"tidemark"'
      USING ERRCODE = 'undefined_object';
  END IF;
  IF w.lease_owner IS DISTINCT FROM p_owner OR w.lease_expires_at <= pg_catalog.clock_timestamp() THEN
    RETURN QUERY SELECT 'not_leader', w.safe_seq, w.safe_seq, NULL::bigint, NULL::integer,
      pg_catalog.cardinality(w.candidates), NULL::text, NULL::float8, NULL::timestamptz, w.lease_owner, w.lease_expires_at;
    RETURN;
  END IF;
  -- Candidates of another server lifetime are void: after a restart, a
  -- prepared transaction's lock shows under another virtualtransaction id.
  v_cands := CASE WHEN w.candidates_epoch IS NOT DISTINCT FROM v_epoch THEN w.candidates ELSE '{}' END;

  v_s := w.s;
  IF v_s IS NULL THEN
    -- PostgreSQL 18 answers NULL, instead of an error, to a role that may
    -- not read the sequence: that must not read as "nothing drawn".
    IF NOT pg_catalog.has_sequence_privilege('"tidemark".events_seq_seq', 'SELECT') THEN
      RAISE EXCEPTION 'tidemark: role % may not read the identity sequence %.events_seq_seq', current_user, '"tidemark"'
        USING ERRCODE = 'insufficient_privilege', HINT = 'Run the watermarker as the owner of the tidemark schema.';
    END IF;
    -- Nothing handed out since the sequence was created or last set
    -- (RESTART, setval(..., false)): its last_value is the next number it
    -- hands out, R. S is R - 1: no number at or below it is handed out
    -- from now on, and every one drawn before was drawn before this read.
    -- R at or below seq_high hands out numbers a step saw drawn: a rewind,
    -- found below. Read from the relation: a nextval between the two
    -- reads turns is_called true and leaves last_value at R; later ones
    -- raise it, and S then is still a number drawn before this read. The
    -- read is one aligned 8-byte field, never a torn value.
    SELECT q.last_value - 1 INTO v_s FROM "tidemark".events_seq_seq q;
  END IF;
  IF v_s < w.seq_high THEN
    -- Set back since a step saw seq_high: writers may draw numbers again
    -- that some remembered observation covers without their being in its
    -- holders. Drop them all; start again from what this step sees.
    v_rewound := true;
    v_cands := '{}';
  ELSIF v_s < w.safe_seq THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq is at %, below safe_seq %', '"tidemark"', v_s, w.safe_seq
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'It was set back (setval, ALTER SEQUENCE ... RESTART, TRUNCATE ... RESTART IDENTITY) and hands out published numbers again: consumers already past them skip those events. Nothing was published.',
            HINT = 'Set it to at least safe_seq with setval (events appended since the rewind at or below safe_seq need a consumer resync), and never set it back.';
  ELSIF v_s = w.safe_seq THEN
    -- Nothing drawn above safe_seq: no lock read, nothing written.
    RETURN QUERY SELECT 'idle', w.safe_seq, w.safe_seq, v_s, NULL::integer, 0, NULL::text, NULL::float8,
      NULL::timestamptz, w.lease_owner, w.lease_expires_at;
    RETURN;
  END IF;

  -- (2) H, read after S. A writer that drew a seq <= S and has not ended
  -- still holds its shared lock, so it is in H; one that is gone has
  -- released it, which PostgreSQL does only after the transaction left the
  -- proc array (visible if committed). Cheap path first: a session-level
  -- exclusive try-lock never queues; granted, it proves H empty, and it is
  -- released in the same expression (CASE fixes the order).
  IF p_try_lock AND NOT v_rewound THEN
    v_free := CASE WHEN pg_catalog.pg_try_advisory_lock((-8344625403455539058)::bigint)
                   THEN pg_catalog.pg_advisory_unlock((-8344625403455539058)::bigint) ELSE false END;
  END IF;
  IF v_rewound THEN
    v_h := '{}';
  ELSIF v_free THEN
    v_h := '{}';
    v_path := 'try_lock';
  ELSE
    -- Holds every lock-manager partition while it copies the lock table:
    -- the loop spaces these reads by their duration (watermarker_tick).
    v_t := pg_catalog.clock_timestamp();
    SELECT coalesce(pg_catalog.array_agg(l.virtualtransaction ORDER BY l.virtualtransaction), '{}'),
           coalesce(pg_catalog.bool_or(l.pid IS NULL), false)
      INTO v_h, v_orphan
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
       AND l.classid = ((((-8344625403455539058)::bigint) >> 32) & 4294967295)::oid
       AND l.objid = (((-8344625403455539058)::bigint) & 4294967295)::oid
       AND l.objsubid = 1
       AND l.mode = 'ShareLock'
       AND l.granted;
    v_path := 'pg_locks';
    v_read_us := extract(epoch FROM pg_catalog.clock_timestamp() - v_t) * 1e6;
  END IF;

  -- (3) The identity's conditions, every step: CACHE 1 (a session cache
  -- hands out numbers below S later), increasing, no cycle; and its
  -- relfilenode, which any ALTER SEQUENCE changes. Both from the caches,
  -- current under the lock taken with S (an ALTER waits for it, and its
  -- acquisition processed the invalidations of any committed before).
  v_file := pg_catalog.pg_relation_filenode('"tidemark".events_seq_seq'::regclass);
  v_params := pg_catalog.pg_sequence_parameters('"tidemark".events_seq_seq'::regclass);
  IF v_params.cache_size <> 1 OR v_params.increment <= 0 OR v_params.cycle_option THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq must be CACHE 1, INCREMENT > 0, NO CYCLE (it is CACHE %, INCREMENT %, %)',
      '"tidemark"', v_params.cache_size, v_params.increment, CASE WHEN v_params.cycle_option THEN 'CYCLE' ELSE 'NO CYCLE' END
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'A cached or cycling sequence can hand out a number below one already seen. Nothing was published.',
            HINT = 'ALTER SEQUENCE ' || '"tidemark"' || '.events_seq_seq CACHE 1 INCREMENT 1 NO CYCLE';
  END IF;

  IF v_rewound THEN
    NULL;  -- publish nothing; remember nothing taken before the rewind
  ELSIF v_file IS DISTINCT FROM w.seq_filenode THEN
    -- ALTER SEQUENCE ran since the candidates (and this step's S) were
    -- taken, maybe under another CACHE: drop them all, publish nothing.
    v_cands := '{}';
  ELSIF pg_catalog.cardinality(v_h) = 0 THEN
    -- No writer in flight: every seq <= S has ended.
    v_publish := v_s;
    v_cands := '{}';
  ELSE
    -- A holder with no backend (a prepared transaction) may have held the
    -- fence under another virtualtransaction id before PREPARE: it blocks
    -- every candidate until it resolves.
    IF NOT v_orphan THEN
      -- Oldest first. A candidate is safe once none of its holders remains.
      -- Publishable candidates form a prefix: a holder still present now
      -- was present at every later candidate too.
      WHILE v_keep <= pg_catalog.cardinality(v_cands)
            AND NOT ((v_cands[v_keep]).holders OPERATOR(pg_catalog.&&) v_h) LOOP
        v_publish := (v_cands[v_keep]).seq;
        v_keep := v_keep + 1;
      END LOOP;
      v_cands := v_cands[v_keep:];
    END IF;
    -- Remember (S, H), unless the newest candidate already covers S (an
    -- older observation of the same S clears no later than a newer one).
    -- At most 32: when full, drop the inner one whose neighbours are
    -- closest in time, so those kept stay spread over the wait (dropping
    -- any candidate is safe: it only delays).
    IF pg_catalog.cardinality(v_cands) = 0 OR (v_cands[pg_catalog.cardinality(v_cands)]).seq < v_s THEN
      IF pg_catalog.cardinality(v_cands) >= 32 THEN
        v_drop := 2;
        FOR i IN 2 .. pg_catalog.cardinality(v_cands) - 1 LOOP
          IF v_gap IS NULL OR (v_cands[i + 1]).taken_at - (v_cands[i - 1]).taken_at < v_gap THEN
            v_gap := (v_cands[i + 1]).taken_at - (v_cands[i - 1]).taken_at;
            v_drop := i;
          END IF;
        END LOOP;
        v_cands := v_cands[1:v_drop - 1] OPERATOR(pg_catalog.||) v_cands[v_drop + 1:];
      END IF;
      v_cands := v_cands OPERATOR(pg_catalog.||) ROW(v_s, v_h, pg_catalog.clock_timestamp())::"tidemark".watermark_candidate;
    END IF;
  END IF;

  IF v_publish > w.safe_seq
     OR v_rewound
     OR v_s > w.seq_high
     OR NOT (v_cands OPERATOR(pg_catalog.=) w.candidates)
     OR w.candidates_epoch IS DISTINCT FROM v_epoch
     OR w.seq_filenode IS DISTINCT FROM v_file THEN
    IF NOT p_synchronous_commit THEN
      -- Safe: a publication lost in a crash only hides events (PROTOCOL.md).
      PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    -- Monotonic, and only under a lease still live once the row is ours.
    -- Only a takeover or a release holds the row, for moments; an
    -- operator's SELECT ... FOR UPDATE makes the step fail after 200 ms.
    v_lock_timeout := pg_catalog.current_setting('lock_timeout');
    PERFORM pg_catalog.set_config('lock_timeout', '200', true);
    UPDATE "tidemark".watermark x
       SET safe_seq = greatest(x.safe_seq, coalesce(v_publish, 0)),
           updated_at = CASE WHEN v_publish > x.safe_seq THEN pg_catalog.clock_timestamp() ELSE x.updated_at END,
           candidates = v_cands,
           candidates_epoch = v_epoch,
           seq_filenode = coalesce(v_file, x.seq_filenode),
           seq_high = CASE WHEN v_rewound THEN v_s ELSE greatest(x.seq_high, v_s) END
     WHERE x.lease_owner = p_owner AND x.lease_expires_at > pg_catalog.clock_timestamp()
    RETURNING x.safe_seq, x.lease_owner, x.lease_expires_at INTO v_new, v_owner, v_expires;
    -- Only the row wait is bounded: the COMMIT that follows may wait for
    -- the cluster-wide notify lock (another session's NOTIFY commit), and a
    -- timeout there would lose the publication.
    PERFORM pg_catalog.set_config('lock_timeout', v_lock_timeout, true);
    IF NOT FOUND THEN
      SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO v_new, v_owner, v_expires FROM "tidemark".watermark x;
      RETURN QUERY SELECT 'not_leader', v_new, w.safe_seq, v_s, pg_catalog.cardinality(v_h),
        pg_catalog.cardinality(w.candidates), v_path, v_read_us, NULL::timestamptz, v_owner, v_expires;
      RETURN;
    END IF;
    IF v_rewound THEN
      RAISE WARNING 'tidemark: the identity sequence %.events_seq_seq went back from % to %; remembered observations were dropped', '"tidemark"', w.seq_high, v_s
        USING DETAIL = 'Something set it back (setval, ALTER SEQUENCE ... RESTART, TRUNCATE ... RESTART IDENTITY). Nothing was published by this step.',
              HINT = 'Never set the identity back: a rewind undone before the next step goes unnoticed and can lose events.';
      RETURN QUERY SELECT 'rewound', v_new, w.safe_seq, v_s, 0, 0, NULL::text, NULL::float8, NULL::timestamptz, v_owner, v_expires;
      RETURN;
    END IF;
    IF v_new > w.safe_seq THEN
      -- Sent at this transaction's commit, with the publication. Only a
      -- hint: skipped when the cluster's notification queue is half full (a
      -- listener stuck in a transaction anywhere), since a full queue would
      -- make this commit, and so the publication, fail.
      IF pg_catalog.pg_notification_queue_usage() < 0.5 THEN
        PERFORM pg_catalog.pg_notify('tidemark_watermark', v_new::text);
      END IF;
      RETURN QUERY SELECT 'advanced', v_new, w.safe_seq, v_s, pg_catalog.cardinality(v_h),
        pg_catalog.cardinality(v_cands), v_path, v_read_us, (v_cands[1]).taken_at, v_owner, v_expires;
      RETURN;
    END IF;
  END IF;
  RETURN QUERY SELECT 'pending', w.safe_seq, w.safe_seq, v_s, pg_catalog.cardinality(v_h),
    pg_catalog.cardinality(v_cands), v_path, v_read_us, (v_cands[1]).taken_at, w.lease_owner, w.lease_expires_at;
END
$$;

--
-- Name: watermark_step(text, boolean, integer, boolean); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean) RETURNS TABLE(outcome text, safe_seq bigint, prior_seq bigint, max_seq bigint, wait_us double precision, hold_us double precision, lease_owner text, lease_expires_at timestamp with time zone)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
  SELECT * FROM "tidemark".watermark_step(p_owner, p_block, p_lock_timeout_ms, p_synchronous_commit, p_lock_timeout_ms)
$$;

--
-- Name: watermark_step(text, boolean, integer, boolean, integer); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean, p_row_lock_timeout_ms integer) RETURNS TABLE(outcome text, safe_seq bigint, prior_seq bigint, max_seq bigint, wait_us double precision, hold_us double precision, lease_owner text, lease_expires_at timestamp with time zone)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
  SELECT CASE WHEN s.outcome IN ('pending', 'rewound') THEN 'busy' ELSE s.outcome END,
         s.safe_seq, s.prior_seq, s.last_seq, 0::float8, 0::float8, s.lease_owner, s.lease_expires_at
    FROM "tidemark".watermark_step(p_owner, p_synchronous_commit, true) s
$$;

--
-- Name: watermarker_finish(tidemark.watermarker_loop); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermarker_finish(r tidemark.watermarker_loop) RETURNS tidemark.watermarker_loop
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
  r := "tidemark".watermarker_time_step(r);
  IF r.rewound_to IS NOT NULL THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq was set back (to %); remembered observations were dropped', '"tidemark"', r.rewound_to
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Never set the identity back: a rewind undone before the next step goes unnoticed and can lose events.';
  END IF;
  -- Buckets no step fell in are NULL after the array grew past them.
  r.step_us_hist := pg_catalog.array_replace(r.step_us_hist, NULL, 0);
  RETURN r;
END
$$;

--
-- Name: watermarker_start(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer, boolean, boolean); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermarker_start(p_owner text, p_run_ms integer, p_lease_ttl_ms integer, p_lease_renew_ms integer, p_poll_min_ms integer, p_poll_max_ms integer, p_idle_grace_ms integer, p_synchronous_commit boolean, p_try_lock boolean, p_max_steps_per_second integer, p_sleep boolean, p_resume boolean) RETURNS tidemark.watermarker_loop
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  r "tidemark".watermarker_loop;
  v_renew_ms integer := coalesce(p_lease_renew_ms, p_lease_ttl_ms / 3);
BEGIN
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'run_watermarker: p_owner must name this instance' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_run_ms IS NULL OR p_run_ms < 0 OR p_lease_ttl_ms IS NULL OR p_lease_ttl_ms < 20
     OR v_renew_ms < 1 OR v_renew_ms * 2 >= p_lease_ttl_ms
     OR p_poll_min_ms IS NULL OR p_poll_min_ms < 1 OR p_poll_max_ms IS NULL OR p_poll_max_ms < p_poll_min_ms
     OR p_idle_grace_ms IS NULL OR p_idle_grace_ms < 0
     OR p_max_steps_per_second IS NULL OR p_max_steps_per_second < 1 THEN
    RAISE EXCEPTION 'run_watermarker: invalid timing (run % ms, lease ttl % ms, renew % ms, poll % to % ms, idle grace % ms, % steps/s)',
      p_run_ms, p_lease_ttl_ms, v_renew_ms, p_poll_min_ms, p_poll_max_ms, p_idle_grace_ms, p_max_steps_per_second
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Need run >= 0, ttl >= 20, 1 <= renew < ttl / 2, 1 <= poll_min <= poll_max, idle grace >= 0, steps per second >= 1.';
  END IF;
  IF p_sleep AND p_run_ms > v_renew_ms THEN
    -- Asleep, nothing renews the lease until the caller runs the loop again.
    RAISE EXCEPTION 'run_watermarker: with p_sleep, p_run_ms (%) must not exceed the lease renewal interval (% ms)', p_run_ms, v_renew_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_synchronous_commit IS NULL OR p_try_lock IS NULL OR p_sleep IS NULL OR p_resume IS NULL THEN
    RAISE EXCEPTION 'run_watermarker: % must be true or false, not NULL',
      CASE WHEN p_synchronous_commit IS NULL THEN 'p_synchronous_commit' WHEN p_try_lock IS NULL THEN 'p_try_lock'
           WHEN p_sleep IS NULL THEN 'p_sleep' ELSE 'p_resume' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  r.owner := p_owner;
  r.deadline := pg_catalog.clock_timestamp() + p_run_ms * interval '1 millisecond';
  r.lease_ttl_ms := p_lease_ttl_ms;
  r.renew_ms := v_renew_ms;
  r.poll_min_ms := p_poll_min_ms;
  r.poll_max_ms := p_poll_max_ms;
  r.idle_grace_ms := p_idle_grace_ms;
  r.synchronous_commit := p_synchronous_commit;
  r.try_lock := p_try_lock;
  r.max_steps_per_second := p_max_steps_per_second;
  -- PREPARE TRANSACTION refuses a transaction that has notified: where
  -- transactions may be prepared, writers must never be woken to notify,
  -- so the loop never sleeps (version 7's back-off).
  r.sleep_ok := p_sleep AND pg_catalog.current_setting('max_prepared_transactions')::integer = 0;
  r.run_ms := p_run_ms;
  r.arming := false;
  r.resume := p_resume;
  r.standby := true;
  r.done := false;
  r.delay_ms := p_poll_min_ms;
  r.tokens := 10;
  r.steps := 0; r.polls := 0; r.advanced := 0; r.pending := 0; r.idle := 0;
  r.try_lock_reads := 0; r.pg_locks_reads := 0; r.pg_locks_read_us_total := 0;
  r.step_us_total := 0; r.step_us_max := 0;
  r.step_us_hist := pg_catalog.array_fill(0, ARRAY[1]);  -- lower bound 1; grows as needed
  r.leader := false;
  RETURN r;
END
$$;

--
-- Name: watermarker_tick(tidemark.watermarker_loop); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermarker_tick(r tidemark.watermarker_loop) RETURNS tidemark.watermarker_loop
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_t0 timestamptz;
  v_t1 timestamptz;
  v_raw bigint;
  v_due boolean;
  v_defer boolean := false;
  v_defer_end timestamptz;
  v_until timestamptz;
  v_wake_until bigint;
  v_sleep boolean;
  v_disarmed boolean := false;
  l record;
  s record;
BEGIN
  -- A statement holds a snapshot while it runs: the sleep holds back the
  -- xmin horizon by no more than its length.
  IF r.sleep_s > 0 THEN
    IF r.defer_since IS NOT NULL THEN
      -- The turn before put a step off while a writer held the fence (a
      -- step clears defer_since): wait for the fence to be free, tried
      -- every 1.1 ms (the exclusive try-lock, released in the same
      -- expression, never queued), until the planned end at the latest.
      -- This transaction has taken no lock and no xid; each try is a
      -- wake-up and a lock request, not a turn (a turn's new transaction
      -- prepares every expression of this function again). No new
      -- attribute of the state marks the wait: a run started before this
      -- version was installed goes on with its old state.
      v_until := pg_catalog.clock_timestamp() + r.sleep_s * interval '1 second';
      LOOP
        -- 0.9 ms: pg_sleep waits whole milliseconds, and one asked for
        -- exactly 1 ms often waits 2.
        PERFORM pg_catalog.pg_sleep(least(0.0009, extract(epoch FROM v_until - pg_catalog.clock_timestamp())));
        EXIT WHEN pg_catalog.clock_timestamp() >= v_until
               OR CASE WHEN pg_catalog.pg_try_advisory_lock((-8344625403455539058)::bigint) THEN pg_catalog.pg_advisory_unlock((-8344625403455539058)::bigint) ELSE false END;
      END LOOP;
    ELSE
      PERFORM pg_catalog.pg_sleep(r.sleep_s);
    END IF;
  END IF;
  r.sleep_s := NULL;
  v_t0 := pg_catalog.clock_timestamp();
  IF r.step_started_at IS NOT NULL THEN
    r := "tidemark".watermarker_time_step(r);
  END IF;

  IF r.standby THEN
    IF r.wake_at IS NOT NULL AND v_t0 < r.wake_at THEN
      -- Sleeping in pieces holds back the xmin horizon by no more than one.
      r.sleep_s := least(extract(epoch FROM r.wake_at - v_t0), greatest(r.poll_max_ms, 10) / 1000.0);
      RETURN r;
    END IF;
    -- A run resumed after the loop slept (section 3.13) continues the
    -- lease it held: lost or released meanwhile, the run ends saying so
    -- (as a look would have), and the client pauses before trying for it
    -- again, so a standby can take it. Held and not yet due for renewal,
    -- it is not written again.
    IF r.resume THEN
      r.resume := false;
      SELECT x.lease_owner, x.lease_expires_at, x.safe_seq INTO r.lease_owner, r.lease_expires_at, r.safe_seq FROM "tidemark".watermark x;
      IF r.lease_owner IS DISTINCT FROM r.owner THEN
        r.leader := false;
        r.reason := CASE WHEN r.lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
        r.done := true;
        RETURN r;
      END IF;
    END IF;
    -- Not due before the run after this one may start: a run that ends
    -- asleep leaves the lease unrenewed for up to p_run_ms more.
    IF r.lease_owner IS NOT DISTINCT FROM r.owner
       AND r.lease_expires_at - (r.lease_ttl_ms - r.renew_ms + r.run_ms) * interval '1 millisecond' > v_t0 THEN
      r.leader := true;
    ELSE
      SELECT * INTO l FROM "tidemark".acquire_lease(r.owner, r.lease_ttl_ms);
      r.leader := l.held;
      r.lease_owner := l.lease_owner;
      r.lease_expires_at := l.lease_expires_at;
    END IF;
    IF NOT r.leader THEN
      IF pg_catalog.clock_timestamp() >= r.deadline THEN
        r.reason := 'standby';
        SELECT x.safe_seq INTO r.safe_seq FROM "tidemark".watermark x;
        r.done := true;
        RETURN r;
      END IF;
      r.wake_at := least(pg_catalog.clock_timestamp() + r.renew_ms * interval '1 millisecond', r.deadline);
      r.sleep_s := least(extract(epoch FROM r.wake_at - pg_catalog.clock_timestamp()), greatest(r.poll_max_ms, 10) / 1000.0);
      RETURN r;
    END IF;
    -- The lease is ours (committed with this turn); the next turn steps.
    r.standby := false;
    r.renew_at := r.lease_expires_at - (r.lease_ttl_ms - r.renew_ms) * interval '1 millisecond';
    -- Awake: writers stop waking the loop (a loop that died asleep left
    -- an instant that has passed, or soon will).
    IF pg_catalog.pg_sequence_last_value('"tidemark".wake'::pg_catalog.regclass) > 0 THEN
      PERFORM pg_catalog.setval('"tidemark".wake'::pg_catalog.regclass, 0, true);
    END IF;
    -- Candidates a run before stored count as waiting (no step is put off
    -- for a look, below, while they may be publishable). The idle grace
    -- runs from the last publication, whichever run made it: a run that
    -- begins in a pause of a steady flow must not go to sleep at its first
    -- idle look (writers would notify, each commit of theirs serialised).
    SELECT x.safe_seq, (x.candidates[1]).taken_at, x.updated_at INTO r.safe_seq, r.oldest_pending_at, r.last_advance_at
      FROM "tidemark".watermark x;
    r.tick_at := pg_catalog.clock_timestamp();
    r.not_before := r.tick_at;
    r.lease_seen_at := r.tick_at;
    RETURN r;
  END IF;

  -- The turn after the one that armed `wake`: learn that no writer holds
  -- the fence (the exclusive try-lock, released in the same expression),
  -- then look at the sequence once more. Every writer that takes the fence
  -- after that try-lock reads `wake` armed (it reads it after taking the
  -- fence) and NOTIFYs at its commit; every writer that took it before has
  -- ended, so its number is at or below what the look reads. The look
  -- equal to safe_seq, with no candidate waiting: the run ends 'asleep'
  -- and the client waits for a NOTIFY. Otherwise disarm and go on: a
  -- writer in flight, or a number to publish. (A transaction that holds
  -- the fence for long without drawing costs an arming a back-off interval,
  -- the delay that doubles to p_poll_max_ms.)
  IF r.arming THEN
    r.arming := false;
    v_sleep := CASE WHEN pg_catalog.pg_try_advisory_lock((-8344625403455539058)::bigint) THEN pg_catalog.pg_advisory_unlock((-8344625403455539058)::bigint) ELSE false END;
    IF v_sleep THEN
      v_raw := pg_catalog.pg_sequence_last_value('"tidemark".events_seq_seq'::regclass);
      IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('"tidemark".events_seq_seq', 'SELECT') THEN
        SELECT q.last_value - 1 INTO v_raw FROM "tidemark".events_seq_seq q;
      END IF;
      IF v_raw IS NOT DISTINCT FROM r.safe_seq AND r.oldest_pending_at IS NULL THEN
        r.reason := 'asleep';
        r.done := true;
        RETURN r;
      END IF;
    END IF;
    PERFORM pg_catalog.setval('"tidemark".wake'::pg_catalog.regclass, 0, true);
    v_disarmed := true;
  END IF;

  IF v_t0 >= r.deadline THEN
    r.reason := 'timeout';
    r.done := true;
    RETURN r;
  END IF;
  -- Steps the loop may take now: they accrue at p_max_steps_per_second,
  -- up to a burst of 10, and each step takes one. When events flow faster
  -- than that, each step publishes more of them: the loop's cost stays
  -- bounded while the delay it adds stays below one interval.
  r.tokens := least(10, r.tokens + extract(epoch FROM v_t0 - r.tick_at) * r.max_steps_per_second);
  r.tick_at := v_t0;
  -- A look at the sequence is cheap (no step): a step runs only when
  -- something was drawn since the last publication, when writers hold one
  -- back and it is time to look again, or to renew. A sequence that has
  -- handed out nothing since it was last set (NULL) is at the number
  -- before the next one it hands out, as the step reads it. NULL to a role
  -- that may not read it (PostgreSQL 18): the step says so.
  v_raw := pg_catalog.pg_sequence_last_value('"tidemark".events_seq_seq'::regclass);
  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('"tidemark".events_seq_seq', 'SELECT') THEN
    SELECT q.last_value - 1 INTO v_raw FROM "tidemark".events_seq_seq q;
  END IF;
  v_due := r.oldest_pending_at IS NOT NULL OR v_raw IS DISTINCT FROM r.safe_seq;
  -- A number drawn by a writer still in flight: a step now would find it
  -- holding the fence, remember it (a pg_locks read) and publish nothing,
  -- and a second step would publish it once it ends: two steps of the
  -- budget for one publication. So, with no candidate waiting, a look that
  -- finds the fence held (an exclusive try-lock, released in the same
  -- expression, never queued) puts the step off, for at most one step
  -- interval (1000 / max_steps_per_second ms) from the first look that
  -- did, and only when that interval ends before the run does (each run
  -- starts afresh: a run no longer than the interval never defers). The
  -- writer usually ends within it, and the step then takes the try-lock
  -- path and publishes. Writers that overlap without pause hold the fence
  -- throughout; the step then runs when the interval is up, as before.
  -- The step decides what is published, as always; like a wait for a
  -- token, the deferral only moves its observation later (writers that
  -- begin meanwhile join its H).
  v_defer_end := coalesce(r.defer_since, v_t0) + (1000.0 / r.max_steps_per_second) * interval '1 millisecond';
  IF v_t0 < r.renew_at AND v_t0 >= r.not_before AND r.tokens >= 1 AND v_due AND r.oldest_pending_at IS NULL AND r.try_lock
     AND v_t0 <= v_defer_end AND v_defer_end < r.deadline THEN
    v_defer := NOT CASE WHEN pg_catalog.pg_try_advisory_lock((-8344625403455539058)::bigint)
                        THEN pg_catalog.pg_advisory_unlock((-8344625403455539058)::bigint) ELSE false END;
    IF v_defer THEN
      r.defer_since := coalesce(r.defer_since, v_t0);
    END IF;
  END IF;
  IF NOT v_defer AND (v_t0 >= r.renew_at OR (v_t0 >= r.not_before AND r.tokens >= 1 AND v_due)) THEN
    r.defer_since := NULL;
    IF v_t0 >= r.renew_at THEN
      -- Renew only a lease this owner still holds: after release_lease
      -- (the stop request) or a takeover this finds no row and the loop
      -- ends. A row held by another session is skipped, and renewed later.
      UPDATE "tidemark".watermark x
         SET lease_expires_at = pg_catalog.clock_timestamp() + r.lease_ttl_ms * interval '1 millisecond'
       WHERE x.lease_owner = r.owner
         AND x.id IN (SELECT y.id FROM "tidemark".watermark y WHERE y.lease_owner = r.owner FOR NO KEY UPDATE SKIP LOCKED)
      RETURNING x.lease_expires_at INTO r.lease_expires_at;
      IF FOUND THEN
        r.renew_at := pg_catalog.clock_timestamp() + r.renew_ms * interval '1 millisecond';
      ELSIF NOT EXISTS (SELECT 1 FROM "tidemark".watermark x WHERE x.lease_owner = r.owner) THEN
        SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO r.safe_seq, r.lease_owner, r.lease_expires_at FROM "tidemark".watermark x;
        r.leader := false;
        r.reason := CASE WHEN r.lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
        r.done := true;
        RETURN r;
      END IF;
    END IF;

    SELECT * INTO s FROM "tidemark".watermark_step(r.owner, r.synchronous_commit, r.try_lock);
    v_t1 := pg_catalog.clock_timestamp();
    r.step_started_at := v_t0;
    r.lease_seen_at := v_t1;
    r.tokens := r.tokens - 1;
    r.steps := r.steps + 1;
    r.safe_seq := s.safe_seq;
    r.lease_owner := s.lease_owner;
    r.lease_expires_at := s.lease_expires_at;
    r.oldest_pending_at := s.oldest_pending_at;
    r.not_before := v_t1;
    IF s.holder_path = 'try_lock' THEN
      r.try_lock_reads := r.try_lock_reads + 1;
    ELSIF s.holder_path = 'pg_locks' THEN
      r.pg_locks_reads := r.pg_locks_reads + 1;
      r.pg_locks_read_us_total := r.pg_locks_read_us_total + s.holder_read_us;
      -- A pg_locks read holds every lock-manager partition, delaying every
      -- lock request in the cluster meanwhile: at most 5% of the time.
      r.not_before := v_t1 + 20 * s.holder_read_us * interval '1 microsecond';
    END IF;
    CASE s.outcome
      WHEN 'advanced' THEN
        r.advanced := r.advanced + 1;
        r.last_advance_at := v_t1;
      WHEN 'pending' THEN
        r.pending := r.pending + 1;
      WHEN 'idle' THEN
        r.idle := r.idle + 1;
      WHEN 'rewound' THEN
        -- The observations were dropped; once that commits, the run ends
        -- with an error (watermarker_finish).
        r.rewound_to := s.last_seq;
        r.done := true;
        RETURN r;
      ELSE
        -- not_leader: the lease was taken over or released.
        r.leader := false;
        r.reason := CASE WHEN r.lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
        r.done := true;
        RETURN r;
    END CASE;
    IF r.oldest_pending_at IS NOT NULL THEN
      -- Writers hold a candidate back: look again after a quarter of its
      -- age (within the poll bounds), so a long writer costs few lock
      -- reads and its commit is published within a quarter of its wait.
      r.not_before := greatest(r.not_before, v_t1 + least(r.poll_max_ms::float8, greatest(r.poll_min_ms::float8,
        extract(epoch FROM v_t1 - r.oldest_pending_at) * 250)) * interval '1 millisecond');
    END IF;
    r.delay_ms := r.poll_min_ms;
  ELSE
    r.polls := r.polls + 1;
    -- A step checks the lease; while no step runs, a look does, every
    -- p_poll_max_ms: release_lease (the stop request) or a takeover ends
    -- the loop that soon even when nothing is written.
    IF v_t0 >= r.lease_seen_at + r.poll_max_ms * interval '1 millisecond' THEN
      SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO r.safe_seq, r.lease_owner, r.lease_expires_at FROM "tidemark".watermark x;
      IF r.lease_owner IS DISTINCT FROM r.owner THEN
        r.leader := false;
        r.reason := CASE WHEN r.lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
        r.done := true;
        RETURN r;
      END IF;
      r.lease_seen_at := v_t0;
    END IF;
    -- Nothing to step for yet. Keep the fast cadence within the idle
    -- grace after a publication, then back off; and never sooner than
    -- the next step may run.
    r.delay_ms := CASE
      WHEN v_due THEN r.poll_min_ms
      WHEN v_t0 < r.last_advance_at + r.idle_grace_ms * interval '1 millisecond' THEN r.poll_min_ms
      ELSE least(r.poll_max_ms::float8, greatest(r.delay_ms * 2, 1)) END;
    -- Idle past the grace, and asked to (p_sleep): go to sleep until a
    -- writer wakes the loop, instead of looking at the back-off. This turn
    -- arms `wake` with the instant by which the client will have run the
    -- loop again (plus 250 ms), and the next turn, at once, decides
    -- (above, docs/PROTOCOL.md section 3.13). Without the try-lock
    -- (p_try_lock false) the loop never sleeps.
    IF r.sleep_ok AND r.try_lock AND NOT v_due AND NOT v_disarmed
       AND (r.last_advance_at IS NULL OR v_t0 >= r.last_advance_at + r.idle_grace_ms * interval '1 millisecond') THEN
      v_wake_until := pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint
                      + r.run_ms + 250;
      PERFORM pg_catalog.setval('"tidemark".wake'::pg_catalog.regclass, v_wake_until, true);
      r.arming := true;
      RETURN r;
    END IF;
  END IF;
  -- No turn before a whole token accrues, after a step as after a look:
  -- a step needs one (or the renewal, which caps every sleep, below), and
  -- so does putting one off, so a turn sooner could only find that out.
  -- The tokens were counted at v_t0, so the wait runs from there: a slow
  -- step (a row lock, a synchronous commit) has waited part of it.
  IF r.tokens < 1 THEN
    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0 - pg_catalog.clock_timestamp()) * 1000
                                       + (1 - r.tokens) * 1000 / r.max_steps_per_second);
  END IF;
  -- The next turn sleeps, after the shell's COMMIT; never in this
  -- transaction: a look's holds the sequence's RowExclusiveLock (ALTER
  -- SEQUENCE, and the writers queued behind it, would wait for the sleep).
  -- Not past the run's end, nor past the lease renewal. A step put off
  -- waits for the fence to be free (at the next turn's start) until the
  -- deferral's end, and no later than the lease is due to be read again
  -- (above: every p_poll_max_ms while no step runs; this turn read it if
  -- it was due), so the stop request is seen as soon as before.
  IF v_defer THEN
    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM
      least(v_defer_end, r.lease_seen_at + r.poll_max_ms * interval '1 millisecond') - pg_catalog.clock_timestamp()) * 1000);
  END IF;
  r.delay_ms := greatest(r.delay_ms, extract(epoch FROM r.not_before - pg_catalog.clock_timestamp()) * 1000);
  IF r.delay_ms > 0 THEN
    r.sleep_s := least(r.delay_ms, extract(epoch FROM least(r.deadline, r.renew_at) - pg_catalog.clock_timestamp()) * 1000) / 1000;
  END IF;
  RETURN r;
END
$$;

--
-- Name: watermarker_time_step(tidemark.watermarker_loop); Type: FUNCTION; Schema: tidemark; Owner: -
--

CREATE FUNCTION tidemark.watermarker_time_step(r tidemark.watermarker_loop) RETURNS tidemark.watermarker_loop
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
  v_us double precision;
  v_idx integer;
BEGIN
  IF r.step_started_at IS NULL OR r.committed_at IS NULL THEN
    RETURN r;
  END IF;
  v_us := extract(epoch FROM r.committed_at - r.step_started_at) * 1e6;
  r.step_us_total := r.step_us_total + v_us;
  r.step_us_max := greatest(r.step_us_max, v_us);
  v_idx := greatest(1, pg_catalog.floor(20 * pg_catalog.ln(greatest(v_us, 1)))::integer + 1);
  r.step_us_hist[v_idx] := coalesce(r.step_us_hist[v_idx], 0) + 1;
  r.step_started_at := NULL;
  RETURN r;
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: consumer_grants; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.consumer_grants (
    role_id oid NOT NULL,
    consumer text NOT NULL,
    CONSTRAINT consumer_grants_consumer_check CHECK ((consumer <> ''::text))
);

--
-- Name: cursors; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.cursors (
    consumer text NOT NULL,
    stream text NOT NULL,
    seq bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    resync_count integer DEFAULT 0 NOT NULL,
    last_resync_at timestamp with time zone,
    CONSTRAINT cursors_consumer_check CHECK ((consumer <> ''::text)),
    CONSTRAINT cursors_seq_check CHECK ((seq >= 0)),
    CONSTRAINT cursors_stream_check CHECK ((stream <> ''::text))
);

--
-- Name: dead_letters; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.dead_letters (
    id bigint NOT NULL,
    consumer text NOT NULL,
    stream text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    attempts integer NOT NULL,
    last_error text NOT NULL,
    dead_at timestamp with time zone DEFAULT now() NOT NULL,
    replay_requested_at timestamp with time zone,
    partition integer,
    CONSTRAINT dead_letters_attempts_check CHECK ((attempts >= 1)),
    CONSTRAINT dead_letters_consumer_check CHECK ((consumer <> ''::text)),
    CONSTRAINT dead_letters_partition_check CHECK ((partition >= 0)),
    CONSTRAINT dead_letters_stream_check CHECK ((stream <> ''::text))
);

--
-- Name: dead_letters_id_seq; Type: SEQUENCE; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.dead_letters ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tidemark.dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: events; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.events (
    seq bigint NOT NULL,
    stream text NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    occurred_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT events_headers_check CHECK ((jsonb_typeof(headers) = 'object'::text)),
    CONSTRAINT events_key_check CHECK ((key <> ''::text)),
    CONSTRAINT events_kind_check CHECK ((kind <> ''::text)),
    CONSTRAINT events_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT events_stream_check CHECK ((stream <> ''::text))
);

--
-- Name: events_seq_seq; Type: SEQUENCE; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tidemark.events_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: group_members; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.group_members (
    consumer text NOT NULL,
    stream text NOT NULL,
    member text NOT NULL,
    ttl_ms integer NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    joined_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT group_members_member_check CHECK (((member <> ''::text) AND (length(member) <= 200))),
    CONSTRAINT group_members_ttl_ms_check CHECK (((ttl_ms >= 100) AND (ttl_ms <= 3600000)))
);

--
-- Name: groups; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.groups (
    consumer text NOT NULL,
    stream text NOT NULL,
    partitions integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    next_partitions integer,
    barrier bigint,
    since_seq bigint DEFAULT 0 NOT NULL,
    repartitioned_at timestamp with time zone,
    CONSTRAINT groups_barrier_check CHECK ((barrier >= 0)),
    CONSTRAINT groups_consumer_check CHECK (((consumer <> ''::text) AND (length(consumer) <= 200))),
    CONSTRAINT groups_next_partitions_check CHECK (((next_partitions >= 1) AND (next_partitions <= 1024))),
    CONSTRAINT groups_partitions_check CHECK (((partitions >= 1) AND (partitions <= 1024))),
    CONSTRAINT groups_repartition_pending CHECK (((next_partitions IS NULL) = (barrier IS NULL))),
    CONSTRAINT groups_since_seq_check CHECK ((since_seq >= 0)),
    CONSTRAINT groups_stream_check CHECK (((stream <> ''::text) AND (length(stream) <= 200)))
);

--
-- Name: heartbeats; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.heartbeats (
    operation text NOT NULL,
    owner text NOT NULL,
    beat_at timestamp with time zone NOT NULL,
    details jsonb DEFAULT '{}'::jsonb NOT NULL
);

--
-- Name: horizons; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.horizons (
    stream text NOT NULL,
    pruned_through_seq bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT horizons_pruned_through_seq_check CHECK ((pruned_through_seq >= 0))
);

--
-- Name: owner_claims; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.owner_claims (
    owner text NOT NULL,
    instance text NOT NULL,
    claimed_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT owner_claims_instance_check CHECK ((instance <> ''::text)),
    CONSTRAINT owner_claims_owner_check CHECK ((owner <> ''::text))
);

--
-- Name: partition_cursors; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.partition_cursors (
    consumer text NOT NULL,
    stream text NOT NULL,
    partition integer NOT NULL,
    seq bigint DEFAULT 0 NOT NULL,
    holder text,
    moves bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT partition_cursors_partition_check CHECK ((partition >= 0)),
    CONSTRAINT partition_cursors_seq_check CHECK ((seq >= 0))
);

--
-- Name: tidemark_migrations; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.tidemark_migrations (
    id integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: wake; Type: SEQUENCE; Schema: tidemark; Owner: -
--

CREATE UNLOGGED SEQUENCE tidemark.wake
    START WITH 0
    INCREMENT BY 1
    MINVALUE 0
    NO MAXVALUE
    CACHE 1;

--
-- Name: watermark; Type: TABLE; Schema: tidemark; Owner: -
--

CREATE TABLE tidemark.watermark (
    id boolean DEFAULT true NOT NULL,
    safe_seq bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    candidates tidemark.watermark_candidate[] DEFAULT '{}'::tidemark.watermark_candidate[] NOT NULL,
    candidates_epoch timestamp with time zone,
    seq_filenode oid,
    seq_high bigint DEFAULT 0 NOT NULL,
    origin uuid DEFAULT gen_random_uuid() NOT NULL,
    CONSTRAINT watermark_check CHECK (((lease_owner IS NULL) = (lease_expires_at IS NULL))),
    CONSTRAINT watermark_id_check CHECK (id),
    CONSTRAINT watermark_safe_seq_check CHECK ((safe_seq >= 0))
)
WITH (fillfactor='20');

--
-- Name: consumer_grants consumer_grants_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.consumer_grants
    ADD CONSTRAINT consumer_grants_pkey PRIMARY KEY (role_id, consumer);

--
-- Name: cursors cursors_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.cursors
    ADD CONSTRAINT cursors_pkey PRIMARY KEY (consumer, stream);

--
-- Name: dead_letters dead_letters_consumer_stream_seq_key; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.dead_letters
    ADD CONSTRAINT dead_letters_consumer_stream_seq_key UNIQUE (consumer, stream, seq);

--
-- Name: dead_letters dead_letters_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);

--
-- Name: events events_headers_limit; Type: CHECK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events
    ADD CONSTRAINT events_headers_limit CHECK (
CASE
    WHEN (octet_length((headers)::text) <= 65536) THEN true
    ELSE tidemark.refuse_event('headers'::text, (octet_length((headers)::text))::bigint, (65536)::bigint, 'bytes as stored'::text, 'events_headers_limit'::text)
END) NOT VALID;

--
-- Name: events events_key_limit; Type: CHECK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events
    ADD CONSTRAINT events_key_limit CHECK (
CASE
    WHEN (octet_length(key) <= 256) THEN true
    WHEN ((char_length(key) + char_length(regexp_replace(key, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))) <= 256) THEN true
    ELSE tidemark.refuse_event('key'::text, ((char_length(key) + char_length(regexp_replace(key, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))))::bigint, (256)::bigint, 'characters (UTF-16 code units)'::text, 'events_key_limit'::text)
END) NOT VALID;

--
-- Name: events events_kind_limit; Type: CHECK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events
    ADD CONSTRAINT events_kind_limit CHECK (
CASE
    WHEN (octet_length(kind) <= 200) THEN true
    WHEN ((char_length(kind) + char_length(regexp_replace(kind, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))) <= 200) THEN true
    ELSE tidemark.refuse_event('kind'::text, ((char_length(kind) + char_length(regexp_replace(kind, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))))::bigint, (200)::bigint, 'characters (UTF-16 code units)'::text, 'events_kind_limit'::text)
END) NOT VALID;

--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (seq);

--
-- Name: events events_size_limit; Type: CHECK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events
    ADD CONSTRAINT events_size_limit CHECK (
CASE
    WHEN ((octet_length((payload)::text) + octet_length((headers)::text)) <= 1048576) THEN true
    ELSE tidemark.refuse_event('payload'::text, ((octet_length((payload)::text) + octet_length((headers)::text)))::bigint, (1048576)::bigint, 'bytes as stored, with headers'::text, 'events_size_limit'::text)
END) NOT VALID;

--
-- Name: events events_stream_limit; Type: CHECK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.events
    ADD CONSTRAINT events_stream_limit CHECK (
CASE
    WHEN (octet_length(stream) <= 200) THEN true
    WHEN ((char_length(stream) + char_length(regexp_replace(stream, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))) <= 200) THEN true
    ELSE tidemark.refuse_event('stream'::text, ((char_length(stream) + char_length(regexp_replace(stream, '[^\U00010000-\U0010FFFF]+'::text, ''::text, 'g'::text))))::bigint, (200)::bigint, 'characters (UTF-16 code units)'::text, 'events_stream_limit'::text)
END) NOT VALID;

--
-- Name: group_members group_members_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.group_members
    ADD CONSTRAINT group_members_pkey PRIMARY KEY (consumer, stream, member);

--
-- Name: groups groups_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.groups
    ADD CONSTRAINT groups_pkey PRIMARY KEY (consumer, stream);

--
-- Name: heartbeats heartbeats_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.heartbeats
    ADD CONSTRAINT heartbeats_pkey PRIMARY KEY (operation, owner);

--
-- Name: horizons horizons_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.horizons
    ADD CONSTRAINT horizons_pkey PRIMARY KEY (stream);

--
-- Name: owner_claims owner_claims_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.owner_claims
    ADD CONSTRAINT owner_claims_pkey PRIMARY KEY (owner);

--
-- Name: partition_cursors partition_cursors_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.partition_cursors
    ADD CONSTRAINT partition_cursors_pkey PRIMARY KEY (consumer, stream, partition);

--
-- Name: tidemark_migrations tidemark_migrations_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.tidemark_migrations
    ADD CONSTRAINT tidemark_migrations_pkey PRIMARY KEY (id);

--
-- Name: watermark watermark_pkey; Type: CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.watermark
    ADD CONSTRAINT watermark_pkey PRIMARY KEY (id);

--
-- Name: events_stream_seq; Type: INDEX; Schema: tidemark; Owner: -
--

CREATE INDEX events_stream_seq ON tidemark.events USING btree (stream, seq);

--
-- Name: cursors cursors_not_a_group; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER cursors_not_a_group BEFORE INSERT ON tidemark.cursors FOR EACH ROW EXECUTE FUNCTION tidemark.cursor_not_a_group();

--
-- Name: dead_letters dead_letters_event; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER dead_letters_event BEFORE INSERT ON tidemark.dead_letters FOR EACH ROW EXECUTE FUNCTION tidemark.dead_letter_is_the_event();

--
-- Name: events events_fence; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER events_fence BEFORE INSERT ON tidemark.events FOR EACH STATEMENT EXECUTE FUNCTION tidemark.take_shared_fence();

ALTER TABLE tidemark.events ENABLE ALWAYS TRIGGER events_fence;

--
-- Name: events events_immutable; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER events_immutable BEFORE UPDATE ON tidemark.events FOR EACH STATEMENT EXECUTE FUNCTION tidemark.reject_event_update();

ALTER TABLE tidemark.events ENABLE ALWAYS TRIGGER events_immutable;

--
-- Name: watermark fence_owner_claim; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER fence_owner_claim BEFORE UPDATE ON tidemark.watermark FOR EACH ROW EXECUTE FUNCTION tidemark.fence_owner_claim();

--
-- Name: groups groups_partitions_fixed; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE TRIGGER groups_partitions_fixed BEFORE UPDATE ON tidemark.groups FOR EACH ROW EXECUTE FUNCTION tidemark.group_partitions_fixed();

--
-- Name: partition_cursors partition_cursors_fence; Type: TRIGGER; Schema: tidemark; Owner: -
--

CREATE CONSTRAINT TRIGGER partition_cursors_fence AFTER UPDATE OF seq ON tidemark.partition_cursors DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tidemark.partition_fence();

--
-- Name: group_members group_members_consumer_stream_fkey; Type: FK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.group_members
    ADD CONSTRAINT group_members_consumer_stream_fkey FOREIGN KEY (consumer, stream) REFERENCES tidemark.groups(consumer, stream) ON DELETE CASCADE;

--
-- Name: partition_cursors partition_cursors_consumer_stream_fkey; Type: FK CONSTRAINT; Schema: tidemark; Owner: -
--

ALTER TABLE ONLY tidemark.partition_cursors
    ADD CONSTRAINT partition_cursors_consumer_stream_fkey FOREIGN KEY (consumer, stream) REFERENCES tidemark.groups(consumer, stream) ON DELETE CASCADE;

--
-- Name: cursors; Type: ROW SECURITY; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.cursors ENABLE ROW LEVEL SECURITY;

--
-- Name: cursors cursors_granted_consumers; Type: POLICY; Schema: tidemark; Owner: -
--

CREATE POLICY cursors_granted_consumers ON tidemark.cursors USING ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = cursors.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text))))) WITH CHECK ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = cursors.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text)))));

--
-- Name: dead_letters; Type: ROW SECURITY; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.dead_letters ENABLE ROW LEVEL SECURITY;

--
-- Name: dead_letters dead_letters_granted_consumers; Type: POLICY; Schema: tidemark; Owner: -
--

CREATE POLICY dead_letters_granted_consumers ON tidemark.dead_letters USING ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = dead_letters.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text))))) WITH CHECK ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = dead_letters.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text)))));

--
-- Name: group_members; Type: ROW SECURITY; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.group_members ENABLE ROW LEVEL SECURITY;

--
-- Name: group_members group_members_granted_consumers; Type: POLICY; Schema: tidemark; Owner: -
--

CREATE POLICY group_members_granted_consumers ON tidemark.group_members USING ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = group_members.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text))))) WITH CHECK ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = group_members.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text)))));

--
-- Name: groups; Type: ROW SECURITY; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.groups ENABLE ROW LEVEL SECURITY;

--
-- Name: groups groups_granted_consumers; Type: POLICY; Schema: tidemark; Owner: -
--

CREATE POLICY groups_granted_consumers ON tidemark.groups USING ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = groups.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text))))) WITH CHECK ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = groups.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text)))));

--
-- Name: partition_cursors; Type: ROW SECURITY; Schema: tidemark; Owner: -
--

ALTER TABLE tidemark.partition_cursors ENABLE ROW LEVEL SECURITY;

--
-- Name: partition_cursors partition_cursors_granted_consumers; Type: POLICY; Schema: tidemark; Owner: -
--

CREATE POLICY partition_cursors_granted_consumers ON tidemark.partition_cursors USING ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = partition_cursors.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text))))) WITH CHECK ((EXISTS ( SELECT 1
   FROM (tidemark.consumer_grants g
     JOIN pg_roles r ON ((r.oid = g.role_id)))
  WHERE ((g.consumer = partition_cursors.consumer) AND pg_has_role(CURRENT_USER, r.oid, 'USAGE'::text)))));

--
-- Name: FUNCTION acquire_lease(p_owner text, p_ttl_ms integer); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.acquire_lease(p_owner text, p_ttl_ms integer) FROM PUBLIC;

--
-- Name: FUNCTION beat(p_operation text, p_owner text, p_details jsonb, p_lock_timeout_ms integer); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.beat(p_operation text, p_owner text, p_details jsonb, p_lock_timeout_ms integer) FROM PUBLIC;

--
-- Name: FUNCTION blocking_writers(); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.blocking_writers() FROM PUBLIC;

--
-- Name: FUNCTION claim_owner(p_owner text, p_instance text, p_ttl_ms integer); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.claim_owner(p_owner text, p_instance text, p_ttl_ms integer) FROM PUBLIC;

--
-- Name: FUNCTION fence_owner_claim(); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.fence_owner_claim() FROM PUBLIC;

--
-- Name: FUNCTION finish_repartition(p_consumer text, p_stream text); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.finish_repartition(p_consumer text, p_stream text) FROM PUBLIC;

--
-- Name: FUNCTION grant_consumer(p_role text, p_consumers text[]); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.grant_consumer(p_role text, p_consumers text[]) FROM PUBLIC;

--
-- Name: FUNCTION grant_writer(p_role text); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.grant_writer(p_role text) FROM PUBLIC;

--
-- Name: FUNCTION release_lease(p_owner text); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.release_lease(p_owner text) FROM PUBLIC;

--
-- Name: FUNCTION release_owner(p_owner text, p_instance text); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.release_owner(p_owner text, p_instance text) FROM PUBLIC;

--
-- Name: FUNCTION repartition_group(p_consumer text, p_stream text, p_partitions integer); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.repartition_group(p_consumer text, p_stream text, p_partitions integer) FROM PUBLIC;

--
-- Name: PROCEDURE run_watermarker(IN p_owner text, IN p_run_ms integer, IN p_lease_ttl_ms integer, IN p_lease_renew_ms integer, IN p_poll_min_ms integer, IN p_poll_max_ms integer, IN p_idle_grace_ms integer, IN p_synchronous_commit boolean, IN p_try_lock boolean, IN p_max_steps_per_second integer, IN p_sleep boolean, IN p_resume boolean, INOUT reason text, INOUT steps bigint, INOUT polls bigint, INOUT advanced bigint, INOUT pending bigint, INOUT idle bigint, INOUT try_lock_reads bigint, INOUT pg_locks_reads bigint, INOUT pg_locks_read_us_total double precision, INOUT step_us_total double precision, INOUT step_us_max double precision, INOUT step_us_hist integer[], INOUT safe_seq bigint, INOUT leader boolean, INOUT lease_owner text, INOUT lease_expires_at timestamp with time zone, INOUT oldest_pending_at timestamp with time zone); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON PROCEDURE tidemark.run_watermarker(IN p_owner text, IN p_run_ms integer, IN p_lease_ttl_ms integer, IN p_lease_renew_ms integer, IN p_poll_min_ms integer, IN p_poll_max_ms integer, IN p_idle_grace_ms integer, IN p_synchronous_commit boolean, IN p_try_lock boolean, IN p_max_steps_per_second integer, IN p_sleep boolean, IN p_resume boolean, INOUT reason text, INOUT steps bigint, INOUT polls bigint, INOUT advanced bigint, INOUT pending bigint, INOUT idle bigint, INOUT try_lock_reads bigint, INOUT pg_locks_reads bigint, INOUT pg_locks_read_us_total double precision, INOUT step_us_total double precision, INOUT step_us_max double precision, INOUT step_us_hist integer[], INOUT safe_seq bigint, INOUT leader boolean, INOUT lease_owner text, INOUT lease_expires_at timestamp with time zone, INOUT oldest_pending_at timestamp with time zone) FROM PUBLIC;

--
-- Name: FUNCTION take_shared_fence(); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.take_shared_fence() FROM PUBLIC;

--
-- Name: FUNCTION watermark_step(p_owner text, p_synchronous_commit boolean, p_try_lock boolean); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermark_step(p_owner text, p_synchronous_commit boolean, p_try_lock boolean) FROM PUBLIC;

--
-- Name: FUNCTION watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean) FROM PUBLIC;

--
-- Name: FUNCTION watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean, p_row_lock_timeout_ms integer); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermark_step(p_owner text, p_block boolean, p_lock_timeout_ms integer, p_synchronous_commit boolean, p_row_lock_timeout_ms integer) FROM PUBLIC;

--
-- Name: FUNCTION watermarker_finish(r tidemark.watermarker_loop); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermarker_finish(r tidemark.watermarker_loop) FROM PUBLIC;

--
-- Name: FUNCTION watermarker_start(p_owner text, p_run_ms integer, p_lease_ttl_ms integer, p_lease_renew_ms integer, p_poll_min_ms integer, p_poll_max_ms integer, p_idle_grace_ms integer, p_synchronous_commit boolean, p_try_lock boolean, p_max_steps_per_second integer, p_sleep boolean, p_resume boolean); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermarker_start(p_owner text, p_run_ms integer, p_lease_ttl_ms integer, p_lease_renew_ms integer, p_poll_min_ms integer, p_poll_max_ms integer, p_idle_grace_ms integer, p_synchronous_commit boolean, p_try_lock boolean, p_max_steps_per_second integer, p_sleep boolean, p_resume boolean) FROM PUBLIC;

--
-- Name: FUNCTION watermarker_tick(r tidemark.watermarker_loop); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermarker_tick(r tidemark.watermarker_loop) FROM PUBLIC;

--
-- Name: FUNCTION watermarker_time_step(r tidemark.watermarker_loop); Type: ACL; Schema: tidemark; Owner: -
--

REVOKE ALL ON FUNCTION tidemark.watermarker_time_step(r tidemark.watermarker_loop) FROM PUBLIC;

--
-- PostgreSQL database dump complete
--

