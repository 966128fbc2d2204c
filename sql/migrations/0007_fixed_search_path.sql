-- tidemark schema, version 7: every function and procedure runs with a
-- fixed search_path, so that a role that can create objects in a schema on
-- a caller's search_path cannot change what tidemark's SQL does.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}} (bigint
-- literal), {{notify_channel}} (string literal).
--
-- The attack (docs/PROTOCOL.md, section 5.1): PostgreSQL resolves an
-- operator or function by name along the search_path and prefers the
-- candidate whose argument types match best. pg_catalog comes first, but
-- its && is (anyarray, anyarray); a role allowed to create objects in
-- public (every role, on databases created before PostgreSQL 15) can add
-- public.&&(text[], text[]), an exact match, and the step's holder check
-- called it: a step published past a writer still in flight, and a
-- consumer skipped that writer's event for good. The planted function ran
-- with the watermarker's rights, too.
--
-- With `SET search_path = pg_catalog, pg_temp` on a function, no name in it
-- resolves outside pg_catalog (pg_temp is never searched for functions or
-- operators, and a temporary relation belongs to the session that made
-- it). tidemark's own objects are written {{schema}}.name, and operators on
-- arrays and composites OPERATOR(pg_catalog.op) besides, where this file
-- rewrites a body. IS DISTINCT FROM, IN, CASE x WHEN and NULLIF look their
-- `=` up by name and have no qualified spelling: the fixed search_path is
-- what closes those. test/schema/search-path.test.ts fails for any function
-- of the schema without it, and for a procedure body that could resolve a
-- name on its caller's path.

