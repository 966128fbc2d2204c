-- tidemark schema, version 8: an idle loop sleeps until a writer wakes it.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}} (bigint
-- literal), {{wake_channel}} (string literal).
--
-- Until version 7 an idle loop looked at the sequence at a back-off that
-- reached p_poll_max_ms (100 ms), so the first event after a quiet second
-- waited up to that long. Looking every millisecond instead costs about 3%
-- of a core, idle. Now the idle loop arms `wake` with the instant until
-- which it sleeps, returns to its client, and the client LISTENs for a
-- writer's wake-up, or runs the loop again when that instant comes. A
-- writer's fence trigger reads `wake` (a sequence: read without a
-- snapshot, so a writer in REPEATABLE READ sees the current value too) and
-- NOTIFYs only while it holds an instant still to come: under load the loop
-- is awake and writers never notify (a NOTIFY in every writer's commit
-- serialises commits, ../shared/SPEC.md 3.1). Why no wake-up is lost, and
-- why a lost one only delays: docs/PROTOCOL.md, section 3.13.

-- Milliseconds since the Unix epoch until which the loop sleeps; 0 (or a
-- past instant) while it is awake. Unlogged where the server allows (15+):
-- it is reset to 0 after a crash, which only means "awake".
DO $$
BEGIN
  IF pg_catalog.current_setting('server_version_num')::integer >= 150000 THEN
    EXECUTE 'CREATE UNLOGGED SEQUENCE {{schema}}.wake AS bigint MINVALUE 0 START WITH 0';
  ELSE
    EXECUTE 'CREATE SEQUENCE {{schema}}.wake AS bigint MINVALUE 0 START WITH 0';
  END IF;
END
$$;
-- Only the owner reads and sets it: writers read it through the fence
-- trigger, which runs as the owner (below).
SELECT pg_catalog.setval('{{schema}}.wake', 0, true);

-- The fence trigger of version 1, and the wake-up: after the shared fence
-- is held, never before (section 3.13 needs that order). SECURITY DEFINER,
-- so that a writer needs no privilege on `wake` (a REVOKE ... FROM PUBLIC
-- on the schema's sequences must not make every INSERT fail, nor, on
-- PostgreSQL 18, silently stop the wake-ups). Everything it does any role
-- may do itself (an advisory lock, a NOTIFY); it reads nothing else, and
-- no role but the owner may attach it to a table of its own.
CREATE OR REPLACE FUNCTION {{schema}}.take_shared_fence() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared({{fence_key}});
  IF pg_catalog.pg_sequence_last_value('{{schema}}.wake'::pg_catalog.regclass)
     > pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000 THEN
    -- The loop never sleeps where a transaction may be prepared (PREPARE
    -- refuses one that has notified), so this is only a guard. A queue at
    -- half its size is left alone, as the step's NOTIFY does: a full one
    -- would make this commit fail; the loop wakes by itself within a run.
    IF pg_catalog.current_setting('max_prepared_transactions')::integer = 0
       AND pg_catalog.pg_notification_queue_usage() < 0.5 THEN
      PERFORM pg_catalog.pg_notify({{wake_channel}}, '');
    END IF;
  END IF;
  RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.take_shared_fence() FROM PUBLIC;

-- The loop's state gains the two switches of this version.
ALTER TYPE {{schema}}.watermarker_loop ADD ATTRIBUTE sleep_ok boolean, ADD ATTRIBUTE resume boolean, ADD ATTRIBUTE run_ms integer, ADD ATTRIBUTE arming boolean;

DROP PROCEDURE {{schema}}.run_watermarker(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer,
  text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, double precision, double precision, double precision, integer[], bigint, boolean,
  text, timestamptz, timestamptz);
DROP FUNCTION {{schema}}.watermarker_start(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer);

-- Version 7's, with p_sleep and p_resume (see the procedure).
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
  p_max_steps_per_second integer,
  p_sleep boolean,
  p_resume boolean
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


