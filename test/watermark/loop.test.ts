import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { Watermarker, type WatermarkerEvent, type WatermarkRunSummary } from '../../src/index.js';
import { closeAdmin, insertEvent, lockWaiters, safeSeq, testDb, waitFor, type TestDb } from '../support/db.js';

after(closeAdmin);

/** A plain client, as psql or a service in another language would be. */
async function plainClient(db: TestDb): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: db.url, application_name: 'plain-client' });
  client.on('error', () => undefined);
  await client.connect();
  db.defer(() => client.end());
  return client;
}

async function leaseOwner(db: TestDb): Promise<string | null> {
  return (await db.observer.query('SELECT lease_owner FROM tidemark.watermark')).rows[0].lease_owner;
}

test('run() supervises the loop inside PostgreSQL: it publishes, reports summaries, stops at once on abort, and close() hands the lease over', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const runs: WatermarkRunSummary[] = [];
  const wm = new Watermarker(db.pool(), { owner: 'looper', summaryIntervalMs: 200, observer: (e) => e.type === 'run' && void runs.push(e.summary) });
  const stop = new AbortController();
  const running = wm.run(stop.signal);
  db.defer(async () => {
    stop.abort();
    await running;
  });

  const loop = await waitFor('the loop connection to run the loop', async () => {
    const r = await observer.query(
      `SELECT pid, query FROM pg_stat_activity WHERE application_name = 'tidemark-watermarker' AND datname = current_database() AND query LIKE 'CALL %'`,
    );
    return r.rows[0] as { pid: number; query: string } | undefined;
  });
  assert.match(loop.query, /^CALL "tidemark"\.run_watermarker\(p_owner => 'looper'/);
  await waitFor('the lease', async () => (await leaseOwner(db)) === 'looper');

  // While one outbox transaction is open, others commit without waiting and
  // safe_seq stays below it; once it commits, the loop publishes past it.
  const open = await db.session('open');
  await open.query('BEGIN');
  const low = await insertEvent(open);
  const w = await db.session('writer');
  let high = 0n;
  for (let i = 0; i < 5; i += 1) high = await insertEvent(w);
  await waitFor('a run summary to see a pending publication', async () => runs.some((r) => r.pending > 0));
  assert.deepEqual(await lockWaiters(observer), []);
  assert.ok((await safeSeq(observer)) < low, 'safe_seq stays below the open event');
  await open.query('COMMIT');
  await waitFor('safe_seq to pass the committed events', async () => (await safeSeq(observer)) === high);
  const summary = await waitFor('a summary with the publication', async () => runs.find((r) => r.advanced > 0));
  assert.equal(summary.reason, 'timeout');
  assert.equal(summary.leader, true);
  assert.equal(summary.steps, summary.advanced + summary.pending + summary.idle);
  assert.ok(summary.stepHistogram.reduce((a, b) => a + b, 0) === summary.steps, 'every step is in the histogram');
  assert.ok(runs.some((r) => r.pgLocksReads > 0) && runs.some((r) => r.tryLockReads > 0), 'both ways of learning the writers were used');

  stop.abort();
  await running;
  await waitFor('the loop backend to be gone', async () => {
    const r = await observer.query(`SELECT 1 FROM pg_stat_activity WHERE pid = $1`, [loop.pid]);
    return r.rowCount === 0;
  });
  assert.equal(await leaseOwner(db), 'looper', 'stopping the loop alone keeps the lease');
  await wm.close();
  assert.equal(await leaseOwner(db), null, 'close() releases it');
});

test('close() while run() runs is the stop request: the loop returns its last summary and run() resolves', async (t) => {
  const db = await testDb(t);
  const runs: WatermarkRunSummary[] = [];
  const stop = new AbortController();
  const watcher = new Watermarker(db.pool(), {
    owner: 'looper-closed',
    leaseTtlMs: 600_000,
    summaryIntervalMs: 20_000,
    observer: (e) => e.type === 'run' && void runs.push(e.summary),
  });
  const running = watcher.run(stop.signal);
  db.defer(() => stop.abort());
  await waitFor('the lease', async () => (await leaseOwner(db)) === 'looper-closed');
  await insertEvent(await db.session('writer'));
  await waitFor('a publication', async () => (await safeSeq(db.observer)) === 1n);
  await watcher.close();
  await running; // well before its 20 s run would have ended, and its lease renewal
  assert.equal(runs.at(-1)?.reason, 'released');
  assert.equal(runs.at(-1)?.advanced, 1);
  assert.equal(await leaseOwner(db), null);
});

