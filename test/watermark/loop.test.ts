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