CREATE OR REPLACE FUNCTION {{schema}}.watermarker_tick(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop
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
  v_wake_until bigint;
  v_sleep boolean;
  v_disarmed boolean := false;
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
    -- A run resumed after the loop slept (section 3.13) continues the
    -- lease it held: lost or released meanwhile, the run ends saying so
    -- (as a look would have), and the client pauses before trying for it
    -- again, so a standby can take it. Held and not yet due for renewal,
    -- it is not written again.
    IF r.resume THEN
      r.resume := false;
      SELECT x.lease_owner, x.lease_expires_at, x.safe_seq INTO r.lease_owner, r.lease_expires_at, r.safe_seq FROM {{schema}}.watermark x;
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
      SELECT * INTO l FROM {{schema}}.acquire_lease(r.owner, r.lease_ttl_ms);
      r.leader := l.held;
      r.lease_owner := l.lease_owner;
      r.lease_expires_at := l.lease_expires_at;
    END IF;
    IF NOT r.leader THEN
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
    r.renew_at := r.lease_expires_at - (r.lease_ttl_ms - r.renew_ms) * interval '1 millisecond';
    -- Awake: writers stop waking the loop (a loop that died asleep left
    -- an instant that has passed, or soon will).
    IF pg_catalog.pg_sequence_last_value('{{schema}}.wake'::pg_catalog.regclass) > 0 THEN
      PERFORM pg_catalog.setval('{{schema}}.wake'::pg_catalog.regclass, 0, true);
    END IF;
    -- Candidates a run before stored count as waiting (no step is put off
    -- for a look, below, while they may be publishable). The idle grace
    -- runs from the last publication, whichever run made it: a run that
    -- begins in a pause of a steady flow must not go to sleep at its first
    -- idle look (writers would notify, each commit of theirs serialised).
    SELECT x.safe_seq, (x.candidates[1]).taken_at, x.updated_at INTO r.safe_seq, r.oldest_pending_at, r.last_advance_at
      FROM {{schema}}.watermark x;
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
    v_sleep := CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}}) THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;
    IF v_sleep THEN
      v_raw := pg_catalog.pg_sequence_last_value('{{schema}}.events_seq_seq'::regclass);
      IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN
        SELECT q.last_value - 1 INTO v_raw FROM {{schema}}.events_seq_seq q;
      END IF;
      IF v_raw IS NOT DISTINCT FROM r.safe_seq AND r.oldest_pending_at IS NULL THEN
        r.reason := 'asleep';
        r.done := true;
        RETURN r;
      END IF;
    END IF;
    PERFORM pg_catalog.setval('{{schema}}.wake'::pg_catalog.regclass, 0, true);
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
      PERFORM pg_catalog.setval('{{schema}}.wake'::pg_catalog.regclass, v_wake_until, true);
      r.arming := true;
      RETURN r;
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


-- The procedure of version 7, with two more parameters:
--   p_sleep   when idle past p_idle_grace_ms, end the run with reason
--             'asleep' (having armed `wake`) instead of looking at the
--             back-off. The caller LISTENs on the wake channel
--             ('<schema>_wake') and CALLs again with p_resume => true when
--             a notification arrives, or within p_run_ms of the return
--             without one (writers stop notifying 250 ms after that).
--             p_run_ms must then not exceed the lease renewal interval.
--   p_resume  this run continues one that ended 'asleep': a lease lost or
--             released meanwhile ends it at once ('lease_lost', 'released').
-- Both default to false: a caller of version 7 gets version 7's loop.
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
  p_sleep boolean DEFAULT false,
  p_resume boolean DEFAULT false,
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
                                    p_idle_grace_ms, p_synchronous_commit, p_try_lock, p_max_steps_per_second,
                                    p_sleep, p_resume);
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

REVOKE EXECUTE ON FUNCTION {{schema}}.watermarker_start(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer, boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE {{schema}}.run_watermarker(text, integer, integer, integer, integer, integer, integer, boolean, boolean, integer, boolean, boolean,
  text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, double precision, double precision, double precision, integer[], bigint, boolean,
  text, timestamptz, timestamptz) FROM PUBLIC;
