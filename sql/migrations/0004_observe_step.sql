-- tidemark schema, version 4: the watermark step observes in-flight writers
-- instead of fencing them out, and its loop runs inside PostgreSQL.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}} (bigint
-- literal), {{notify_channel}} (string literal).
--
-- Versions 1-3 published under the EXCLUSIVE side of the fence. A step
-- waiting for it made PostgreSQL queue every new writer behind it, so one
-- open outbox transaction stalled all writers. Now nothing but bootstrap
-- takes the exclusive side: a step reads the identity's last value S, then
-- the writers holding the shared side (H); S is safe once every member of H
-- has ended. docs/PROTOCOL.md section 3 has the proof.

-- A remembered observation: every seq <= seq is committed or will never
-- exist once none of `holders` (virtualtransaction ids) holds the fence.
CREATE TYPE {{schema}}.watermark_candidate AS (
  seq      bigint,
  holders  text[],
  taken_at timestamptz
);

-- Candidates live in the watermark row, so every kind of caller (the loop,
-- a one-shot step, a client in another language) makes progress from the
-- observations of earlier steps. They are valid only within the server
-- lifetime (candidates_epoch) and the sequence file (seq_filenode) they
-- were taken in.
-- seq_high, the highest identity value a step has seen, tells a sequence
-- set back (setval, RESTART) since then: every remembered observation is
-- at or below it.
ALTER TABLE {{schema}}.watermark
  ADD COLUMN candidates {{schema}}.watermark_candidate[] NOT NULL DEFAULT '{}',
  ADD COLUMN candidates_epoch timestamptz,
  ADD COLUMN seq_filenode oid,
  ADD COLUMN seq_high bigint NOT NULL DEFAULT 0;

UPDATE {{schema}}.watermark
   SET candidates_epoch = pg_catalog.pg_postmaster_start_time(),
       seq_filenode = pg_catalog.pg_relation_filenode('{{schema}}.events_seq_seq'::regclass),
       seq_high = coalesce(pg_catalog.pg_sequence_last_value('{{schema}}.events_seq_seq'::regclass), 0);

-- The lease, acquired or renewed, in one statement: a standby's attempt
-- against a live lease matches no row, so it takes no row lock.
CREATE FUNCTION {{schema}}.acquire_lease(p_owner text, p_ttl_ms integer)
RETURNS TABLE (held boolean, lease_owner text, lease_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  IF p_owner IS NULL OR p_owner = '' OR p_ttl_ms IS NULL OR p_ttl_ms < 1 THEN
    RAISE EXCEPTION 'acquire_lease: need an owner name and a positive TTL in milliseconds (got %, %)', p_owner, p_ttl_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH acquired AS (
    UPDATE {{schema}}.watermark w
       SET lease_owner = p_owner,
           lease_expires_at = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms / 1000.0)
     WHERE w.lease_owner = p_owner OR w.lease_owner IS NULL OR w.lease_expires_at <= pg_catalog.clock_timestamp()
    RETURNING w.lease_owner, w.lease_expires_at)
  SELECT true, a.lease_owner, a.lease_expires_at FROM acquired a
  UNION ALL
  SELECT false, w.lease_owner, w.lease_expires_at FROM {{schema}}.watermark w
   WHERE NOT EXISTS (SELECT 1 FROM acquired);
END
$$;

