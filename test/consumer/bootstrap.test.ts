import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type pg from 'pg';
import { Pruner, ResyncRequiredError, StreamClient, Watermarker, type FenceBusyError, type StreamEvent, type Transaction } from '../../src/index.js';
import { closeAdmin, fenceLocks, insertEvent, safeSeq, testDb, waitForExclusiveWaiter, type Session } from '../support/db.js';

after(closeAdmin);

// The domain: balances, each change written with its event in one transaction.
// The consumer projects the events into `projection`; after any bootstrap and
// tail, projection must equal balances exactly (a doubly applied or lost
// deposit shows as a difference).
const DOMAIN = `
  CREATE TABLE balances (key text PRIMARY KEY, amount int NOT NULL);
  CREATE TABLE projection (key text PRIMARY KEY, amount int NOT NULL);`;

async function deposit(session: Pick<Session, 'query'>, key: string, amount: number): Promise<void> {
  await session.query(`INSERT INTO balances VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET amount = balances.amount + $2`, [key, amount]);
  await session.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('accounts', 'deposited', $1, $2)`, [key, { amount }]);
}

async function depositTx(session: Session, key: string, amount: number): Promise<void> {
  await session.query('BEGIN');
  await deposit(session, key, amount);
  await session.query('COMMIT');
}

const project = async (event: StreamEvent, tx: Transaction): Promise<void> => {
  await tx.query(`INSERT INTO projection VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET amount = projection.amount + $2`, [
    event.key,
    event.payload.amount,
  ]);
};

async function rebuild(tx: Transaction): Promise<void> {
  await tx.query('DELETE FROM projection');
  await tx.query('INSERT INTO projection SELECT key, amount FROM balances');
}

async function table(pool: pg.Pool | Session, name: string): Promise<Record<string, number>> {
  const r = await pool.query(`SELECT key, amount FROM ${name} ORDER BY key`);
  return Object.fromEntries(r.rows.map((row: { key: string; amount: number }) => [row.key, row.amount]));
}

test('bootstrap and tail overlap converge: no lost and no doubly applied effect', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(DOMAIN);
  const pool = db.pool({ max: 6 });
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');

  await depositTx(writer, 'a', 1); // seq 1
  await depositTx(writer, 'b', 2); // seq 2
  assert.equal((await watermarker.step()).safeSeq, 2n);
  // seq 3 commits but is not yet published: a snapshot sees its effect on
  // balances while safe_seq is still 2.
  await depositTx(writer, 'a', 10);
  // seq 4 is drawn and still open: it holds the shared fence.
  const open = await db.session('open writer');
  await open.query('BEGIN');
  await deposit(open, 'b', 20);

  const client = new StreamClient(pool, { listen: false, fenceLockTimeoutMs: 60_000 });
  const opening = client.bootstrap('projector', 'accounts');
  // The bootstrap waits for the exclusive fence, that is for seq 4 to finish.
  await waitForExclusiveWaiter(observer);
  await open.query('COMMIT');
  const snap = await opening;
  assert.equal(snap.safeSeq, 4n, 'the snapshot point covers the unpublished seq 3 and the awaited seq 4');
  assert.equal(snap.priorSeq, 0n);
  assert.deepEqual(await fenceLocks(observer), [], 'the fence is released as soon as the snapshot is taken');

  // Writers go on while the snapshot is open; seq 5 is not in it.
  await depositTx(writer, 'a', 100);
  await rebuild(snap.tx);
  assert.deepEqual(await table(snap.tx as never, 'projection'), { a: 11, b: 22 });
  await snap.commit();
  await snap.close(); // idempotent after commit

  assert.equal((await watermarker.step()).safeSeq, 5n);
  const result = await client.drain('projector', 'accounts', project);
  assert.equal(result.delivered, 1, 'only seq 5 is delivered: 3 and 4 are in the snapshot');
  assert.deepEqual(await table(observer, 'projection'), await table(observer, 'balances'));
  assert.deepEqual(await table(observer, 'projection'), { a: 111, b: 22 });
  await watermarker.close();
});

test('the watermark keeps advancing while a bootstrap snapshot stays open', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(DOMAIN);
  const pool = db.pool({ max: 6 });
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');
  await depositTx(writer, 'a', 1);

  const client = new StreamClient(pool, { listen: false });
  await using snap = await client.bootstrap('projector', 'accounts');
  assert.equal(snap.safeSeq, 1n);
  for (let i = 2; i <= 4; i += 1) {
    await depositTx(writer, 'a', 1);
    const progress = await watermarker.step();
    assert.equal(progress.outcome, 'advanced');
    assert.equal(progress.safeSeq, BigInt(i), 'the open snapshot holds no fence and does not stall the watermark');
  }
  const activity = await observer.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()`);
  assert.equal(activity.rows[0].n, 1, 'the bootstrap snapshot is open meanwhile');
  await watermarker.close();
});

