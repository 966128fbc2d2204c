import assert from 'node:assert/strict';
import pg from 'pg';
import { after, test } from 'node:test';
import { Watermarker, type WatermarkProgress } from '../../src/index.js';
import {
  closeAdmin,
  fenceLocks,
  insertEvent,
  safeSeq,
  testDb,
  waitFor,
  waitForBlockedStatement,
  waitForExclusiveWaiter,
  waitUntilWaiting,
} from '../support/db.js';

after(closeAdmin);

test('the watermarker waits for a registered writer and ignores unrelated transactions and long read-only snapshots', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool(), { fenceTryLimit: 0, lockTimeoutMs: 60_000 });

  // 1. An unrelated writer holds an xid on another table; a report holds a
  //    REPEATABLE READ snapshot over the events table. Neither is a writer of events.
  const unrelated = await db.session('unrelated');
  await unrelated.query('BEGIN');
  await unrelated.query('CREATE TABLE side (x int)');
  await unrelated.query('INSERT INTO side VALUES (1)');
  const report = await db.session('report');
  await report.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await report.query('SELECT count(*) FROM tidemark.events');

  // 2. A committed event is published at once, past both.
  await insertEvent(await db.session('w0'));
  const first = await wm.step();
  assert.equal(first.outcome, 'advanced');
  assert.equal(first.safeSeq, 1n);

  // 3. A registered writer (seq 2 open) and a committed seq 3: the step waits.
  const writer = await db.session('writer');
  await writer.query('BEGIN');
  assert.equal(await insertEvent(writer), 2n);
  assert.equal(await insertEvent(await db.session('w3')), 3n);
  const stepping = wm.step();
  const waiter = await waitForExclusiveWaiter(observer);
  assert.ok((await fenceLocks(observer)).some((l) => l.pid === writer.pid && l.mode === 'ShareLock' && l.granted));
  assert.equal(await safeSeq(observer), 1n);

  // 4. The writer commits; the step completes and publishes through 3.
  await writer.query('COMMIT');
  const second = await stepping;
  assert.equal(second.outcome, 'advanced');
  assert.equal(second.safeSeq, 3n);
  assert.ok(second.blocking);
  assert.ok(second.fenceWaitMs > 0);
  assert.notEqual(waiter, writer.pid);

  // 5. The unrelated transaction and the report are still open, and never mattered.
  await unrelated.query('ROLLBACK');
  await report.query('COMMIT');
  await wm.close();
});

test('a busy fence is a reported outcome, never an error; progress follows once the writer ends', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const observed: WatermarkProgress[] = [];
  const wm = new Watermarker(db.pool(), { fenceTryLimit: 2, lockTimeoutMs: 30, observer: (p) => observed.push(p) });

  const writer = await db.session('writer');
  await writer.query('BEGIN');
  await insertEvent(writer); // seq 1, open
  await insertEvent(await db.session('w2')); // seq 2, committed

  // Two try-lock misses, then one bounded wait that times out.
  const outcomes: Pick<WatermarkProgress, 'outcome' | 'blocking' | 'fenceTimedOut'>[] = [];
  for (let i = 0; i < 3; i++) {
    const p = await wm.step();
    outcomes.push({ outcome: p.outcome, blocking: p.blocking, fenceTimedOut: p.fenceTimedOut });
  }
  assert.deepEqual(outcomes, [
    { outcome: 'fence_busy', blocking: false, fenceTimedOut: false },
    { outcome: 'fence_busy', blocking: false, fenceTimedOut: false },
    { outcome: 'fence_busy', blocking: true, fenceTimedOut: true },
  ]);
  assert.deepEqual(observed.map((p) => p.outcome), ['fence_busy', 'fence_busy', 'fence_busy']);
  assert.equal(await safeSeq(observer), 0n);
  assert.deepEqual((await fenceLocks(observer)).map((l) => l.mode), ['ShareLock'], 'the timed-out request left the queue');

  // After the timeout, the next wait comes only after 2 * 2 + 1 = 5 misses.
  const spaced: boolean[] = [];
  for (let i = 0; i < 6; i++) spaced.push((await wm.step()).blocking);
  assert.deepEqual(spaced, [false, false, false, false, false, true]);

  await writer.query('COMMIT');
  const progress = await wm.step();
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 2n);
  await wm.close();
});

