import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import {
  ConnectionLostError,
  CursorContentionError,
  HandlerError,
  isRetryable,
  StreamClient,
  Watermarker,
  type ConsumerEvent,
  type StreamEvent,
  type Transaction,
} from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, testRole, waitForBlockedStatement, type TestDb } from '../support/db.js';
import { latch, Recorder } from '../support/latch.js';

after(closeAdmin);

/** Appends `n` committed events to stream `s` and publishes them. */
async function publish(db: TestDb, n: number, watermarker: Watermarker): Promise<void> {
  const writer = await db.session('writer');
  for (let i = 0; i < n; i += 1) await insertEvent(writer);
  assert.equal((await watermarker.step()).outcome, 'advanced');
}

async function cursorOf(db: TestDb, consumer = 'c', stream = 's'): Promise<bigint | undefined> {
  const r = await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = $2`, [consumer, stream]);
  return r.rows[0] ? BigInt(r.rows[0].seq) : undefined;
}

test('tail delivers a late lower seq after a higher one committed first, both in order, once', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 6 });
  const watermarker = new Watermarker(pool);
  const early = await db.session('early');
  const late = await db.session('late');

  // The early writer draws seq 1 and stays open; the late one draws seq 2 and commits.
  await early.query('BEGIN');
  assert.equal(await insertEvent(early), 1n);
  assert.equal(await insertEvent(late), 2n);
  // A naive `seq > cursor` reader would take 2 now and never see 1. The step
  // sees seq 1's writer in flight, so safe_seq stays at 0.
  assert.equal((await watermarker.step()).outcome, 'pending');

  const pages = new Recorder<ConsumerEvent>();
  const delivered: bigint[] = [];
  const client = new StreamClient(pool, { pollIntervalMs: 600_000, observer: pages.push });
  const stop = new AbortController();
  db.defer(() => client.close());
  const tailing = client.tail('c', 's', (e) => void delivered.push(e.seq), { signal: stop.signal });
  tailing.catch(() => undefined);
  const first = await pages.next((e) => e.type === 'page');
  assert.deepEqual(first, { type: 'page', consumer: 'c', stream: 's', delivered: 0, cursor: 0n, safeSeq: 0n, wake: 'start' });
  // A NOTIFY sent before LISTEN is lost (the listener then wakes tailers once
  // when it comes up); wait for it so that the wake-up below is the NOTIFY.
  await pages.next((e) => e.type === 'listener:listening');

  // The early writer commits; the next step publishes 2, and its NOTIFY wakes the tailer.
  await early.query('COMMIT');
  assert.equal((await watermarker.step()).safeSeq, 2n);
  const woke = await pages.next((e) => e.type === 'page' && e.delivered > 0);
  assert.deepEqual(woke, { type: 'page', consumer: 'c', stream: 's', delivered: 2, cursor: 2n, safeSeq: 2n, wake: 'notify' });
  assert.deepEqual(delivered, [1n, 2n]);

  stop.abort(new Error('done'));
  await assert.rejects(tailing, { message: 'done' });
  assert.equal(await cursorOf(db), 2n);
  await client.close();
  await watermarker.close();
});

test('a page is one transaction: a handler error rolls back its effects and the cursor; a restart applies each effect once', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, 5, watermarker);

  const crash = new Error('crash after writing effects');
  const crashing = new StreamClient(pool, { batchSize: 5, listen: false });
  const err = await crashing
    .drain('c', 's', async (e, tx) => {
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (e.seq === 3n) throw crash;
    })
    .then(() => assert.fail('drain should fail'), (e: unknown) => e);
  assert.ok(err instanceof HandlerError);
  assert.equal(err.code, 'HANDLER_FAILED');
  assert.equal(err.seq, 3n);
  assert.equal(err.cause, crash, 'the handler error is kept as the cause, unchanged');
  assert.equal(isRetryable(err), false);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM applied')).rows[0].n, 0, 'effects rolled back');
  assert.equal(await cursorOf(db), 0n, 'cursor rolled back');

  // The process "restarts": a new client resumes from the durable cursor.
  // (The primary key on applied.seq would reject a second application.)
  const restarted = new StreamClient(pool, { batchSize: 2, listen: false });
  const result = await restarted.drain('c', 's', async (e, tx) => {
    await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
  });
  assert.deepEqual(result, { delivered: 5, cursor: 5n, safeSeq: 5n });
  const applied = await db.observer.query('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => BigInt(r.seq)), [1n, 2n, 3n, 4n, 5n]);
  await watermarker.close();
});

test('a crash of the tail connection mid-page applies nothing; the restart applies each effect once', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, 3, watermarker);

  const holding = latch();
  const reached = latch<number>();
  const client = new StreamClient(pool, { listen: false });
  const draining = client.drain('c', 's', async (e, tx) => {
    await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
    if (e.seq === 2n) {
      reached.open((await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid);
      await holding.promise;
    }
    await tx.query('SELECT 1');
  });
  draining.catch(() => undefined);
  // The server loses the connection while the page is open (as if the process died).
  const pid = await reached.promise;
  await db.observer.query('SELECT pg_terminate_backend($1)', [pid]);
  holding.open();
  const err = await draining.then(() => assert.fail('drain should fail'), (e: unknown) => e);
  assert.ok(err instanceof ConnectionLostError, 'a lost connection, not a handler failure');
  assert.ok(err.cause instanceof Error, "the handler's failed statement is the cause");
  assert.equal(isRetryable(err), true);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM applied')).rows[0].n, 0);

  const result = await new StreamClient(pool, { listen: false }).drain('c', 's', async (e, tx) => {
    await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
  });
  assert.equal(result.delivered, 3);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM applied')).rows[0].n, 3);
  await watermarker.close();
});

test('a second tailer or a bootstrap on a held cursor gets CursorContentionError; after the first stops, it can run', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 8 });
  const pages = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { pollIntervalMs: 600_000, observer: pages.push });
  db.defer(() => client.close());
  const stop = new AbortController();
  const first = client.tail('c', 's', () => undefined, { signal: stop.signal });
  first.catch(() => undefined);
  await pages.next((e) => e.type === 'page');

  const other = new StreamClient(pool, { listen: false });
  const err = await other.drain('c', 's', () => undefined).then(() => assert.fail('should contend'), (e: unknown) => e);
  assert.ok(err instanceof CursorContentionError);
  assert.equal(err.code, 'CURSOR_CONTENTION');
  assert.equal(isRetryable(err), true);
  await assert.rejects(other.bootstrap('c', 's'), CursorContentionError);
  // Another consumer, or the same consumer on another stream, is independent.
  assert.equal((await other.drain('c2', 's', () => undefined)).delivered, 0);
  assert.equal((await other.drain('c', 's2', () => undefined)).delivered, 0);

  stop.abort(new Error('stop'));
  await assert.rejects(first, { message: 'stop' });
  assert.equal((await other.drain('c', 's', () => undefined)).delivered, 0);
  await client.close();
});

test('a foreign session holding the cursor row makes a page fail with CursorContentionError after lockTimeoutMs', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const client = new StreamClient(pool, { listen: false, lockTimeoutMs: 50 });
  await client.drain('c', 's', () => undefined); // creates the cursor row
  const foreign = await db.session('foreign');
  await foreign.query('BEGIN');
  await foreign.query(`SELECT * FROM tidemark.cursors WHERE consumer = 'c' FOR UPDATE`);
  const err = await client.drain('c', 's', () => undefined).then(() => assert.fail('should contend'), (e: unknown) => e);
  assert.ok(err instanceof CursorContentionError);
  assert.equal((err.cause as { code?: string }).code, '55P03');
  await foreign.query('ROLLBACK');
});

test('a first-touch race on creating the cursor row is retried internally', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await publish(db, 3, watermarker);

  // A foreign session creates the same cursor row (at seq 1) and has not committed yet.
  const foreign = await db.session('foreign');
  await foreign.query('BEGIN');
  await foreign.query(`INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('c', 's', 1)`);

  const delivered: bigint[] = [];
  const client = new StreamClient(pool, { listen: false });
  const draining = client.drain('c', 's', (e) => void delivered.push(e.seq));
  // The page finds no row, so the client creates it, and waits on the foreign insert.
  await waitForBlockedStatement(db.observer, 'INSERT INTO "tidemark".cursors');
  await foreign.query('COMMIT');
  const result = await draining;
  assert.deepEqual(delivered, [2n, 3n], 'delivery resumes from the row the other session created');
  assert.equal(result.cursor, 3n);
  await watermarker.close();
});

test('aborting a waiting tail rejects with the abort reason and releases every connection and lock', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 4 });
  const pages = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { pollIntervalMs: 600_000, observer: pages.push });
  db.defer(() => client.close());
  const stop = new AbortController();
  const tailing = client.tail('c', 's', () => undefined, { signal: stop.signal });
  tailing.catch(() => undefined);
  await pages.next((e) => e.type === 'page');
  await pages.next((e) => e.type === 'listener:listening');
  const reason = new Error('shutting down');
  stop.abort(reason);
  await assert.rejects(tailing, (err) => err === reason);
  await pages.next((e) => e.type === 'listener:stopped');
  assert.equal(pool.totalCount, pool.idleCount, 'no connection is still checked out');
  const locks = await db.observer.query(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
  );
  assert.deepEqual(locks.rows, [], 'the cursor lock is released');
  // Every connection back in the pool has stopped listening (pg_listening_channels is per session).
  const pooled = await Promise.all(Array.from({ length: pool.idleCount }, () => pool.connect()));
  for (const c of pooled) {
    assert.deepEqual((await c.query('SELECT pg_listening_channels() AS ch')).rows, []);
    c.release();
  }
  await client.close();
});

test('aborting while a handler runs commits the handled prefix, then rejects with the abort reason', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, 3, watermarker);

  const inside = latch();
  const release = latch();
  const stop = new AbortController();
  const client = new StreamClient(pool, { listen: false });
  db.defer(() => client.close());
  const tailing = client.tail(
    'c',
    's',
    async (e, tx) => {
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (e.seq === 1n) {
        inside.open();
        await release.promise;
      }
    },
    { signal: stop.signal },
  );
  tailing.catch(() => undefined);
  await inside.promise;
  const reason = new Error('stop');
  stop.abort(reason);
  release.open();
  await assert.rejects(tailing, (err) => err === reason);
  assert.equal(await cursorOf(db), 1n, 'the event whose handler finished is committed');
  const applied = await db.observer.query('SELECT seq FROM applied');
  assert.deepEqual(applied.rows.map((r) => BigInt(r.seq)), [1n]);
  assert.equal(pool.totalCount, pool.idleCount);
  await watermarker.close();
});

test("a handler's own error survives an abort that happened while it ran", async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await publish(db, 2, watermarker);

  const inside = latch();
  const release = latch();
  const own = new Error('the handler failed on its own');
  const stop = new AbortController();
  const client = new StreamClient(pool, { listen: false });
  db.defer(() => client.close());
  const tailing = client.tail(
    'c',
    's',
    async () => {
      inside.open();
      await release.promise;
      throw own;
    },
    { signal: stop.signal },
  );
  tailing.catch(() => undefined);
  await inside.promise;
  stop.abort(new Error('stop'));
  release.open();
  const err = await tailing.then(() => assert.fail('tail should fail'), (e: unknown) => e);
  assert.ok(err instanceof HandlerError);
  assert.equal(err.cause, own);
  assert.equal(await cursorOf(db), 0n, 'the page rolled back');
  await watermarker.close();
});

test('close() ends running tails with ClosedError and releases their connections', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const pages = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { pollIntervalMs: 600_000, observer: pages.push });
  const tailing = client.tail('c', 's', () => undefined);
  tailing.catch(() => undefined);
  await pages.next((e) => e.type === 'page');
  await client.close();
  await assert.rejects(tailing, { code: 'CLOSED' });
  assert.equal(pool.totalCount, pool.idleCount);
  await assert.rejects(client.drain('c', 's', () => undefined), { code: 'CLOSED' });
});

test('events reach the handler with their fields; drain honours maxEvents; bad arguments are rejected', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query(
    `INSERT INTO tidemark.events (stream, kind, key, payload, headers) VALUES ('s', 'order.placed', 'o-1', '{"total": 42}', '{"trace": "t1"}')`,
  );
  await publish(db, 2, watermarker);
  const seen: StreamEvent[] = [];
  const client = new StreamClient(pool, { listen: false });
  const result = await client.drain('c', 's', (e) => void seen.push(e), { maxEvents: 2 });
  assert.deepEqual(result, { delivered: 2, cursor: 2n, safeSeq: 3n });
  assert.deepEqual({ ...seen[0], occurredAt: undefined }, {
    seq: 1n,
    stream: 's',
    kind: 'order.placed',
    key: 'o-1',
    payload: { total: 42 },
    payloadText: '{"total": 42}',
    headers: { trace: 't1' },
    headersText: '{"trace": "t1"}',
    occurredAt: undefined,
  });
  assert.ok(seen[0]!.occurredAt instanceof Date);

  await assert.rejects(client.drain('', 's', () => undefined), { code: 'INVALID_OPTIONS', option: 'consumer' });
  await assert.rejects(client.drain('c', 's', () => undefined, { maxEvents: 0 }), { code: 'INVALID_OPTIONS', option: 'maxEvents' });
  await assert.rejects(client.tail('c', 's', 'nope' as never), { code: 'INVALID_OPTIONS', option: 'handler' });
  assert.throws(() => new StreamClient(pool, { batchSize: 0 }), { option: 'batchSize' });
  assert.throws(() => new StreamClient(pool, { listenerBackoffMinMs: 50, listenerBackoffMaxMs: 10 }), { option: 'listenerBackoffMaxMs' });
  assert.throws(() => new StreamClient(pool, { schema: 'Bad' }), { option: 'schema' });
  assert.equal(await cursorOf(db), 2n, 'nothing was written by the rejected calls');
  await watermarker.close();
});

test('nothing a handler leaves behind reaches the pool: its tx handle dies with the page, and session state is reset', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 1 });
  const watermarker = new Watermarker(db.pool());
  await publish(db, 1, watermarker);
  let kept: Transaction | undefined;
  // A role the handler switches to (allowed to go on with the page: consumer 'c').
  const role = testRole(t, 'h');
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['c'])`, [role]);
  const client = new StreamClient(pool, { listen: false });
  await client.drain('c', 's', async (_e, tx) => {
    kept = tx;
    // Session state a careless handler might leave on the borrowed connection.
    await tx.query('SELECT pg_advisory_lock(4242)');
    await tx.query('LISTEN handler_channel');
    await tx.query(`SET statement_timeout = '1234ms'`);
    await tx.query('CREATE TEMP TABLE handler_scratch (x int)');
    await tx.query(`SET ROLE "${role}"`);
  });
  await assert.rejects(kept!.query('SELECT 1'), { code: 'CLOSED' }, 'a kept handle cannot reach the pooled connection');
  const c = await pool.connect(); // the same, single, connection
  try {
    assert.deepEqual((await c.query('SELECT pg_listening_channels() AS ch')).rows, []);
    assert.equal((await c.query('SHOW statement_timeout')).rows[0].statement_timeout, '0');
    assert.equal((await c.query('SELECT current_user = session_user AS same')).rows[0].same, true, 'SET ROLE undone');
    assert.equal((await c.query(`SELECT to_regclass('pg_temp.handler_scratch') AS t`)).rows[0].t, null, 'temp table gone');
    const locks = await c.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`);
    assert.equal(locks.rows[0].n, 0);
  } finally {
    c.release();
  }
  await watermarker.close();
});

test('with retry: false, a tail whose connection is terminated while it waits ends with a retryable ConnectionLostError', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const pages = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { listen: false, pollIntervalMs: 600_000, observer: pages.push, retry: false });
  db.defer(() => client.close());
  const tailing = client.tail('c', 's', () => undefined);
  tailing.catch(() => undefined);
  await pages.next((e) => e.type === 'page');
  const pid = (await db.observer.query(`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'COMMIT%' AND pid <> pg_backend_pid()`)).rows[0].pid;
  await db.observer.query('SELECT pg_terminate_backend($1)', [pid]);
  const err = await tailing.then(() => assert.fail('tail should end'), (e: unknown) => e);
  assert.ok(err instanceof ConnectionLostError, String(err));
  assert.equal(isRetryable(err), true);
  assert.equal(pool.totalCount, pool.idleCount);
});

test('a tail\'s waits leave nothing behind on its cursor hold, and a wait still ends when the connection is lost', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const { CursorHold } = await import('../../src/consumer/cursor-hold.js');
  const { pollOnly } = await import('../../src/consumer/stream-client.js');
  const hold = await CursorHold.open(pool, 'tidemark', 'c', 's', undefined, 10_000);
  const never = new AbortController().signal;
  // A tail that polls for a day waits ~86,000 times on one hold: each wait must take its listener back.
  for (let i = 0; i < 2000; i += 1) await pollOnly(0, never, hold);
  assert.equal(hold.lostListenerCount, 0);
  const waiting = pollOnly(60_000, never, hold);
  assert.equal(hold.lostListenerCount, 1);
  // Handled before the backend is terminated: the loss may arrive before the terminate's own answer.
  const ended = assert.rejects(waiting, (err: unknown) => err instanceof Error && err.name === 'ConnectionLostError');
  const pid = (hold.client as unknown as { processID: number }).processID;
  await db.observer.query('SELECT pg_terminate_backend($1)', [pid]);
  await ended;
  assert.equal(hold.lostListenerCount, 0);
  await assert.rejects(pollOnly(60_000, never, hold), (err: unknown) => err instanceof Error && err.name === 'ConnectionLostError', 'a wait begun after the loss ends at once');
  await hold.release().catch(() => undefined);
});