test('closing a bootstrap without commit keeps the prior cursor and releases the connection', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(DOMAIN);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');
  await depositTx(writer, 'a', 1);
  await depositTx(writer, 'a', 2);
  await watermarker.step();
  const client = new StreamClient(pool, { listen: false, batchSize: 1 });
  assert.equal((await client.drain('projector', 'accounts', project, { maxEvents: 1 })).cursor, 1n);

  const snap = await client.bootstrap('projector', 'accounts');
  assert.equal(snap.priorSeq, 1n);
  assert.equal(snap.safeSeq, 2n);
  await rebuild(snap.tx);
  await snap.close();
  await snap.close();
  await assert.rejects(snap.commit(), { code: 'CLOSED' });
  assert.equal(pool.totalCount, pool.idleCount);
  assert.deepEqual(await table(observer, 'projection'), { a: 1 }, 'the rebuild rolled back');
  assert.equal((await client.drain('projector', 'accounts', project)).cursor, 2n);
  assert.deepEqual(await table(observer, 'projection'), { a: 3 });
  await watermarker.close();
});

test('retention past a paused consumer: ResyncRequiredError, resync recorded, bootstrap, then tail converges', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(DOMAIN);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');
  const client = new StreamClient(pool, { listen: false });

  for (const amount of [1, 2, 3]) await depositTx(writer, 'a', amount);
  await watermarker.step();
  assert.equal((await client.drain('projector', 'accounts', project)).cursor, 3n);
  // The consumer pauses. More events, then retention removes everything published.
  for (const amount of [10, 20, 30]) await depositTx(writer, 'b', amount);
  await watermarker.step();
  const pruned = await new Pruner(pool, { retentionMs: 0, allowShortRetention: true }).prune();
  assert.equal(pruned.deleted, 6);
  assert.deepEqual(pruned.horizons, [{ stream: 'accounts', prunedThroughSeq: 6n }]);
  await depositTx(writer, 'a', 100); // seq 7, after the prune
  await watermarker.step();

  const err = await client.drain('projector', 'accounts', project).then(() => assert.fail('should require a resync'), (e: unknown) => e);
  assert.ok(err instanceof ResyncRequiredError);
  assert.equal(err.code, 'RESYNC_REQUIRED');
  assert.deepEqual([err.consumer, err.stream, err.cursor, err.prunedThrough], ['projector', 'accounts', 3n, 6n]);
  const row = (await observer.query(`SELECT seq, resync_count, last_resync_at FROM tidemark.cursors WHERE consumer = 'projector'`)).rows[0];
  assert.equal(row.seq, '3', 'the cursor did not move: nothing was skipped');
  assert.equal(row.resync_count, 1);
  assert.ok(row.last_resync_at instanceof Date);
  // Again: still refused, counted again.
  await assert.rejects(client.drain('projector', 'accounts', project), ResyncRequiredError);

  const snap = await client.bootstrap('projector', 'accounts');
  assert.equal(snap.safeSeq, 7n);
  await rebuild(snap.tx);
  await snap.commit();
  await depositTx(writer, 'b', 1000); // seq 8
  await watermarker.step();
  assert.equal((await client.drain('projector', 'accounts', project)).delivered, 1);
  assert.deepEqual(await table(observer, 'projection'), await table(observer, 'balances'));
  assert.deepEqual(await table(observer, 'projection'), { a: 106, b: 1060 });
  assert.equal((await observer.query(`SELECT resync_count FROM tidemark.cursors`)).rows[0].resync_count, 2);
  assert.equal(await safeSeq(observer), 8n);
  await watermarker.close();
});

test('a bootstrap client stalled between any two of its statements holds no fence: writers go on', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(DOMAIN);
  const writer = await db.session('writer');
  await depositTx(writer, 'a', 1);
  await writer.query(`SET lock_timeout = '10s'`); // a blocked writer fails the test instead of hanging it

  // A client whose every statement first waits here: the process "freezes"
  // before sending it, as a GC pause or a stopped VM would.
  const stalls: string[] = [];
  let stall: ((text: string) => Promise<void>) | undefined;
  class StallingClient extends (await import('pg')).default.Client {
    override query(...args: unknown[]): never {
      const text = typeof args[0] === 'string' ? args[0] : String((args[0] as { text?: string })?.text);
      const run = () => (super.query as (...a: unknown[]) => unknown)(...args);
      return (stall ? stall(text).then(run) : run()) as never;
    }
  }
  const pool = db.pool({ Client: StallingClient } as never);
  const client = new StreamClient(pool, { listen: false });
  stall = async (text) => {
    stalls.push(text.split(/\s+/).slice(0, 3).join(' '));
    assert.deepEqual(await fenceLocks(observer), [], `no fence held while stalled before: ${text.slice(0, 60)}`);
    await depositTx(writer, 'b', 1); // a writer gets through
  };
  const snap = await client.bootstrap('projector', 'accounts');
  await rebuild(snap.tx);
  await snap.commit();
  stall = undefined;
  assert.ok(stalls.length >= 5, `stalled before each statement (${stalls.join(' | ')})`);
  assert.ok(stalls.some((s) => s.includes('pg_advisory_lock(')), 'including right before the fenced message');
  // Every deposit made while stalled after the snapshot is beyond safeSeq, and tail applies it once.
  await new Watermarker(pool).step();
  await client.drain('projector', 'accounts', project);
  assert.deepEqual(await table(observer, 'projection'), await table(observer, 'balances'));
});