test('a terminated loop backend: run() reports it, reconnects by itself and goes on publishing', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const events: WatermarkerEvent[] = [];
  const errors: unknown[] = [];
  const wm = new Watermarker(db.pool(), { retryMinMs: 10, retryMaxMs: 50, observer: (e) => events.push(e), onError: (e) => errors.push(e) });
  const stop = new AbortController();
  const running = wm.run(stop.signal);
  db.defer(async () => {
    stop.abort();
    await running;
    await wm.close();
  });
  const loopPid = async () =>
    (await observer.query(`SELECT pid FROM pg_stat_activity WHERE application_name = 'tidemark-watermarker' AND datname = current_database()`)).rows[0]
      ?.pid as number | undefined;
  const first = await waitFor('the loop connection', loopPid);
  await insertEvent(await db.session('w1'));
  await waitFor('a publication', async () => (await safeSeq(observer)) === 1n);

  await observer.query('SELECT pg_terminate_backend($1)', [first]);
  await waitFor('a retry event', async () => events.some((e) => e.type === 'retry'));
  assert.equal((errors[0] as { code?: string }).code, '57P01');
  const second = await waitFor('a new loop connection', async () => {
    const pid = await loopPid();
    return pid !== undefined && pid !== first ? pid : undefined;
  });
  assert.notEqual(second, first);
  await insertEvent(await db.session('w2'));
  await waitFor('the resumed loop to publish', async () => (await safeSeq(observer)) === 2n);
});

test('any client runs the loop with CALL, gets a summary, and stops when its lease is released (the stop request)', async (t) => {
  const db = await testDb(t);
  const a = await plainClient(db);
  const b = await plainClient(db);
  await insertEvent(await db.session('writer'));

  // A leader that would run for ten minutes...
  const leading = a.query(`CALL tidemark.run_watermarker('psql-a', p_run_ms => 600000, p_lease_ttl_ms => 60000)`);
  await waitFor('psql-a to publish', async () => (await safeSeq(db.observer)) === 1n);
  // ...beside it, a standby whose run ends while the lease is taken.
  const standby = (await b.query(`CALL tidemark.run_watermarker('psql-b', p_run_ms => 50, p_lease_ttl_ms => 60000)`)).rows[0];
  assert.deepEqual([standby.reason, standby.leader, standby.lease_owner, standby.steps], ['standby', false, 'psql-a', '0']);

  // The stop request: release the lease; the loop returns at its next step.
  assert.equal((await b.query(`SELECT tidemark.release_lease('psql-a') AS released`)).rows[0].released, true);
  const summary = (await leading).rows[0];
  assert.equal(summary.reason, 'released');
  assert.equal(summary.leader, false);
  assert.equal(summary.safe_seq, '1');
  assert.ok(Number(summary.advanced) >= 1);
  assert.ok(Number(summary.steps) >= Number(summary.advanced));
  assert.equal(await leaseOwner(db), null);

  await assert.rejects(a.query(`CALL tidemark.run_watermarker('x', p_lease_ttl_ms => 100, p_lease_renew_ms => 60)`), (err: Error & { code?: string }) => {
    assert.equal(err.code, '22023');
    assert.match(err.message, /invalid timing/);
    return true;
  });
  for (const option of ['p_try_lock', 'p_synchronous_commit']) {
    await assert.rejects(a.query(`CALL tidemark.run_watermarker('x', ${option} => NULL)`), (err: Error & { code?: string }) => {
      assert.equal(err.code, '22023');
      assert.match(err.message, new RegExp(`${option} must be true or false, not NULL`));
      return true;
    });
  }
  await assert.rejects(a.query(`SELECT * FROM tidemark.acquire_lease(NULL, 1000)`), { code: '22023' });
  await assert.rejects(a.query(`SELECT * FROM tidemark.acquire_lease('x', 0)`), { code: '22023' });
  assert.equal(await leaseOwner(db), null, 'nothing was written');
  await assert.rejects(a.query(`BEGIN; CALL tidemark.run_watermarker('x', p_run_ms => 10)`), /invalid transaction termination/);
  await a.query('ROLLBACK');
});