test('under writers that outlast each bounded wait, the waits escalate until one outlasts them: safe_seq still advances', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool(), { fenceTryLimit: 0, lockTimeoutMs: 250, lockTimeoutMaxMs: 5000, leaseTtlMs: 60_000 });
  const writer = await db.session('long writer');
  await writer.query('BEGIN');
  await insertEvent(writer); // seq 1, open longer than lockTimeoutMs
  await insertEvent(await db.session('w2')); // seq 2, committed

  // Each wait times out behind the open writer, and the next one is twice
  // as long. Between waits come try-lock misses (1, then 3: the spacing).
  const steps: [boolean, number][] = [];
  for (let i = 0; i < 2 + 1 + 3; i++) {
    const p = await wm.step();
    assert.equal(p.outcome, 'fence_busy');
    steps.push([p.fenceTimedOut, p.fenceWaitLimitMs!]);
  }
  assert.deepEqual(
    steps.map(([timedOut, ms]) => (timedOut ? ms : 'miss')),
    [250, 'miss', 500, 'miss', 'miss', 'miss'],
  );
  assert.equal(await safeSeq(observer), 0n);

  // The third wait (1000 ms) outlasts the writer, which commits while it waits.
  const stepping = wm.step();
  await waitForExclusiveWaiter(observer);
  await writer.query('COMMIT');
  const progress = await stepping;
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 2n);

  // A publication halves the wait (it does not start the ladder again).
  await writer.query('BEGIN');
  await insertEvent(writer); // seq 3, open
  await insertEvent(await db.session('w3')); // seq 4, committed: a step has work
  const again = await wm.step();
  assert.deepEqual([again.fenceTimedOut, again.fenceWaitLimitMs], [true, 500]);
  await writer.query('ROLLBACK');
  await wm.close();
});

test('waits that time out at the cap become rare; the cap must fit inside the lease', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  assert.throws(() => new Watermarker(pool, { leaseTtlMs: 1500, leaseRenewMs: 500, lockTimeoutMaxMs: 1200 }), {
    option: 'lockTimeoutMaxMs',
    message: /leaseTtlMs - leaseRenewMs \(1000\)/,
  });
  assert.equal(new Watermarker(pool, { leaseTtlMs: 1500, leaseRenewMs: 500 }).options.lockTimeoutMaxMs, 1000, 'the default fits the lease');
  assert.equal(new Watermarker(pool).options.lockTimeoutMaxMs, 2000);

  // A writer longer than the cap: the waits reach the cap, then the misses
  // between waits grow past 64 (up to 1024) instead of staying at 64.
  const wm = new Watermarker(pool, { fenceTryLimit: 0, lockTimeoutMs: 20, lockTimeoutMaxMs: 40, leaseTtlMs: 60_000 });
  const writer = await db.session('leaked writer');
  await writer.query('BEGIN');
  await insertEvent(writer);
  await insertEvent(await db.session('w2'));
  const gaps: number[] = [];
  let misses = 0;
  while (gaps.length < 6) {
    const p = await wm.step();
    if (p.fenceTimedOut) {
      gaps.push(misses);
      misses = 0;
    } else misses += 1;
  }
  assert.deepEqual(gaps, [0, 1, 3, 7, 15, 31], 'misses between timed-out waits double');
  // Waits of 20, 40, 40, ... ms: at the cap from the second on. Under the
  // 64 cap the spacing would stop at 63; at the cap it goes on to 127.
  while (gaps.length < 8) {
    const p = await wm.step();
    if (p.fenceTimedOut) {
      gaps.push(misses);
      misses = 0;
    } else misses += 1;
  }
  assert.deepEqual(gaps.slice(6), [63, 127]);
  await writer.query('ROLLBACK');
  await wm.close();
});

test('a writer cannot skip the fence by shadowing the lock function on its search_path', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query('CREATE SCHEMA evil');
  await observer.query(`CREATE FUNCTION evil.pg_advisory_xact_lock_shared(bigint) RETURNS void LANGUAGE sql AS ''`);
  const writer = await db.session('writer');
  await writer.query('SET search_path = evil, pg_catalog');
  await writer.query('BEGIN');
  await insertEvent(writer);
  assert.ok((await fenceLocks(observer)).some((l) => l.pid === writer.pid && l.mode === 'ShareLock' && l.granted));
  await writer.query('ROLLBACK');
});

test('terminating the watermarker backend mid-wait unblocks queued writers and safe_seq never regresses', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const wm = new Watermarker(pool, { fenceTryLimit: 0, lockTimeoutMs: 60_000 });
  await insertEvent(await db.session('w0'));
  assert.equal((await wm.step()).safeSeq, 1n);

  // 1. A writer holds seq 2 open, seq 3 commits, and the step queues.
  const w1 = await db.session('w1');
  await w1.query('BEGIN');
  assert.equal(await insertEvent(w1), 2n);
  assert.equal(await insertEvent(await db.session('w3')), 3n);
  const stepping = wm.step().then(() => undefined, (err: unknown) => err);
  const wmPid = await waitForExclusiveWaiter(observer);

  // 2. Another writer queues behind the exclusive request.
  const w2 = await db.session('w2');
  const w2Insert = insertEvent(w2);
  await waitUntilWaiting(observer, w2.pid);

  // 3. The watermarker's backend dies: the step fails, the queued writer proceeds.
  await observer.query('SELECT pg_terminate_backend($1)', [wmPid]);
  assert.equal(((await stepping) as { code?: string }).code, '57P01');
  assert.equal(await w2Insert, 4n);
  assert.equal(await safeSeq(observer), 1n);

  // 4. After the writer commits, a new step (on a new connection) publishes.
  await w1.query('COMMIT');
  const progress = await wm.step();
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 4n);
  await wm.close();
});

