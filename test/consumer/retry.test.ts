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
} from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, waitFor, type TestDb } from '../support/db.js';
import { Recorder } from '../support/latch.js';

after(closeAdmin);

async function publish(db: TestDb, n: number, watermarker: Watermarker): Promise<void> {
  const writer = await db.session('writer');
  for (let i = 0; i < n; i += 1) await insertEvent(writer);
  assert.equal((await watermarker.step()).outcome, 'advanced');
}

/** The backend holding the tail's cursor lock (its session-level advisory lock). */
async function tailBackend(db: TestDb): Promise<number> {
  return waitFor('the tail to hold its cursor lock', async () => {
    const r = await db.observer.query<{ pid: number }>(
      `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND pid <> pg_backend_pid()`,
    );
    return r.rows[0]?.pid;
  });
}

test('a tail whose connection is terminated, while it waits and mid-page, recovers by itself: each effect once, in order', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { listen: false, pollIntervalMs: 20, retryMinMs: 5, retryMaxMs: 20, observer: events.push });
  db.defer(() => client.close());
  const applied: bigint[] = [];
  let killMidPage = false;
  const stop = new AbortController();
  const tailing = client.tail(
    'c',
    's',
    async (e, tx) => {
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (killMidPage && e.seq === 5n) {
        killMidPage = false;
        const pid = (await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
        await db.observer.query('SELECT pg_terminate_backend($1)', [pid]);
        await tx.query('SELECT 1'); // fails: the connection is gone, the page rolls back
      }
      applied.push(e.seq);
    },
    { signal: stop.signal },
  );
  tailing.catch(() => undefined);

  await publish(db, 3, watermarker);
  await waitFor('3 events applied', async () => applied.length === 3);
  // Killed while it waits for more.
  await db.observer.query('SELECT pg_terminate_backend($1)', [await tailBackend(db)]);
  const first = await events.next((e) => e.type === 'retry');
  assert.ok(first.type === 'retry' && first.error instanceof ConnectionLostError, 'the loss is reported as a retry');
  // Killed in the middle of a page: the page rolls back and is delivered again.
  killMidPage = true;
  await publish(db, 4, watermarker);
  await waitFor('7 events applied', async () => (await db.observer.query('SELECT count(*)::int AS n FROM applied')).rows[0].n === 7);
  await waitFor('the cursor at 7', async () => (await db.observer.query(`SELECT seq FROM tidemark.cursors`)).rows[0]?.seq === '7');
  assert.deepEqual(applied.slice(0, 3), [1n, 2n, 3n]);
  assert.equal(events.items.filter((e) => e.type === 'retry').length >= 2, true, 'both losses were retried');
  const rows = await db.observer.query('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(rows.rows.map((r) => BigInt(r.seq)), [1n, 2n, 3n, 4n, 5n, 6n, 7n]);
  stop.abort();
  await assert.rejects(tailing);
  assert.equal(pool.totalCount, pool.idleCount, 'no connection leaked');
  await watermarker.close();
});

test('a tail whose server stops answering (half-open) notices within lockTimeoutMs + responseTimeoutMs, drops the connection and resumes', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, {
    listen: false,
    pollIntervalMs: 20,
    lockTimeoutMs: 100,
    responseTimeoutMs: 300,
    retryMinMs: 5,
    retryMaxMs: 50,
    observer: events.push,
  });
  db.defer(() => client.close());
  const delivered: bigint[] = [];
  const stop = new AbortController();
  const tailing = client.tail('c', 's', (e) => void delivered.push(e.seq), { signal: stop.signal });
  tailing.catch(() => undefined);
  await publish(db, 2, watermarker);
  await waitFor('2 events delivered', async () => delivered.length === 2);

  // SIGSTOP the backend: its socket stays open, it just never answers.
  const pid = await tailBackend(db);
  // A stopped backend blocks DROP DATABASE on the whole server: always resume it.
  const resume = () => process.kill(pid, 'SIGCONT');
  process.once('exit', resume);
  process.kill(pid, 'SIGSTOP');
  try {
    const lost = await events.next((e) => e.type === 'retry', 0, 10_000);
    assert.ok(lost.type === 'retry' && lost.error instanceof ConnectionLostError, String(lost.type === 'retry' && lost.error));
    assert.match(String((lost.error as Error).cause), /no answer from the server within 400 ms/);
    // The stopped backend still holds the cursor lock: the tail retries the contention.
    await events.next((e) => e.type === 'retry' && e.error instanceof CursorContentionError, 0, 10_000);
  } finally {
    resume();
    process.off('exit', resume);
  }
  // Resumed, the old backend finds its client gone and ends, freeing the cursor.
  await publish(db, 2, watermarker);
  await waitFor('4 events delivered', async () => delivered.length === 4);
  assert.deepEqual(delivered, [1n, 2n, 3n, 4n]);
  stop.abort();
  await assert.rejects(tailing);
  await watermarker.close();
});

test('cursor contention on the first acquisition still rejects at once, with retry on', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const first = new StreamClient(pool, { listen: false });
  const second = new StreamClient(pool, { listen: false });
  db.defer(() => first.close());
  db.defer(() => second.close());
  const stop = new AbortController();
  const running = first.tail('c', 's', () => undefined, { signal: stop.signal });
  running.catch(() => undefined);
  await tailBackend(db);
  await assert.rejects(second.tail('c', 's', () => undefined), CursorContentionError);
  stop.abort();
  await assert.rejects(running);
});

test('a handler error from application logic still ends the tail (no retry); beforeCommit failures roll the page back', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, 3, watermarker);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { listen: false, observer: events.push });
  db.defer(() => client.close());
  const boom = new TypeError('x is undefined');
  const err = await client.tail('c', 's', () => {
    throw boom;
  }).then(() => assert.fail('tail should end'), (e: unknown) => e);
  assert.ok(err instanceof HandlerError && err.cause === boom);
  assert.equal(events.items.some((e) => e.type === 'retry'), false);

  // beforeCommit sees the page; its failure (a closed pipe, say) rolls the page back and is not retried.
  const pipe = Object.assign(new Error('write EPIPE'), { code: 'EPIPE', syscall: 'write', errno: -32 });
  const seen: { delivered: number; cursor: bigint }[] = [];
  const failed = await client
    .drain(
      'c',
      's',
      async (e, tx) => void (await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq])),
      {
        beforeCommit: (page) => {
          seen.push({ delivered: page.delivered, cursor: page.cursor });
          throw pipe;
        },
      },
    )
    .then(() => assert.fail('drain should fail'), (e: unknown) => e);
  assert.ok(failed instanceof HandlerError && failed.cause === pipe);
  assert.equal(isRetryable(failed), false, 'a broken stdout is not a database error to retry');
  assert.deepEqual(seen, [{ delivered: 3, cursor: 3n }]);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM applied')).rows[0].n, 0, 'effects rolled back');
  assert.equal((await db.observer.query(`SELECT seq FROM tidemark.cursors`)).rows[0].seq, '0', 'cursor not moved');
  await watermarker.close();
});

test("node-postgres's own connection errors, which carry no code, are retryable", () => {
  assert.equal(isRetryable(new Error('Connection terminated unexpectedly')), true);
  assert.equal(isRetryable(new Error('Connection terminated due to connection timeout')), true);
  assert.equal(isRetryable(new Error('connection terminated unexpectedly, said the handler')), false);
  assert.equal(isRetryable(Object.assign(new Error('Connection terminated unexpectedly'), { code: '23505' })), false);
});