test('the loop never sleeps inside a transaction: ALTER SEQUENCE (and the writers behind it) never waits for its sleep', async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  // Idle, backing off to one-second sleeps at once.
  const running = c.query(`CALL tidemark.run_watermarker('sleeper', p_run_ms => 600000, p_idle_grace_ms => 0, p_poll_max_ms => 1000)`).catch(() => undefined);
  db.defer(async () => {
    await db.observer.query(`SELECT tidemark.release_lease('sleeper')`);
    await running;
  });
  // The loop's transaction, when it is in a sleep: each turn commits, so the
  // same xact_start before and after the lock read means one sleep spanned it.
  const sleeping = async () => {
    const r = await db.observer.query(`SELECT wait_event, xact_start::text AS xact_start FROM pg_stat_activity WHERE pid = $1`, [pid]);
    return r.rows[0]?.wait_event === 'PgSleep' ? (r.rows[0].xact_start as string) : undefined;
  };
  for (let seen = 0; seen < 5; ) {
    const before = await sleeping();
    if (before === undefined) continue;
    const held = await db.observer.query(
      `SELECT l.mode FROM pg_locks l WHERE l.pid = $1 AND l.relation = 'tidemark.events_seq_seq'::regclass`,
      [pid],
    );
    if ((await sleeping()) !== before) continue; // the sleep ended meanwhile: the next turn's look may hold locks
    assert.deepEqual(held.rows, [], 'no lock on the sequence while it sleeps');
    seen += 1;
  }
  const ddl = await db.session('ddl');
  await ddl.query(`SET lock_timeout = '100ms'`);
  await ddl.query('ALTER SEQUENCE tidemark.events_seq_seq CACHE 1');
});

/**
 * One turn of the loop (watermarker_tick) from a state set up by hand:
 * started as `start` says, then, unless `standby`, the lease taken and the
 * loop the leader, free to step now, with `set` (PL/pgSQL assignments to r)
 * applied last. Returns the state after the turn.
 */
async function tick(client: pg.Client, options: { start?: string; set?: string; standby?: boolean } = {}) {
  await client.query('CREATE TEMP TABLE IF NOT EXISTS tick_out (r tidemark.watermarker_loop); TRUNCATE tick_out');
  const lead = options.standby
    ? ''
    : `PERFORM tidemark.acquire_lease('x', 60000);
       r.standby := false; r.leader := true;
       r.renew_at := clock_timestamp() + interval '1 hour'; r.tick_at := clock_timestamp();
       r.not_before := clock_timestamp() - interval '1 second'; r.lease_seen_at := clock_timestamp();
       SELECT w.safe_seq INTO r.safe_seq FROM tidemark.watermark w;`;
  await client.query(`DO $$ DECLARE r tidemark.watermarker_loop; BEGIN
    r := tidemark.watermarker_start('x', 600000, 60000, NULL, 1, 100, 1000, false, true, ${options.start ?? '100'}, false, false);
    ${lead}
    ${options.set ?? ''}
    r := tidemark.watermarker_tick(r);
    -- When the turn had returned (the shell notes it after its COMMIT): with
    -- tick_at, the turn's start, a bound of how long it took.
    r.committed_at := clock_timestamp();
    INSERT INTO tick_out VALUES (r);
  END $$`);
  const r = (
    await client.query(
      `SELECT (r).steps::int, (r).pending::int, (r).advanced::int, (r).try_lock_reads::int AS try_lock, (r).pg_locks_reads::int AS pg_locks,
              (r).defer_since IS NOT NULL AS deferring, (r).oldest_pending_at IS NOT NULL AS waiting, (r).safe_seq::int FROM tick_out`,
    )
  ).rows[0];
  return r as { steps: number; pending: number; advanced: number; try_lock: number; pg_locks: number; deferring: boolean; waiting: boolean; safe_seq: number };
}