test('writer pools end abandoned transactions, releasing the shared fence', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const writers = db.pool({ idleInTransactionTimeoutMs: 100 });
  const setting = await writers.query('SHOW idle_in_transaction_session_timeout');
  assert.equal(setting.rows[0].idle_in_transaction_session_timeout, '100ms');
  const defaults = await db.pool().query('SHOW idle_in_transaction_session_timeout');
  assert.equal(defaults.rows[0].idle_in_transaction_session_timeout, '1min');

  const client = await writers.connect();
  client.on('error', () => undefined);
  await client.query('BEGIN');
  await insertEvent(client);
  assert.equal((await fenceLocks(observer)).length, 1);
  // The abandoned writer is ended by the server, and its shared fence with it.
  await waitFor('the abandoned writer to be ended', async () => (await fenceLocks(observer)).length === 0);
  client.release(true);
});

test('an operator holding the watermark row cannot stall a step for its escalated wait, nor escalate it', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await insertEvent(await db.session('writer'));
  const operator = await db.session('operator');

  // Directly: a fence wait allowed 10 minutes, a row lock allowed 50 ms. With
  // the row held, the step fails with 55P03 at once instead of holding the
  // fence (and every writer) for the fence's bound.
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = 'direct', lease_expires_at = clock_timestamp() + interval '1 hour'`);
  await operator.query('BEGIN');
  await operator.query('SELECT * FROM tidemark.watermark FOR UPDATE');
  await assert.rejects(observer.query(`SELECT * FROM tidemark.watermark_step('direct', true, 600000, false, 50)`), { code: '55P03' });
  assert.deepEqual(await fenceLocks(observer), [], 'the fence is not left held');
  await operator.query('ROLLBACK');
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = NULL, lease_expires_at = NULL`);

  // Through the Watermarker: a row-lock timeout is reported, not escalated.
  const errors: unknown[] = [];
  const wm = new Watermarker(db.pool(), { lockTimeoutMs: 50, onError: (e) => errors.push(e) });
  assert.equal((await wm.step()).outcome, 'advanced'); // takes the lease, publishes seq 1
  await insertEvent(await db.session('writer 2'));
  await operator.query('BEGIN');
  await operator.query('SELECT * FROM tidemark.watermark FOR UPDATE');
  const held = await wm.step();
  assert.equal(held.outcome, 'row_locked');
  assert.equal(held.fenceTimedOut, false, 'a row-lock timeout is not a fence timeout');
  assert.equal(held.safeSeq, 1n, 'the progress keeps the last safe_seq');
  assert.equal((errors.at(-1) as { code?: string }).code, '55P03', 'it is reported to onError');
  await operator.query('ROLLBACK');
  const done = await wm.step();
  assert.equal(done.outcome, 'advanced');
  assert.equal(done.safeSeq, 2n);
  await wm.close();
});

test('a watermarker of the previous version keeps stepping through the 4-argument step during a rolling upgrade', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await insertEvent(await db.session('writer'));
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = 'old', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  const row = (await observer.query(`SELECT * FROM tidemark.watermark_step('old', true, 50, false)`)).rows[0];
  assert.equal(row.outcome, 'advanced');
  assert.equal(row.safe_seq, '1');
});