-- Gives the lease up. Also the stop request for a running loop: it returns
-- within p_poll_max_ms, because it renews only a lease it still holds and
-- checks it at every step, and every p_poll_max_ms while idle.
CREATE FUNCTION {{schema}}.release_lease(p_owner text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  WITH released AS (
    UPDATE {{schema}}.watermark w SET lease_owner = NULL, lease_expires_at = NULL
     WHERE w.lease_owner = p_owner RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM released)
$$;

-- One watermark step. Run it in READ COMMITTED, in a transaction of its own
-- (a single autocommit statement will do); it publishes and NOTIFYs in that
-- transaction's commit. It never queues ahead of writers (a granted
-- try-lock is held for the microseconds between two function calls) and
-- waits for no lock but DDL, and for the watermark row at most 200 ms
-- (55P03 after that: an operator holds it; nothing is written).
--
-- Outcomes: 'advanced' (published a higher safe_seq), 'pending' (events
-- above safe_seq wait for writers still in flight), 'idle' (nothing drawn
-- above safe_seq: no lock read, no write), 'rewound' (the sequence was
-- set back since an earlier step: every remembered observation was dropped,
-- nothing published, and a WARNING raised), 'not_leader' (p_owner holds no
-- live lease). holder_path says how the in-flight writers were learned:
-- 'try_lock' (an exclusive try-lock, released at once, proved there are
-- none) or 'pg_locks' (holder_read_us: how long that read took).
CREATE FUNCTION {{schema}}.watermark_step(
  p_owner text,
  p_synchronous_commit boolean DEFAULT false,
  p_try_lock boolean DEFAULT true
) RETURNS TABLE (
  outcome           text,
  safe_seq          bigint,
  prior_seq         bigint,
  last_seq          bigint,
  holders           integer,
  pending           integer,
  holder_path       text,
  holder_read_us    double precision,
  oldest_pending_at timestamptz,
  lease_owner       text,
  lease_expires_at  timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  w          record;
  v_epoch    timestamptz := pg_catalog.pg_postmaster_start_time();
  v_cands    {{schema}}.watermark_candidate[];
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
  -- is NULL while nothing was drawn. It also locks the sequence
  -- (RowExclusiveLock) to the end of this transaction: no ALTER SEQUENCE can
  -- commit until then, and the lock's acquisition processed the
  -- invalidations of any that committed before.
  SELECT x.safe_seq, x.lease_owner, x.lease_expires_at, x.candidates, x.candidates_epoch, x.seq_filenode, x.seq_high,
         pg_catalog.pg_sequence_last_value('{{schema}}.events_seq_seq'::regclass) AS s
    INTO w FROM {{schema}}.watermark x;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tidemark watermark row is missing in %; was the schema migrated?', '{{schema}}'
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
    IF NOT pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN
      RAISE EXCEPTION 'tidemark: role % may not read the identity sequence %.events_seq_seq', current_user, '{{schema}}'
        USING ERRCODE = 'insufficient_privilege', HINT = 'Run the watermarker as the owner of the tidemark schema.';
    END IF;
    v_s := 0;
  END IF;
  IF v_s < w.seq_high THEN
    -- Set back since a step saw seq_high: writers may draw numbers again
    -- that some remembered observation covers without their being in its
    -- holders. Drop them all; start again from what this step sees.
    v_rewound := true;
    v_cands := '{}';
  ELSIF v_s < w.safe_seq THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq is at %, below safe_seq %', '{{schema}}', v_s, w.safe_seq
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
    v_free := CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}})
                   THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;
  END IF;
  IF v_rewound THEN
    v_h := '{}';
  ELSIF v_free THEN
    v_h := '{}';
    v_path := 'try_lock';
  ELSE
    -- Holds every lock-manager partition while it copies the lock table:
    -- the loop spaces these reads by their duration (run_watermarker).
    v_t := pg_catalog.clock_timestamp();
    SELECT coalesce(pg_catalog.array_agg(l.virtualtransaction ORDER BY l.virtualtransaction), '{}'),
           coalesce(pg_catalog.bool_or(l.pid IS NULL), false)
      INTO v_h, v_orphan
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
       AND l.classid = ((({{fence_key}}) >> 32) & 4294967295)::oid
       AND l.objid = (({{fence_key}}) & 4294967295)::oid
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
  v_file := pg_catalog.pg_relation_filenode('{{schema}}.events_seq_seq'::regclass);
  v_params := pg_catalog.pg_sequence_parameters('{{schema}}.events_seq_seq'::regclass);
  IF v_params.cache_size <> 1 OR v_params.increment <= 0 OR v_params.cycle_option THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq must be CACHE 1, INCREMENT > 0, NO CYCLE (it is CACHE %, INCREMENT %, %)',
      '{{schema}}', v_params.cache_size, v_params.increment, CASE WHEN v_params.cycle_option THEN 'CYCLE' ELSE 'NO CYCLE' END
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'A cached or cycling sequence can hand out a number below one already seen. Nothing was published.',
            HINT = 'ALTER SEQUENCE ' || '{{schema}}' || '.events_seq_seq CACHE 1 INCREMENT 1 NO CYCLE';
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
      WHILE v_keep <= pg_catalog.cardinality(v_cands) AND NOT ((v_cands[v_keep]).holders && v_h) LOOP
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
        v_cands := v_cands[1:v_drop - 1] || v_cands[v_drop + 1:];
      END IF;
      v_cands := v_cands || ROW(v_s, v_h, pg_catalog.clock_timestamp())::{{schema}}.watermark_candidate;
    END IF;
  END IF;

  IF v_publish > w.safe_seq
     OR v_rewound
     OR v_s > w.seq_high
     OR v_cands IS DISTINCT FROM w.candidates
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
    UPDATE {{schema}}.watermark x
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
      SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO v_new, v_owner, v_expires FROM {{schema}}.watermark x;
      RETURN QUERY SELECT 'not_leader', v_new, w.safe_seq, v_s, pg_catalog.cardinality(v_h),
        pg_catalog.cardinality(w.candidates), v_path, v_read_us, NULL::timestamptz, v_owner, v_expires;
      RETURN;
    END IF;
    IF v_rewound THEN
      RAISE WARNING 'tidemark: the identity sequence %.events_seq_seq went back from % to %; remembered observations were dropped', '{{schema}}', w.seq_high, v_s
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
        PERFORM pg_catalog.pg_notify({{notify_channel}}, v_new::text);
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