test('a number whose writer is still in flight puts the step off for at most one step interval, never past the run; once the writer ends, one try-lock step publishes it', async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  const w = await db.session('w');
  await w.query('BEGIN');
  assert.equal(await insertEvent(w), 1n);

  // The writer holds the fence: the turn puts the step off, and notes when.
  assert.deepEqual(await tick(c), { steps: 0, pending: 0, advanced: 0, try_lock: 0, pg_locks: 0, deferring: true, waiting: false, safe_seq: 0 });
  // Not for longer than one step interval (10 ms at 100 steps a second)...
  assert.deepEqual(await tick(c, { set: `r.defer_since := clock_timestamp() - interval '11 milliseconds';` }), {
    steps: 1, pending: 1, advanced: 0, try_lock: 0, pg_locks: 1, deferring: false, waiting: true, safe_seq: 0,
  });
  // ...nor past the run's end: a run no longer than the interval never puts a step off.
  assert.equal((await tick(c, { set: `r.deadline := clock_timestamp() + interval '5 milliseconds';` })).steps, 1);

  // A new run takes the candidates stored before as waiting: it does not put its first step off for them.
  await w.query('COMMIT');
  const w2 = await db.session('w2');
  await w2.query('BEGIN');
  assert.equal(await insertEvent(w2), 2n);
  assert.equal((await tick(c, { standby: true })).waiting, true, 'the lease taken, the stored candidate waits');
  const run = (await c.query(`CALL tidemark.run_watermarker('x', p_run_ms => 1500, p_max_steps_per_second => 1)`)).rows[0];
  assert.equal(run.safe_seq, '1', 'published though a writer holds the fence');
  await w2.query('COMMIT');

  // No writer: one step on the try-lock path publishes, and the look's try-lock is released.
  assert.deepEqual(await tick(c), { steps: 1, pending: 0, advanced: 1, try_lock: 1, pg_locks: 0, deferring: false, waiting: false, safe_seq: 2 });
  assert.deepEqual((await db.observer.query(`SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, [pid])).rows, []);
  await w.query(`SET lock_timeout = '2s'`);
  assert.equal(await insertEvent(w), 3n);
});

test('a step put off waits for the fence inside the next turn: planned to the deferral\'s end, it ends as soon as the writer does, and at its end when the writer does not (version 12)', { timeout: 60_000 }, async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  const w = await db.session('w');
  await w.query('BEGIN');
  assert.equal(await insertEvent(w), 1n);
  const planned = async () =>
    (await c.query('SELECT (r).defer_since IS NOT NULL AS fence_wait, (r).sleep_s AS sleep_s FROM tick_out')).rows[0] as { fence_wait: boolean; sleep_s: number | null };

  // The turn that puts the step off plans a fence wait, no longer than the deferral (10 ms at 100 steps a second).
  assert.equal((await tick(c)).deferring, true);
  const plan = await planned();
  assert.equal(plan.fence_wait, true);
  assert.ok(plan.sleep_s !== null && plan.sleep_s > 0 && plan.sleep_s <= 0.01, String(plan.sleep_s));
  // A look that does not put a step off plans a plain sleep.
  await tick(c, { set: `r.not_before := clock_timestamp() + interval '5 milliseconds';` });
  assert.equal((await planned()).fence_wait, false);
  // At 1 step a second the deferral lasts a second, but the wait ends when the lease is due to be read
  // again (p_poll_max_ms, 100, after the last read, 90 ms ago), so a stop request is seen as soon as before.
  assert.equal((await tick(c, { start: '1', set: `r.lease_seen_at := clock_timestamp() - interval '90 milliseconds';` })).deferring, true);
  const due = await planned();
  assert.ok(due.fence_wait && due.sleep_s !== null && due.sleep_s > 0 && due.sleep_s <= 0.01, String(due.sleep_s));

  // A wait planned for a minute, the writer holding the fence: the turn sleeps, and publishes nothing...
  const turn = tick(c, { set: `r.defer_since := clock_timestamp(); r.sleep_s := 60;` });
  await waitFor('the turn to wait for the fence', async () => {
    const r = await db.observer.query(`SELECT wait_event FROM pg_stat_activity WHERE pid = $1 AND state = 'active'`, [pid]);
    return r.rows[0]?.wait_event === 'PgSleep';
  });
  assert.equal(await safeSeq(db.observer), 0n);
  // ...until the writer ends: then it looks and publishes on the try-lock path, long before its minute.
  await w.query('COMMIT');
  assert.deepEqual(await turn, { steps: 1, pending: 0, advanced: 1, try_lock: 1, pg_locks: 0, deferring: false, waiting: false, safe_seq: 1 });
  assert.deepEqual((await db.observer.query(`SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, [pid])).rows, []);

  // A writer that never lets go: the wait ends when planned, and the deferral being over, the step reads pg_locks.
  await w.query('BEGIN');
  assert.equal(await insertEvent(w), 2n);
  assert.deepEqual(await tick(c, { set: `r.sleep_s := 0.05; r.defer_since := clock_timestamp() - interval '11 milliseconds';` }), {
    steps: 1, pending: 1, advanced: 0, try_lock: 0, pg_locks: 1, deferring: false, waiting: true, safe_seq: 1,
  });
  await w.query('COMMIT');
});