test('a snapshot handle is dead after commit or close, and StreamClient.close() closes open snapshots', async (t) => {
  const db = await testDb(t);
  await db.observer.query(DOMAIN);
  const pool = db.pool();
  const client = new StreamClient(pool, { listen: false });
  const snap = await client.bootstrap('projector', 'accounts');
  await snap.commit();
  await assert.rejects(snap.tx.query('SELECT 1'), { code: 'CLOSED' });

  const open = await client.bootstrap('projector', 'accounts');
  await rebuild(open.tx);
  await client.close();
  await assert.rejects(open.tx.query('SELECT 1'), { code: 'CLOSED' });
  await assert.rejects(open.commit(), { code: 'CLOSED' });
  assert.equal(pool.totalCount, pool.idleCount);
  await assert.rejects(client.bootstrap('projector', 'accounts'), { code: 'CLOSED' });
});

test('DDL holding the outbox tables makes bootstrap give up with FENCE_BUSY, never leaving the fence held', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  // Someone runs DDL on the watermark table: the fenced snapshot statement would wait for it.
  const ddl = await db.session('ddl');
  await ddl.query('BEGIN');
  await ddl.query('LOCK TABLE tidemark.watermark IN ACCESS EXCLUSIVE MODE');
  // Each attempt holds the fence at most fenceLockTimeoutMs (not the 60 s of
  // lockTimeoutMs), releases it, and tries again until bootstrapFenceTimeoutMs.
  const client = new StreamClient(pool, { listen: false, fenceLockTimeoutMs: 20, lockTimeoutMs: 60_000, bootstrapFenceTimeoutMs: 300 });
  const err = await client.bootstrap('projector', 'accounts').then(() => assert.fail('should fail'), (e: unknown) => e);
  assert.equal((err as { code?: string }).code, 'FENCE_BUSY');
  assert.deepEqual(await fenceLocks(observer), [], 'the fence is not left held');
  await ddl.query('ROLLBACK');
  const snap = await client.bootstrap('projector', 'accounts');
  assert.equal(snap.safeSeq, 0n);
  await snap.close();
  assert.equal(pool.totalCount, pool.idleCount);
});

test('behind a long writer, bootstrap queues other writers one short bounded attempt at a time, and names the writer when it gives up', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool({ max: 6 });
  const long = await db.session('long');
  await long.query('BEGIN');
  assert.equal(await insertEvent(long), 1n);

  // Bootstrap tries for the instant again and again (each attempt waits at most 20 ms)...
  const client = new StreamClient(pool, { listen: false, fenceLockTimeoutMs: 20, bootstrapFenceTimeoutMs: 120_000 });
  let settled = false;
  const booting = client.bootstrap('projector', 's').finally(() => (settled = true));
  await waitForExclusiveWaiter(observer);
  // ...and another writer gets through meanwhile: it waits for one attempt at most, not for the long writer.
  assert.equal(await insertEvent(await db.session('other')), 2n);
  assert.equal(settled, false, 'bootstrap is still trying');
  await long.query('COMMIT');
  const snap = await booting;
  assert.equal(snap.safeSeq, 2n);
  await snap.close();

  // Within a short total bound it gives up, naming the writer in flight.
  await long.query('BEGIN');
  await insertEvent(long);
  const impatient = new StreamClient(pool, { listen: false, fenceLockTimeoutMs: 20, bootstrapFenceTimeoutMs: 200 });
  const err = await impatient.bootstrap('projector', 's').then(() => assert.fail('should fail'), (e: unknown) => e as FenceBusyError);
  assert.equal(err.code, 'FENCE_BUSY');
  assert.equal(err.holders[0]?.pid, long.pid);
  assert.match(err.message, /^bootstrap: could not take the fence in \d+ ms: 1 writer held it, the oldest pid \d+ \("test:long"\) open for \d+\.\d s\. Retry once they end\.$/);
  assert.deepEqual((await fenceLocks(observer)).map((l) => [l.pid, l.mode]), [[long.pid, 'ShareLock']], 'nothing of bootstrap is left');
  await long.query('ROLLBACK');
});