test('a step sends one NOTIFY per advancement, carrying safe_seq and visible when it arrives, and a failed step leaves its pooled connection outside any transaction', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool({ max: 1 }); // every step, and the check below, on the same connection
  const errors: unknown[] = [];
  const wm = new Watermarker(pool, { lockTimeoutMs: 50, onError: (e) => errors.push(e) });
  const listener = new pg.Client({ connectionString: db.url });
  listener.on('error', () => undefined);
  await listener.connect();
  db.defer(() => listener.end());
  const received: string[] = [];
  listener.on('notification', (n) => received.push(n.payload ?? ''));
  await listener.query('LISTEN tidemark_watermark');

  await insertEvent(await db.session('writer 1'));
  assert.equal((await wm.step()).outcome, 'advanced');
  assert.equal((await wm.step()).outcome, 'idle');
  await waitFor('the notification', async () => received.length > 0);
  assert.equal((await listener.query(`SELECT safe_seq FROM tidemark.watermark`)).rows[0].safe_seq, '1', 'visible when it arrives');
  await insertEvent(await db.session('writer 2'));
  assert.equal((await wm.step()).outcome, 'advanced');
  await waitFor('the second notification', async () => received.length > 1);
  assert.deepEqual(received, ['1', '2'], 'one per advancement, carrying safe_seq; none for the idle step');

  // The publishing UPDATE times out on a held watermark row: the step fails
  // inside its transaction block; the connection is rolled back before reuse.
  await insertEvent(await db.session('writer 3'));
  const operator = await db.session('operator');
  await operator.query('BEGIN');
  await operator.query('SELECT * FROM tidemark.watermark FOR UPDATE');
  assert.equal((await wm.step()).outcome, 'row_locked');
  assert.equal((errors.at(-1) as { code?: string }).code, '55P03');
  const state = await pool.query(`SELECT state FROM pg_stat_activity WHERE pid = pg_backend_pid()`);
  assert.equal(state.rows[0].state, 'active', 'a plain query runs: not in an (aborted) transaction block');
  assert.deepEqual(await fenceLocks(observer), []);
  await operator.query('ROLLBACK');
  assert.equal((await wm.step()).safeSeq, 3n);
  await waitFor('the third notification', async () => received.length > 2);
  assert.deepEqual(received, ['1', '2', '3']);
  await wm.close();
});

test('a step on a pooled connection left inside a transaction rolls that transaction back instead of committing it', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query('CREATE TABLE app_work (id int)');
  const pool = db.pool({ max: 1 });
  const errors: unknown[] = [];
  const wm = new Watermarker(pool, { onError: (e) => errors.push(e) });
  await insertEvent(await db.session('writer'));
  const leaker = await pool.connect();
  await leaker.query('BEGIN');
  await leaker.query('INSERT INTO app_work VALUES (1)');
  leaker.release(); // a bug in some other user of the pool: back inside its transaction

  await assert.rejects(wm.step(), { code: '25001' });
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM app_work')).rows[0].n, 0, 'the leaked work was not committed');
  assert.deepEqual(await fenceLocks(observer), []);
  // The lease taken inside the leaked transaction was rolled back with it:
  // the next step learns it is not the leader, the one after takes the lease.
  assert.equal((await wm.step()).outcome, 'not_leader');
  const next = await wm.step();
  assert.equal(next.outcome, 'advanced');
  assert.equal(next.safeSeq, 1n);
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM app_work')).rows[0].n, 0);
  await wm.close();
});

test('a step whose NOTIFY fails after the commit still reports the publication', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  // The watermarker's sessions wait at most 300 ms for an ordinary lock; its step sets its own bounds.
  const pool = db.pool({ max: 1, options: '-c lock_timeout=300' });
  const errors: unknown[] = [];
  const seen: WatermarkProgress[] = [];
  const wm = new Watermarker(pool, { lockTimeoutMs: 60_000, onError: (e) => errors.push(e), observer: (p) => seen.push(p) });
  await insertEvent(await db.session('writer 1'));
  assert.equal((await wm.step()).safeSeq, 1n);

  // Writer 2 holds seq 2 open, seq 3 commits; the step waits for the fence.
  const w2 = await db.session('writer 2');
  await w2.query('BEGIN');
  assert.equal(await insertEvent(w2), 2n);
  assert.equal(await insertEvent(await db.session('writer 3')), 3n);
  const stepping = wm.step();
  await waitForExclusiveWaiter(observer);
  // An operator's LOCK TABLE queues behind the step's own lock on the watermark row's table...
  const operator = await db.session('operator');
  await operator.query('BEGIN');
  const locking = operator.query('LOCK TABLE tidemark.watermark IN ACCESS EXCLUSIVE MODE');
  await waitUntilWaiting(observer, operator.pid);
  // ...and is granted when the fenced transaction commits, so the NOTIFY that
  // reads the table after the commit times out.
  await w2.query('COMMIT');
  await locking;
  // The NOTIFY timed out; the step now asks what was published, and waits for the operator.
  await waitForBlockedStatement(observer, 'SELECT safe_seq FROM');
  await operator.query('ROLLBACK');
  const progress = await stepping;
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 3n);
  assert.equal(seen.at(-1)?.safeSeq, 3n, 'the observer saw it');
  assert.equal((errors.at(-1) as { code?: string }).code, '55P03', 'the NOTIFY failure is reported');
  assert.equal(await safeSeq(observer), 3n);
  await wm.close();
});