-- The bodies of these do not change: the fixed search_path alone binds every
-- unqualified name in them to pg_catalog.
ALTER FUNCTION {{schema}}.take_shared_fence() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.reject_event_update() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.refuse_event(text, bigint, bigint, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.beat(text, text, jsonb, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.grant_writer(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.grant_consumer(text, text[]) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.acquire_lease(text, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.release_lease(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.fence_holders() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.blocking_writers() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.cursor_lock_key(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.checked_cursor_key(text, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.open_pages() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.open_page(bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.lock_cursor(text, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.remember_page(bigint, bigint, bigint, bigint, bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.read_page(text, text, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.lock_page(text, text, bigint, bigint, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.page_info(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.advance_cursor(text, text, bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.note_resync(text, text) SET search_path = pg_catalog, pg_temp;

-- The watermark step of version 4, with the fixed search_path, its array
-- operators qualified, and one change: a sequence that has handed out no
-- number since it was last set (ALTER SEQUENCE ... RESTART, setval(...,
-- false)) has no last value (pg_sequence_last_value is NULL). Version 4
-- read that as 0: a false rewind, and every later step failing "below
-- safe_seq" until a writer drew a number. This version takes S as the
-- number before the one the sequence hands out next: a sequence set
-- forward publishes what was drawn before it, and one set back to a
-- number a step saw drawn is a rewind, found at once.
--
-- Outcomes: 'advanced', 'pending', 'idle', 'rewound', 'not_leader', as in
-- version 4.
CREATE OR REPLACE FUNCTION {{schema}}.watermark_step(
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
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
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
  -- is NULL while the sequence has handed out nothing since it was created
  -- or last set. It also locks the sequence (RowExclusiveLock) to the end
  -- of this transaction: no ALTER SEQUENCE can commit until then, and the
  -- lock's acquisition processed the invalidations of any that committed
  -- before.
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
    -- Nothing handed out since the sequence was created or last set
    -- (RESTART, setval(..., false)): its last_value is the next number it
    -- hands out, R. S is R - 1: no number at or below it is handed out
    -- from now on, and every one drawn before was drawn before this read.
    -- R at or below seq_high hands out numbers a step saw drawn: a rewind,
    -- found below. Read from the relation: a nextval between the two
    -- reads turns is_called true and leaves last_value at R; later ones
    -- raise it, and S then is still a number drawn before this read. The
    -- read is one aligned 8-byte field, never a torn value.
    SELECT q.last_value - 1 INTO v_s FROM {{schema}}.events_seq_seq q;
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
    -- the loop spaces these reads by their duration (watermarker_tick).
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
      v_cands := v_cands OPERATOR(pg_catalog.||) ROW(v_s, v_h, pg_catalog.clock_timestamp())::{{schema}}.watermark_candidate;
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

-- The step loop. A procedure that commits cannot have a SET clause
-- (PostgreSQL refuses COMMIT in it), so run_watermarker is a shell that
-- only calls tidemark's functions by qualified name and commits, with no
-- operator and no unqualified name: nothing in it resolves on its caller's
-- search_path. Everything it decides is decided by the functions
-- below, each with the fixed search_path, over this state.
CREATE TYPE {{schema}}.watermarker_loop AS (
  -- The run's parameters, validated by watermarker_start.
  owner                text,
  deadline             timestamptz,
  lease_ttl_ms         integer,
  renew_ms             integer,
  poll_min_ms          integer,
  poll_max_ms          integer,
  idle_grace_ms        integer,
  synchronous_commit   boolean,
  try_lock             boolean,
  max_steps_per_second integer,
  -- Where the loop is. The shell reads done, and writes committed_at after
  -- each COMMIT; the functions write the rest.
  standby              boolean,
  done                 boolean,
  sleep_s              double precision,
  committed_at         timestamptz,
  step_started_at      timestamptz,
  wake_at              timestamptz,
  renew_at             timestamptz,
  last_advance_at      timestamptz,
  delay_ms             double precision,
  tick_at              timestamptz,
  lease_seen_at        timestamptz,
  not_before           timestamptz,
  defer_since          timestamptz,
  tokens               double precision,
  rewound_to           bigint,
  -- The summary the procedure returns.
  reason                 text,
  steps                  bigint,
  polls                  bigint,
  advanced               bigint,
  pending                bigint,
  idle                   bigint,
  try_lock_reads         bigint,
  pg_locks_reads         bigint,
  pg_locks_read_us_total double precision,
  step_us_total          double precision,
  step_us_max            double precision,
  step_us_hist           integer[],
  safe_seq               bigint,
  leader                 boolean,
  lease_owner            text,
  lease_expires_at       timestamptz,
  oldest_pending_at      timestamptz
);

-- A run's state from the procedure's parameters, after checking them.
CREATE FUNCTION {{schema}}.watermarker_start(
  p_owner text,
  p_run_ms integer,
  p_lease_ttl_ms integer,
  p_lease_renew_ms integer,
  p_poll_min_ms integer,
  p_poll_max_ms integer,
  p_idle_grace_ms integer,
  p_synchronous_commit boolean,
  p_try_lock boolean,
  p_max_steps_per_second integer
) RETURNS {{schema}}.watermarker_loop
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  r {{schema}}.watermarker_loop;
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
  IF p_synchronous_commit IS NULL OR p_try_lock IS NULL THEN
    RAISE EXCEPTION 'run_watermarker: % must be true or false, not NULL',
      CASE WHEN p_synchronous_commit IS NULL THEN 'p_synchronous_commit' ELSE 'p_try_lock' END
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

-- Counts the last step into the summary once its COMMIT is done: its time
-- runs from the start of its tick to committed_at, set by the shell.
CREATE FUNCTION {{schema}}.watermarker_time_step(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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

-- One turn of the loop, in the transaction the shell commits after it.
-- First the sleep the turn before planned (sleep_s), while this
-- transaction has taken no lock: the turn before committed. Then, as a
-- standby: try for the lease every renewal interval until the run's end,
-- sleeping in pieces of at most p_poll_max_ms (10 ms at least). As the
-- leader: look at the sequence (cheap: no step), or renew the lease and
-- step; then plan the next sleep, or end the run (done). The cadence is
-- version 4's: docs/PROTOCOL.md, section 3.10.
CREATE FUNCTION {{schema}}.watermarker_tick(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_t0 timestamptz;
  v_t1 timestamptz;
  v_raw bigint;
  v_due boolean;
  v_defer boolean := false;
  v_defer_end timestamptz;
  l record;
  s record;
BEGIN
  -- A statement holds a snapshot while it runs: the sleep holds back the
  -- xmin horizon by no more than its length.
  IF r.sleep_s > 0 THEN
    PERFORM pg_catalog.pg_sleep(r.sleep_s);
  END IF;
  r.sleep_s := NULL;
  v_t0 := pg_catalog.clock_timestamp();
  IF r.step_started_at IS NOT NULL THEN
    r := {{schema}}.watermarker_time_step(r);
  END IF;

  IF r.standby THEN
    IF r.wake_at IS NOT NULL AND v_t0 < r.wake_at THEN
      -- Sleeping in pieces holds back the xmin horizon by no more than one.
      r.sleep_s := least(extract(epoch FROM r.wake_at - v_t0), greatest(r.poll_max_ms, 10) / 1000.0);
      RETURN r;
    END IF;
    SELECT * INTO l FROM {{schema}}.acquire_lease(r.owner, r.lease_ttl_ms);
    r.leader := l.held;
    r.lease_owner := l.lease_owner;
    r.lease_expires_at := l.lease_expires_at;
    IF NOT l.held THEN
      IF pg_catalog.clock_timestamp() >= r.deadline THEN
        r.reason := 'standby';
        SELECT x.safe_seq INTO r.safe_seq FROM {{schema}}.watermark x;
        r.done := true;
        RETURN r;
      END IF;
      r.wake_at := least(pg_catalog.clock_timestamp() + r.renew_ms * interval '1 millisecond', r.deadline);
      r.sleep_s := least(extract(epoch FROM r.wake_at - pg_catalog.clock_timestamp()), greatest(r.poll_max_ms, 10) / 1000.0);
      RETURN r;
    END IF;
    -- The lease is ours (committed with this turn); the next turn steps.
    r.standby := false;
    r.renew_at := pg_catalog.clock_timestamp() + r.renew_ms * interval '1 millisecond';
    -- Candidates a run before stored count as waiting (no step is put off
    -- for a look, below, while they may be publishable).
    SELECT x.safe_seq, (x.candidates[1]).taken_at INTO r.safe_seq, r.oldest_pending_at FROM {{schema}}.watermark x;
    r.tick_at := pg_catalog.clock_timestamp();
    r.not_before := r.tick_at;
    r.lease_seen_at := r.tick_at;
    RETURN r;
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
  v_raw := pg_catalog.pg_sequence_last_value('{{schema}}.events_seq_seq'::regclass);
  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN
    SELECT q.last_value - 1 INTO v_raw FROM {{schema}}.events_seq_seq q;
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
    v_defer := NOT CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}})
                        THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;
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
      UPDATE {{schema}}.watermark x
         SET lease_expires_at = pg_catalog.clock_timestamp() + r.lease_ttl_ms * interval '1 millisecond'
       WHERE x.lease_owner = r.owner
         AND x.id IN (SELECT y.id FROM {{schema}}.watermark y WHERE y.lease_owner = r.owner FOR NO KEY UPDATE SKIP LOCKED)
      RETURNING x.lease_expires_at INTO r.lease_expires_at;
      IF FOUND THEN
        r.renew_at := pg_catalog.clock_timestamp() + r.renew_ms * interval '1 millisecond';
      ELSIF NOT EXISTS (SELECT 1 FROM {{schema}}.watermark x WHERE x.lease_owner = r.owner) THEN
        SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO r.safe_seq, r.lease_owner, r.lease_expires_at FROM {{schema}}.watermark x;
        r.leader := false;
        r.reason := CASE WHEN r.lease_owner IS NULL THEN 'released' ELSE 'lease_lost' END;
        r.done := true;
        RETURN r;
      END IF;
    END IF;

    SELECT * INTO s FROM {{schema}}.watermark_step(r.owner, r.synchronous_commit, r.try_lock);
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
      SELECT x.safe_seq, x.lease_owner, x.lease_expires_at INTO r.safe_seq, r.lease_owner, r.lease_expires_at FROM {{schema}}.watermark x;
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
    IF r.tokens < 1 THEN
      r.delay_ms := greatest(r.delay_ms, (1 - r.tokens) * 1000 / r.max_steps_per_second);
    END IF;
  END IF;
  -- The next turn sleeps, after the shell's COMMIT; never in this
  -- transaction: a look's holds the sequence's RowExclusiveLock (ALTER
  -- SEQUENCE, and the writers queued behind it, would wait for the sleep).
  -- Not past the run's end, nor past the lease renewal.
  r.delay_ms := greatest(r.delay_ms, extract(epoch FROM r.not_before - pg_catalog.clock_timestamp()) * 1000);
  IF r.delay_ms > 0 THEN
    r.sleep_s := least(r.delay_ms, extract(epoch FROM least(r.deadline, r.renew_at) - pg_catalog.clock_timestamp()) * 1000) / 1000;
  END IF;
  RETURN r;
END
$$;

-- The run's end: the last step counted, and the error of a sequence found
-- set back (raised after the step that dropped the observations committed).
CREATE FUNCTION {{schema}}.watermarker_finish(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  r := {{schema}}.watermarker_time_step(r);
  IF r.rewound_to IS NOT NULL THEN
    RAISE EXCEPTION 'tidemark: the identity sequence %.events_seq_seq was set back (to %); remembered observations were dropped', '{{schema}}', r.rewound_to
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Never set the identity back: a rewind undone before the next step goes unnoticed and can lose events.';
  END IF;
  -- Buckets no step fell in are NULL after the array grew past them.
  r.step_us_hist := pg_catalog.array_replace(r.step_us_hist, NULL, 0);
  RETURN r;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.watermarker_start(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.watermarker_time_step({{schema}}.watermarker_loop) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.watermarker_tick({{schema}}.watermarker_loop) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.watermarker_finish({{schema}}.watermarker_loop) FROM PUBLIC;

-- The procedure of version 4, its parameters and summary unchanged (see
-- there for their meaning), now the shell described above. Every
-- statement is a call of a schema-qualified function, a COMMIT, or a plain
-- assignment; the test that keeps it so strips comments and fails on any
-- operator or unqualified call in the body.
CREATE OR REPLACE PROCEDURE {{schema}}.run_watermarker(
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
DECLARE
  r {{schema}}.watermarker_loop;
BEGIN
  r := {{schema}}.watermarker_start(p_owner, p_run_ms, p_lease_ttl_ms, p_lease_renew_ms, p_poll_min_ms, p_poll_max_ms,
                                    p_idle_grace_ms, p_synchronous_commit, p_try_lock, p_max_steps_per_second);
  LOOP
    r := {{schema}}.watermarker_tick(r);
    -- Every turn commits: a step is published at once, and the next turn
    -- sleeps (first thing) in a transaction that holds no lock.
    COMMIT;
    r.committed_at := pg_catalog.clock_timestamp();
    EXIT WHEN r.done;
  END LOOP;
  r := {{schema}}.watermarker_finish(r);
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