test('a step that spends the last whole token plans the sleep until the next one, as a look does, from the turn\'s start, no later than the lease renewal: no turn only to find it may not step (version 14)', async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  // The sleep the turn planned, its tokens, and how long it took (from its start to its return: an upper
  // bound of the part of the wait it spent before planning the rest, since the wait counts from its start).
  const planned = async () =>
    (await c.query('SELECT (r).sleep_s AS sleep_s, (r).tokens AS tokens, extract(epoch FROM (r).committed_at - (r).tick_at)::float8 AS took FROM tick_out')).rows[0] as {
      sleep_s: number | null;
      tokens: number;
      took: number;
    };
  // One turn that steps, at `rate` steps a second.
  const step = async (set: string, rate = '100') => {
    await insertEvent(await db.session(`writer ${set.length} ${rate}`));
    assert.equal((await tick(c, { start: rate, set: `r.tick_at := clock_timestamp(); ${set}` })).advanced, 1);
    return planned();
  };

  // Tokens to spare after the step: the fast cadence (p_poll_min_ms, 1 ms).
  const spare = await step('r.tokens := 5;');
  assert.ok(spare.tokens >= 4 && spare.sleep_s !== null && spare.sleep_s <= 0.001, JSON.stringify(spare));
  // The last whole token spent: sleep until the next accrues (10 ms at 100 steps a second, less what
  // the turn itself took), not 1 ms.
  const spent = await step('r.tokens := 1;');
  assert.ok(spent.tokens < 0.5, JSON.stringify(spent));
  assert.ok(spent.sleep_s !== null && spent.sleep_s >= (1 - spent.tokens) * 0.01 - spent.took && spent.sleep_s <= 0.01, JSON.stringify(spent));
  // Not the fast cadence: wherever the wait left to the next token (measured by the turn itself: tokens accrue while
  // it runs) is above 1.5 ms, the plan is too. (A fixed 5 ms failed on a slow machine whose turn accrued 0.42 tokens.)
  assert.ok((1 - spent.tokens) * 0.01 - spent.took <= 0.0015 || spent.sleep_s > 0.0015, `more than the fast cadence: ${JSON.stringify(spent)}`);
  // A look with half a token (an event waits, no step yet) plans the same wait: 5 ms, not 1.
  await insertEvent(await db.session('writer look'));
  assert.equal((await tick(c, { set: 'r.tick_at := clock_timestamp(); r.tokens := 0.5;' })).steps, 0);
  const look = await planned();
  assert.ok(look.sleep_s !== null && look.sleep_s >= (1 - look.tokens) * 0.01 - look.took && look.sleep_s <= 0.005, JSON.stringify(look));
  assert.ok(look.took > 0.002 || look.sleep_s > 0.0025, `more than the fast cadence: ${JSON.stringify(look)}`);
  // Never past the lease renewal, nor the run's end (at 10 steps a second the token is 100 ms away).
  const renew = await step(`r.tokens := 1; r.renew_at := clock_timestamp() + interval '40 milliseconds';`, '10');
  assert.ok(renew.sleep_s === null || renew.sleep_s <= 0.04, JSON.stringify(renew));
  const end = await step(`r.tokens := 1; r.deadline := clock_timestamp() + interval '40 milliseconds';`, '10');
  assert.ok(end.sleep_s === null || end.sleep_s <= 0.04, JSON.stringify(end));

  // A slow step has waited part of the 100 ms already: the sleep is what is left of it, counted from
  // the turn's start, not 100 ms more. Here the step's publishing UPDATE waits 60 ms or more for the
  // owner's claim, which another session holds locked (the fence_owner_claim trigger reads it FOR SHARE
  // when the session names its instance, set after the lease is taken so that only the step waits).
  await c.query(`SELECT tidemark.claim_owner('x', 'i1', 600000)`);
  const holder = await db.session('claim holder');
  await holder.query('BEGIN');
  await holder.query(`SELECT 1 FROM tidemark.owner_claims WHERE owner = 'x' FOR UPDATE`);
  const slow = step(`r.tokens := 1; PERFORM set_config('tidemark.instance', 'i1', true);`, '10');
  await waitFor('the step to wait for the claim', async () => {
    const r = await db.observer.query(`SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, [pid]);
    return r.rows[0]?.wait_event_type === 'Lock';
  });
  await new Promise((resolve) => setTimeout(resolve, 60)); // makes the step slow; no timing is asserted on it
  await holder.query('COMMIT');
  const late = await slow;
  assert.ok(late.sleep_s !== null && late.sleep_s <= 0.04, JSON.stringify(late));
});

test('writers that overlap without pause: runs no longer than the step interval still step, and safe_seq follows them (the review of the deferral)', async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const a = await db.session('a');
  const b = await db.session('b');
  // a and b take turns holding the fence open, so it is never free; each
  // run of the loop is as long as its step interval (1 s).
  let expected = 0n;
  let open = a;
  await open.query('BEGIN');
  await insertEvent(open);
  for (let i = 0; i < 3; i += 1) {
    const next = open === a ? b : a;
    await next.query('BEGIN');
    await insertEvent(next);
    await open.query('COMMIT');
    expected += 1n;
    open = next;
    const run = (await c.query(`CALL tidemark.run_watermarker('x', p_run_ms => 1000, p_max_steps_per_second => 1)`)).rows[0];
    assert.ok(Number(run.steps) >= 1, `run ${i}: ${JSON.stringify(run)}`);
  }
  await open.query('COMMIT');
  // Every commit before the last run was published by the end of it, or by the next run's first step.
  await c.query(`CALL tidemark.run_watermarker('x', p_run_ms => 300)`);
  assert.equal(await safeSeq(db.observer), expected + 1n);
});

test('after a publication, idle steps keep the fast cadence for idleGraceMs, then back off', async (t) => {
  const db = await testDb(t);
  const c = await plainClient(db);
  const run = async (grace: number) => {
    await insertEvent(await db.session(`writer ${grace}`));
    const r = (
      await c.query(
        `CALL tidemark.run_watermarker('cadence', p_run_ms => 1500, p_poll_min_ms => 1, p_poll_max_ms => 60000, p_idle_grace_ms => ${grace})`,
      )
    ).rows[0];
    await c.query(`SELECT tidemark.release_lease('cadence')`);
    return { advanced: Number(r.advanced), polls: Number(r.polls) };
  };
  const without = await run(0);
  const withGrace = await run(3_600_000);
  assert.equal(without.advanced, 1);
  assert.equal(withGrace.advanced, 1);
  // Without the grace the idle delays double from 1 ms: 1 + 2 + ... + 1024 >
  // 1500, so at most 11 idle looks fit, however fast the machine.
  assert.ok(without.polls <= 11, `backed off: ${without.polls} idle looks`);
  assert.ok(withGrace.polls >= 50, `kept the fast cadence: ${withGrace.polls} idle looks`);
});
