import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { StreamClient, Watermarker, notifyChannel, type ConsumerEvent } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, type TestDb } from '../support/db.js';
import { Recorder } from '../support/latch.js';

after(closeAdmin);

/** The backend pid of the listener's connection, once it has run LISTEN. */
async function listenerPid(db: TestDb): Promise<number | undefined> {
  const r = await db.observer.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %' AND state = 'idle'`,
  );
  return r.rows[0]?.pid;
}

const isPage = (e: ConsumerEvent) => e.type === 'page';

/** Commits one event and publishes it by hand: no watermarker, so no NOTIFY. Only polling can deliver it. */
async function publishSilently(db: TestDb, writer: Awaited<ReturnType<TestDb['session']>>): Promise<bigint> {
  const seq = await insertEvent(writer);
  await db.observer.query('UPDATE tidemark.watermark SET safe_seq = $1', [seq.toString()]);
  return seq;
}

test("the watermarker's NOTIFY wakes a waiting tailer (no polling in between)", async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { pollIntervalMs: 600_000, observer: events.push });
  db.defer(() => client.close());
  const stop = new AbortController();
  const delivered: bigint[] = [];
  const tailing = client.tail('c', 's', (e) => void delivered.push(e.seq), { signal: stop.signal });
  tailing.catch(() => undefined);
  await events.next((e) => e.type === 'listener:listening');
  const start = events.items.length;

  await insertEvent(await db.session('writer'));
  assert.equal((await watermarker.step()).outcome, 'advanced');
  const page = await events.next((e) => e.type === 'page' && e.delivered === 1, start);
  assert.equal(page.type === 'page' && page.wake, 'notify');
  assert.deepEqual(await events.next((e) => e.type === 'listener:notification', start), { type: 'listener:notification', safeSeq: 1n });
  assert.deepEqual(delivered, [1n]);
  stop.abort();
  await assert.rejects(tailing);
  await client.close();
  await watermarker.close();
});

test('listener killed again and again: polling goes on, the back-off reaches its cap, the listener recovers', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool({ max: 4 });
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, { pollIntervalMs: 20, listenerBackoffMinMs: 5, listenerBackoffMaxMs: 40, observer: events.push });
  db.defer(() => client.close());
  const stop = new AbortController();
  const delivered: bigint[] = [];
  const tailing = client.tail('c', 's', (e) => void delivered.push(e.seq), { signal: stop.signal });
  let ended: unknown;
  tailing.catch((err: unknown) => (ended = err));
  const writer = await db.session('writer');

  // Terminate the listener's backend every time it comes up, until the
  // reconnect delay has reached its cap.
  let kills = 0;
  let from = 0;
  for (;;) {
    const at = events.items.length;
    await events.next((e) => e.type === 'listener:listening', from);
    from = at;
    const pid = await listenerPid(db);
    if (pid === undefined) continue;
    await observer.query('SELECT pg_terminate_backend($1)', [pid]);
    kills += 1;
    const failure = await events.next((e) => e.type === 'listener:error', from);
    from = events.items.indexOf(failure) + 1;
    // Events keep flowing while the listener is down: the tailer polls.
    await publishSilently(db, writer);
    await events.next((e) => e.type === 'page' && e.delivered > 0 && e.cursor === BigInt(kills), 0);
    if (failure.type === 'listener:error' && failure.retryInMs === 40) break;
  }
  const delays = events.items.flatMap((e) => (e.type === 'listener:error' ? [e.retryInMs] : []));
  assert.deepEqual(delays.slice(0, 4), [5, 10, 20, 40], 'the delay doubles from the minimum to the cap');
  assert.ok(kills >= 4);
  assert.deepEqual(delivered, Array.from({ length: kills }, (_, i) => BigInt(i + 1)), 'every event delivered once, in order');

  // Left alone, the listener comes back and notifications flow again.
  await events.next((e) => e.type === 'listener:listening', from);
  const pid = await listenerPid(db);
  assert.ok(pid);
  await observer.query('SELECT pg_notify($1, $2)', [notifyChannel('tidemark'), '123456']);
  await events.next((e) => e.type === 'listener:notification' && e.safeSeq === 123456n, from);
  assert.equal(ended, undefined, 'listener failures never end the tail');
  stop.abort();
  await assert.rejects(tailing);
  assert.equal(pool.totalCount, pool.idleCount);
});

test('pool exhausted: the listener backs off, polling delivers, and the listener recovers once a connection frees up', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool({ max: 2 });
  // Someone else holds one of the two connections; the tailer takes the other.
  const hog = await pool.connect();
  let hogged = true;
  db.defer(() => hogged && hog.release());
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(pool, {
    pollIntervalMs: 20,
    listenerBackoffMinMs: 5,
    listenerBackoffMaxMs: 20,
    listenerAcquireTimeoutMs: 10,
    observer: events.push,
  });
  db.defer(() => client.close());
  const stop = new AbortController();
  const delivered: bigint[] = [];
  const tailing = client.tail('c', 's', (e) => void delivered.push(e.seq), { signal: stop.signal });
  let ended: unknown;
  tailing.catch((err: unknown) => (ended = err));

  await events.next((e) => e.type === 'listener:error' && e.retryInMs === 20);
  assert.equal(events.items.some((e) => e.type === 'listener:listening'), false);
  await publishSilently(db, await db.session('writer'));
  await events.next((e) => isPage(e) && e.type === 'page' && e.delivered === 1);
  assert.deepEqual(delivered, [1n]);

  const from = events.items.length;
  hogged = false;
  hog.release();
  await events.next((e) => e.type === 'listener:listening', from);
  await observer.query('SELECT pg_notify($1, $2)', [notifyChannel('tidemark'), '77']);
  await events.next((e) => e.type === 'listener:notification', from);
  assert.equal(ended, undefined);
  stop.abort();
  await assert.rejects(tailing);
  assert.equal(pool.totalCount, pool.idleCount, 'no connection leaked by abandoned checkouts');
});