REVOKE EXECUTE ON FUNCTION {{schema}}.watermark_step(text, boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.acquire_lease(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.release_lease(text) FROM PUBLIC;

-- The step loop, inside PostgreSQL: any client runs it with
--   CALL {{schema}}.run_watermarker('my-owner-name');
-- outside a transaction block (it commits every step) and in READ
-- COMMITTED. As a standby it tries for the lease every p_lease_renew_ms;
-- as the leader it steps, commits, renews the lease, and sleeps between
-- steps: p_poll_min_ms while events flow (and p_idle_grace_ms after the
-- last publication), doubling to p_poll_max_ms while idle, and a quarter of
-- the oldest pending candidate's age (within those bounds) while writers
-- hold one back; never more than p_max_steps_per_second steps a second
-- (bursts of 10), and pg_locks reads at most 5% of the time. It
-- returns a summary after p_run_ms ('timeout'), as a standby at that time
-- ('standby'), or when the lease is gone ('released': someone called
-- release_lease, the stop request; 'lease_lost': another owner holds it).
-- step_us_hist[i] counts steps whose time t (microseconds, COMMIT included)
-- has floor(20 * ln(t)) = i - 1. A step's error (or a sequence set back)
-- ends it with that error; steps committed before it stay. While it sleeps
-- between steps it holds the snapshot of its sleep statement, never older
-- than p_poll_max_ms (at least 10 ms).
CREATE PROCEDURE {{schema}}.run_watermarker(
  p_owner text,
  p_run_ms integer DEFAULT 60000,
  p_lease_ttl_ms integer DEFAULT 10000,
  p_lease_renew_ms integer DEFAULT NULL,
  p_poll_min_ms integer DEFAULT 1,
  p_poll_max_ms integer DEFAULT 100,
  p_idle_grace_ms integer DEFAULT 1000,
  p_synchronous_commit boolean DEFAULT false,
  p_try_lock boolean DEFAULT true,
  p_max_steps_per_second integer DEFAULT 100,
  INOUT reason text DEFAULT NULL,
  INOUT steps bigint DEFAULT NULL,
  INOUT polls bigint DEFAULT NULL,
  INOUT advanced bigint DEFAULT NULL,
  INOUT pending bigint DEFAULT NULL,
  INOUT idle bigint DEFAULT NULL,
  INOUT try_lock_reads bigint DEFAULT NULL,
  INOUT pg_locks_reads bigint DEFAULT NULL,
  INOUT pg_locks_read_us_total double precision DEFAULT NULL,
  INOUT step_us_total double precision DEFAULT NULL,
  INOUT step_us_max double precision DEFAULT NULL,
  INOUT step_us_hist integer[] DEFAULT NULL,
  INOUT safe_seq bigint DEFAULT NULL,
  INOUT leader boolean DEFAULT NULL,
  INOUT lease_owner text DEFAULT NULL,
  INOUT lease_expires_at timestamptz DEFAULT NULL,
  INOUT oldest_pending_at timestamptz DEFAULT NULL
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
  v_renew_ms integer := coalesce(p_lease_renew_ms, p_lease_ttl_ms / 3);
  v_deadline timestamptz;
  v_renew_at timestamptz;
  v_wake timestamptz;
  v_last_advance timestamptz;
  v_delay_ms double precision := p_poll_min_ms;
  v_t0 timestamptz;
  v_tick timestamptz;
  v_t1 timestamptz;
  v_lease_seen timestamptz;
  v_not_before timestamptz;
  v_tokens double precision := 10;
  v_s bigint;
  v_us double precision;
  v_idx integer;
  r record;
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
  steps := 0; polls := 0; advanced := 0; pending := 0; idle := 0;
  try_lock_reads := 0; pg_locks_reads := 0; pg_locks_read_us_total := 0; step_us_total := 0; step_us_max := 0;
  step_us_hist := pg_catalog.array_fill(0, ARRAY[1]);  -- lower bound 1; grows as needed
  v_deadline := pg_catalog.clock_timestamp() + p_run_ms * interval '1 millisecond';

  -- A standby tries for the lease every renewal interval until p_run_ms.
  LOOP
    SELECT * INTO r FROM {{schema}}.acquire_lease(p_owner, p_lease_ttl_ms);
    COMMIT;
    leader := r.held;
    lease_owner := r.lease_owner;
    lease_expires_at := r.lease_expires_at;
    EXIT WHEN leader;
    IF pg_catalog.clock_timestamp() >= v_deadline THEN
      reason := 'standby';
      SELECT x.safe_seq INTO safe_seq FROM {{schema}}.watermark x;
      RETURN;
    END IF;
    -- Sleep until the next attempt in pieces of at most p_poll_max_ms (and
    -- 10 ms at least): a statement holds a snapshot while it runs, so a
    -- sleeping loop holds back the xmin horizon by no more than that.
    v_wake := least(pg_catalog.clock_timestamp() + v_renew_ms * interval '1 millisecond', v_deadline);
    WHILE pg_catalog.clock_timestamp() < v_wake LOOP
      PERFORM pg_catalog.pg_sleep(least(extract(epoch FROM v_wake - pg_catalog.clock_timestamp()),
                                        greatest(p_poll_max_ms, 10) / 1000.0));
    END LOOP;
  END LOOP;
  v_renew_at := pg_catalog.clock_timestamp() + v_renew_ms * interval '1 millisecond';
  SELECT x.safe_seq INTO safe_seq FROM {{schema}}.watermark x;
  v_tick := pg_catalog.clock_timestamp();
  v_not_before := v_tick;
  v_lease_seen := v_tick;

  LOOP
    v_t0 := pg_catalog.clock_timestamp();
    IF v_t0 >= v_deadline THEN
      reason := 'timeout';
      EXIT;
    END IF;
    -- Steps the loop may take now: they accrue at p_max_steps_per_second,
    -- up to a burst of 10, and each step takes one. When events flow faster
    -- than that, each step publishes more of them: the loop's cost stays
    -- bounded while the delay it adds stays below one interval.
    v_tokens := least(10, v_tokens + extract(epoch FROM v_t0 - v_tick) * p_max_steps_per_second);
    v_tick := v_t0;
    -- A look at the sequence is cheap (no commit, no step): a step runs
    -- only when something was drawn since the last publication, when
    -- writers hold one back and it is time to look again, or to renew.
    v_s := coalesce(pg_catalog.pg_sequence_last_value('{{schema}}.events_seq_seq'::regclass), 0);
    IF v_t0 >= v_renew_at
       OR (v_t0 >= v_not_before AND v_tokens >= 1
           AND CASE WHEN oldest_pending_at IS NULL THEN v_s <> safe_seq ELSE true END) THEN
      IF v_t0 >= v_renew_at THEN
        -- Renew only a lease this owner still holds: after release_lease
        -- (the stop request) or a takeover this finds no row and the loop
        -- ends. A row held by another session is skipped, and renewed later.
        UPDATE {{schema}}.watermark x
           SET lease_expires_at = pg_catalog.clock_timestamp() + p_lease_ttl_ms * interval '1 millisecond'
         WHERE x.lease_owner = p_owner
           AND x.id IN (SELECT y.id FROM {{schema}}.watermark y WHERE y.lease_owner = p_owner FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING x.lease_expires_at INTO lease_expires_at;
        IF FOUND THEN
          v_renew_at := pg_catalog.clock_timestamp() + v_renew_ms * interval '1 millisecond';
        ELSIF NOT EXISTS (SELECT 1 FROM {{schema}}.watermark x WHERE x.lease_owner = p_owner) THEN
          COMMIT;
          SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO safe_seq, lease_owner, lease_expires_at FROM {{schema}}.watermark x;
          leader := false;
          reason := CASE WHEN lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
          EXIT;
        END IF;
      END IF;

      SELECT * INTO r FROM {{schema}}.watermark_step(p_owner, p_synchronous_commit, p_try_lock);
      COMMIT;
      v_t1 := pg_catalog.clock_timestamp();
      v_lease_seen := v_t1;
      v_us := extract(epoch FROM v_t1 - v_t0) * 1e6;
      v_tokens := v_tokens - 1;
      steps := steps + 1;
      step_us_total := step_us_total + v_us;
      step_us_max := greatest(step_us_max, v_us);
      v_idx := greatest(1, floor(20 * ln(greatest(v_us, 1)))::integer + 1);
      step_us_hist[v_idx] := coalesce(step_us_hist[v_idx], 0) + 1;
      safe_seq := r.safe_seq;
      lease_owner := r.lease_owner;
      lease_expires_at := r.lease_expires_at;
      oldest_pending_at := r.oldest_pending_at;
      v_not_before := v_t1;
      IF r.holder_path = 'try_lock' THEN
        try_lock_reads := try_lock_reads + 1;
      ELSIF r.holder_path = 'pg_locks' THEN
        pg_locks_reads := pg_locks_reads + 1;
        pg_locks_read_us_total := pg_locks_read_us_total + r.holder_read_us;
        -- A pg_locks read holds every lock-manager partition, delaying every
        -- lock request in the cluster meanwhile: at most 5% of the time.
        v_not_before := v_t1 + 20 * r.holder_read_us * interval '1 microsecond';
      END IF;
      CASE r.outcome
        WHEN 'advanced' THEN
          advanced := advanced + 1;
          v_last_advance := v_t1;
        WHEN 'pending' THEN
          pending := pending + 1;
        WHEN 'idle' THEN
          idle := idle + 1;
        WHEN 'rewound' THEN
          -- Committed (the observations are dropped); now fail loudly.
          RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq was set back (to %); remembered observations were dropped', '{{schema}}', r.last_seq
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Never set the identity back: a rewind undone before the next step goes unnoticed and can lose events.';
        ELSE
          -- not_leader: the lease was taken over or released.
          leader := false;
          reason := CASE WHEN lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
          EXIT;
      END CASE;
      IF oldest_pending_at IS NOT NULL THEN
        -- Writers hold a candidate back: look again after a quarter of its
        -- age (within the poll bounds), so a long writer costs few lock
        -- reads and its commit is published within a quarter of its wait.
        v_not_before := greatest(v_not_before, v_t1 + least(p_poll_max_ms::float8, greatest(p_poll_min_ms::float8,
          extract(epoch FROM v_t1 - oldest_pending_at) * 250)) * interval '1 millisecond');
      END IF;
      v_delay_ms := p_poll_min_ms;
    ELSE
      polls := polls + 1;
      -- A step checks the lease; while no step runs, a look does, every
      -- p_poll_max_ms: release_lease (the stop request) or a takeover ends
      -- the loop that soon even when nothing is written.
      IF v_t0 >= v_lease_seen + p_poll_max_ms * interval '1 millisecond' THEN
        SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO safe_seq, lease_owner, lease_expires_at FROM {{schema}}.watermark x;
        IF lease_owner IS DISTINCT FROM p_owner THEN
          COMMIT;
          leader := false;
          reason := CASE WHEN lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
          EXIT;
        END IF;
        v_lease_seen := v_t0;
      END IF;
      -- Nothing to step for yet. Keep the fast cadence within the idle
      -- grace after a publication, then back off; and never sooner than
      -- the next step may run.
      v_delay_ms := CASE
        WHEN v_s <> safe_seq OR oldest_pending_at IS NOT NULL THEN p_poll_min_ms
        WHEN v_t0 < v_last_advance + p_idle_grace_ms * interval '1 millisecond' THEN p_poll_min_ms
        ELSE least(p_poll_max_ms::float8, greatest(v_delay_ms * 2, 1)) END;
      IF v_tokens < 1 THEN
        v_delay_ms := greatest(v_delay_ms, (1 - v_tokens) * 1000 / p_max_steps_per_second);
      END IF;
      -- Never sleep inside a transaction: the look's holds the sequence's
      -- RowExclusiveLock (ALTER SEQUENCE, and the writers queued behind
      -- it, would wait for the sleep) and pins the xmin horizon.
      COMMIT;
    END IF;
    v_delay_ms := greatest(v_delay_ms, extract(epoch FROM v_not_before - pg_catalog.clock_timestamp()) * 1000);
    IF v_delay_ms > 0 THEN
      -- Not past the run's end, nor past the lease renewal.
      PERFORM pg_catalog.pg_sleep(least(v_delay_ms, extract(epoch FROM least(v_deadline, v_renew_at) - pg_catalog.clock_timestamp()) * 1000) / 1000);
    END IF;
  END LOOP;
  -- Buckets no step fell in are NULL after the array grew past them.
  step_us_hist := pg_catalog.array_replace(step_us_hist, NULL, 0);
END
$$;

REVOKE EXECUTE ON PROCEDURE {{schema}}.run_watermarker(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer,
  text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, double precision, double precision, double precision, integer[], bigint, boolean,
  text, timestamptz, timestamptz) FROM PUBLIC;

-- Every session holding the shared side of the fence in this database,
-- oldest transaction first: pid (NULL for a prepared transaction), name
-- and what it is doing. Read-only over pg_locks, pg_stat_activity (which
-- hides other roles' statements from unprivileged callers) and
-- pg_prepared_xacts, so any role may call it: bootstrap names these
-- writers when it cannot take the fence.
CREATE FUNCTION {{schema}}.fence_holders()
RETURNS TABLE (
  pid                integer,
  virtualtransaction text,
  application_name   text,
  client_addr        inet,
  xact_start         timestamptz,
  age_seconds        double precision,
  state              text,
  query              text,
  prepared_gid       text
)
LANGUAGE sql VOLATILE AS $$
  WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.virtualtransaction, l.pid, l.transactionid, l.classid, l.objid, l.objsubid, l.mode, l.granted
      FROM pg_catalog.pg_locks l
     WHERE l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
        OR l.locktype = 'transactionid'),
  holders AS (
    SELECT l.pid, l.virtualtransaction
      FROM locks l
     WHERE l.locktype = 'advisory'
       AND l.classid = ((({{fence_key}}) >> 32) & 4294967295)::oid
       AND l.objid = (({{fence_key}}) & 4294967295)::oid
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

-- The writers safe_seq waits for, for operators: the holders of the oldest
-- pending candidate still in flight, plus every prepared transaction that
-- holds the fence (they block every candidate). Empty when nothing waits.
CREATE FUNCTION {{schema}}.blocking_writers()
RETURNS TABLE (
  pid                integer,
  virtualtransaction text,
  application_name   text,
  client_addr        inet,
  xact_start         timestamptz,
  age_seconds        double precision,
  state              text,
  query              text,
  prepared_gid       text,
  pending_seq        bigint,
  waiting_since      timestamptz
)
LANGUAGE sql VOLATILE AS $$
  WITH oldest AS (
    SELECT c.seq, c.holders, c.taken_at
      FROM {{schema}}.watermark w, pg_catalog.unnest(w.candidates) WITH ORDINALITY AS c(seq, holders, taken_at, n)
     WHERE w.candidates_epoch = pg_catalog.pg_postmaster_start_time() AND c.seq > w.safe_seq
     ORDER BY c.n LIMIT 1)
  SELECT h.*, o.seq, o.taken_at
    FROM {{schema}}.fence_holders() h, oldest o
   WHERE h.virtualtransaction = ANY (o.holders) OR h.pid IS NULL
   ORDER BY h.xact_start NULLS LAST, h.pid
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.blocking_writers() FROM PUBLIC;

-- The previous step signature, kept for a watermarker of the previous
-- version during a rolling upgrade: it now observes too (it no longer waits
-- for the fence). 'pending' and 'rewound' read as its 'busy'.
CREATE OR REPLACE FUNCTION {{schema}}.watermark_step(
  p_owner text,
  p_block boolean,
  p_lock_timeout_ms integer,
  p_synchronous_commit boolean,
  p_row_lock_timeout_ms integer
) RETURNS TABLE (
  outcome          text,
  safe_seq         bigint,
  prior_seq        bigint,
  max_seq          bigint,
  wait_us          double precision,
  hold_us          double precision,
  lease_owner      text,
  lease_expires_at timestamptz
)
LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN s.outcome IN ('pending', 'rewound') THEN 'busy' ELSE s.outcome END,
         s.safe_seq, s.prior_seq, s.last_seq, 0::float8, 0::float8, s.lease_owner, s.lease_expires_at
    FROM {{schema}}.watermark_step(p_owner, p_synchronous_commit, true) s
$$;
