-- tidemark schema, version 14: after a step that spent the last whole
-- token, the loop sleeps until the next one accrues, instead of a turn
-- that only learns it must.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}} (bigint
-- literal).
--
-- Under steady writes each step takes the loop's last whole token, and the
-- turn after it (p_poll_min_ms later) could not step: it found tokens < 1,
-- computed the wait for the next token and slept. That turn is a
-- transaction of its own in which PL/pgSQL prepares watermarker_tick's
-- expressions again: measured at 800 tx/s on PostgreSQL 15 (2 cores), 210
-- to 250 turns a second for about 107 steps, and 0.3 to 0.5% of a core.
-- Now every turn plans that wait, a step's as a look's (which always
-- did, counted from its end): its sleep is the longer of what the turn
-- planned and the time until a whole token (counted from the turn's
-- start, when the tokens were counted: a slow step has waited part of
-- it), still no later than the run's end and the lease renewal. A look
-- that arms `wake` returns before it (the next turn comes at once). A
-- step needs a whole token (or the renewal, which caps the sleep), and so
-- does putting one off (docs/PROTOCOL.md section 3.10): what a step
-- decides and publishes, and when the next one may run, do not change.

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
               OR CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}}) THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;
      END LOOP;
    ELSE
      PERFORM pg_catalog.pg_sleep(r.sleep_s);
    END IF;
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
