-- tidemark schema, version 3: the watermark step tells a timed-out fence
-- wait from a timed-out row lock, and bounds the row lock on its own.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}}.
--
-- The watermarker escalates its fence wait (up to lockTimeoutMaxMs) when
-- writers overlap without pause. Version 1 used that same bound for the
-- publishing UPDATE's wait on the watermark row, which happens while the
-- exclusive fence is held; a session holding that row (an operator's
-- SELECT ... FOR UPDATE) could then hold writers back for the whole
-- escalated bound, and its timeout was counted as a fence timeout.
--
-- Outcomes: 'advanced', 'idle', 'busy' (try-lock missed, p_block false),
-- 'timeout' (the blocking fence wait exceeded p_lock_timeout_ms; nothing
-- published), 'not_leader'. A row-lock wait longer than
-- p_row_lock_timeout_ms raises SQLSTATE 55P03.

DROP FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean);

CREATE FUNCTION {{schema}}.watermark_step(
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
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_prior   bigint;
  v_owner   text;
  v_expires timestamptz;
  v_max     bigint;
  v_new     bigint;
  v_t0      timestamptz;
  v_t1      timestamptz;
  v_t2      timestamptz;
BEGIN
  -- Each statement below must see a snapshot taken after the one before it;
  -- only READ COMMITTED gives a fresh snapshot per statement in a function.
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'tidemark watermark_step must run in READ COMMITTED, not %',
      current_setting('transaction_isolation')
      USING ERRCODE = 'invalid_transaction_state';
  END IF;

  -- Fence-free pre-checks: they can only decide to publish nothing.
  SELECT w.safe_seq, w.lease_owner, w.lease_expires_at
    INTO v_prior, v_owner, v_expires
    FROM {{schema}}.watermark w;
  IF v_owner IS DISTINCT FROM p_owner OR v_expires <= clock_timestamp() THEN
    RETURN QUERY SELECT 'not_leader', v_prior, v_prior, NULL::bigint, 0::float8, 0::float8, v_owner, v_expires;
    RETURN;
  END IF;
  SELECT max(e.seq) INTO v_max FROM {{schema}}.events e;
  IF v_max IS NULL OR v_max <= v_prior THEN
    RETURN QUERY SELECT 'idle', v_prior, v_prior, v_max, 0::float8, 0::float8, v_owner, v_expires;
    RETURN;
  END IF;

  -- Fence-free preparation: the commit mode of this transaction.
  IF NOT p_synchronous_commit THEN
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
  END IF;

  -- The exclusive side. Try first, so a step never queues ahead of writers;
  -- block (bounded by lock_timeout) only when the caller asks.
  -- (Once the fence is held, lock_timeout is lowered for the UPDATE below.)
  PERFORM pg_catalog.set_config('lock_timeout', p_lock_timeout_ms::text, true);
  v_t0 := clock_timestamp();
  IF NOT pg_catalog.pg_try_advisory_xact_lock({{fence_key}}) THEN
    IF NOT p_block THEN
      RETURN QUERY SELECT 'busy', v_prior, v_prior, v_max,
        (extract(epoch FROM clock_timestamp() - v_t0) * 1e6)::float8, 0::float8, v_owner, v_expires;
      RETURN;
    END IF;
    -- About to wait anyway: take the xid the publication needs now, so the
    -- exclusive section does not queue for XidGenLock behind committing
    -- writers. (A try-lock miss above burns no xid.)
    PERFORM pg_catalog.pg_current_xact_id();
    -- A timed-out fence wait is an outcome ('timeout'), told apart from a
    -- row-lock timeout below. The block is a subtransaction; when it
    -- succeeds, the lock passes to this transaction.
    BEGIN
      PERFORM pg_catalog.pg_advisory_xact_lock({{fence_key}});
    EXCEPTION WHEN lock_not_available THEN
      RETURN QUERY SELECT 'timeout', v_prior, v_prior, v_max,
        (extract(epoch FROM clock_timestamp() - v_t0) * 1e6)::float8, 0::float8, v_owner, v_expires;
      RETURN;
    END;
  END IF;
  v_t1 := clock_timestamp();
  -- Holding the fence: the publishing UPDATE waits for the watermark row at
  -- most p_row_lock_timeout_ms (a short, fixed bound), however long the
  -- fence wait was allowed to be. A row-lock timeout raises 55P03.
  PERFORM pg_catalog.set_config('lock_timeout', p_row_lock_timeout_ms::text, true);

  -- Exclusive section: no writer holds the shared side, so every allocated
  -- seq belongs to a finished transaction, and this statement's snapshot,
  -- taken now, sees all committed ones. One statement: candidate read and
  -- monotonic, lease-checked publication.
  UPDATE {{schema}}.watermark w
     SET safe_seq = m.max_seq, updated_at = v_t1
    FROM (SELECT max(e.seq) AS max_seq FROM {{schema}}.events e) m
   WHERE w.lease_owner = p_owner
     AND w.lease_expires_at > clock_timestamp()
     AND w.safe_seq < m.max_seq
  RETURNING w.safe_seq INTO v_new;
  v_t2 := clock_timestamp();

  IF v_new IS NULL THEN
    SELECT w.safe_seq, w.lease_owner, w.lease_expires_at
      INTO v_prior, v_owner, v_expires
      FROM {{schema}}.watermark w;
    RETURN QUERY SELECT
      CASE WHEN v_owner IS DISTINCT FROM p_owner OR v_expires <= clock_timestamp()
           THEN 'not_leader' ELSE 'idle' END,
      v_prior, v_prior, v_max,
      (extract(epoch FROM v_t1 - v_t0) * 1e6)::float8,
      (extract(epoch FROM v_t2 - v_t1) * 1e6)::float8,
      v_owner, v_expires;
    RETURN;
  END IF;

  RETURN QUERY SELECT 'advanced', v_new, v_prior, v_new,
    (extract(epoch FROM v_t1 - v_t0) * 1e6)::float8,
    (extract(epoch FROM v_t2 - v_t1) * 1e6)::float8,
    v_owner, v_expires;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean, integer) FROM PUBLIC;

-- The previous signature, kept so that a watermarker of the previous version
-- still steps during a rolling upgrade (instead of failing every step while
-- it holds the lease). Its row lock gets the fence bound, as before.
CREATE FUNCTION {{schema}}.watermark_step(
  p_owner text,
  p_block boolean,
  p_lock_timeout_ms integer,
  p_synchronous_commit boolean
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
  SELECT * FROM {{schema}}.watermark_step(p_owner, p_block, p_lock_timeout_ms, p_synchronous_commit, p_lock_timeout_ms)
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean) FROM PUBLIC;
