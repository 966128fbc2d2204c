-- tidemark schema, version 1.
-- Placeholders substituted by the migrator: {{schema}} (quoted identifier),
-- {{fence_key}} (the schema's advisory-lock key, a bigint literal).
-- Append-only: never edit this file once released; add 0002_*.sql instead.

-- The outbox. seq comes only from the identity, and only after the
-- statement trigger below holds the shared fence.
CREATE TABLE {{schema}}.events (
  seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  stream      text NOT NULL CHECK (stream <> ''),
  kind        text NOT NULL CHECK (kind <> ''),
  key         text NOT NULL CHECK (key <> ''),
  payload     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
  headers     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
  occurred_at timestamptz NOT NULL DEFAULT now()
);

-- max(seq) is a backward scan of the primary key; per-stream paging
-- (stream = $1 AND seq > $2 ORDER BY seq) walks this index in order.
CREATE INDEX events_stream_seq ON {{schema}}.events (stream, seq);

-- The writer side of the fence. A BEFORE ... FOR EACH STATEMENT trigger
-- fires before the first row's defaults (and so nextval) are evaluated, for
-- INSERT, INSERT ... SELECT, data-modifying CTEs and COPY alike. The lock is
-- transaction-scoped: it is held until the writer commits or aborts.
CREATE FUNCTION {{schema}}.take_shared_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- Schema-qualified: a writer's search_path must not be able to swap the
  -- lock function for a no-op.
  PERFORM pg_catalog.pg_advisory_xact_lock_shared({{fence_key}});
  RETURN NULL;
END
$$;

CREATE TRIGGER events_fence
  BEFORE INSERT ON {{schema}}.events
  FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.take_shared_fence();
-- ALWAYS: the fence also fires under session_replication_role = replica.
ALTER TABLE {{schema}}.events ENABLE ALWAYS TRIGGER events_fence;

-- Events are immutable. UPDATE ... SET seq = DEFAULT would draw a number
-- outside the fence, so no UPDATE is allowed at all.
CREATE FUNCTION {{schema}}.reject_event_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'tidemark events are immutable: UPDATE on %.events is not allowed', TG_TABLE_SCHEMA
    USING ERRCODE = 'feature_not_supported',
          HINT = 'Append a new event instead.';
END
$$;

CREATE TRIGGER events_immutable
  BEFORE UPDATE ON {{schema}}.events
  FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.reject_event_update();
ALTER TABLE {{schema}}.events ENABLE ALWAYS TRIGGER events_immutable;

-- The singleton watermark row: the published tidemark and the lease.
CREATE TABLE {{schema}}.watermark (
  id               boolean PRIMARY KEY DEFAULT true CHECK (id),
  safe_seq         bigint NOT NULL DEFAULT 0 CHECK (safe_seq >= 0),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  lease_owner      text,
  lease_expires_at timestamptz,
  CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 20);

INSERT INTO {{schema}}.watermark DEFAULT VALUES;

-- Durable consumer positions: the last seq whose handler effects committed.
CREATE TABLE {{schema}}.cursors (
  consumer       text NOT NULL CHECK (consumer <> ''),
  stream         text NOT NULL CHECK (stream <> ''),
  seq            bigint NOT NULL DEFAULT 0 CHECK (seq >= 0),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  resync_count   integer NOT NULL DEFAULT 0,
  last_resync_at timestamptz,
  PRIMARY KEY (consumer, stream)
);

-- Per stream, the greatest seq removed by retention.
CREATE TABLE {{schema}}.horizons (
  stream             text PRIMARY KEY,
  pruned_through_seq bigint NOT NULL CHECK (pruned_through_seq >= 0),
  updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Durable operation heartbeats (watermarker, pruner, relay, ...), one row
-- per (operation, owner), written outside any fence.
CREATE TABLE {{schema}}.heartbeats (
  operation text NOT NULL,
  owner     text NOT NULL,
  beat_at   timestamptz NOT NULL,
  details   jsonb NOT NULL DEFAULT '{}',
  PRIMARY KEY (operation, owner)
);

-- One watermark step in one round trip: called as a single autocommit
-- statement, so the implicit transaction commits, and releases the exclusive
-- fence, as the statement returns. See docs/PROTOCOL.md for the proof.
--
-- Outcomes: 'advanced' (published a higher safe_seq), 'idle' (nothing
-- committed above safe_seq; no fence taken), 'busy' (try-lock missed and
-- p_block is false), 'not_leader' (p_owner does not hold a live lease).
-- A blocking attempt that exceeds p_lock_timeout_ms raises SQLSTATE 55P03.
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
  -- lock_timeout also bounds the row-lock wait of the publishing UPDATE, so
  -- the exclusive fence is never held behind an unbounded wait.
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
    PERFORM pg_catalog.pg_advisory_xact_lock({{fence_key}});
  END IF;
  v_t1 := clock_timestamp();

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

-- A durable heartbeat in one parametrised round trip whose row-lock wait is
-- bounded by p_lock_timeout_ms. Never called inside a fenced transaction.
CREATE FUNCTION {{schema}}.beat(
  p_operation text,
  p_owner text,
  p_details jsonb,
  p_lock_timeout_ms integer
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_at timestamptz := clock_timestamp();
BEGIN
  PERFORM pg_catalog.set_config('lock_timeout', p_lock_timeout_ms::text, true);
  INSERT INTO {{schema}}.heartbeats AS h (operation, owner, beat_at, details)
  VALUES (p_operation, p_owner, v_at, p_details)
  ON CONFLICT (operation, owner) DO UPDATE
    SET beat_at = excluded.beat_at, details = excluded.details;
  RETURN v_at;
END
$$;
