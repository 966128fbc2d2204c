import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { MIN_RETENTION_MS, Pruner, StreamClient, Watermarker, type StreamEvent } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, waitForBlockedStatement } from '../support/db.js';

after(closeAdmin);

const shortRetention = { retentionMs: 0, allowShortRetention: true } as const;

test('pruning never goes above safe_seq, and advances each stream horizon with its delete', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');
  for (const stream of ['a', 'b', 'a']) await insertEvent(writer, stream); // 1..3
  assert.equal((await watermarker.step()).safeSeq, 3n);
  for (const stream of ['a', 'b']) await insertEvent(writer, stream); // 4, 5: committed, not published

  const result = await new Pruner(pool, { ...shortRetention, batchSize: 2 }).prune();
  assert.equal(result.deleted, 3);
  assert.equal(result.batches, 2);
  assert.equal(result.safeSeq, 3n);
  assert.deepEqual(
    result.horizons.sort((x, y) => x.stream.localeCompare(y.stream)),
    [
      { stream: 'a', prunedThroughSeq: 3n },
      { stream: 'b', prunedThroughSeq: 2n },
    ],
  );
  const left = await observer.query('SELECT seq FROM tidemark.events ORDER BY seq');
  assert.deepEqual(left.rows.map((r) => r.seq), ['4', '5'], 'events above safe_seq are untouched');
  const horizons = await observer.query('SELECT stream, pruned_through_seq FROM tidemark.horizons ORDER BY stream');
  assert.deepEqual(horizons.rows.map((r) => [r.stream, r.pruned_through_seq]), [['a', '3'], ['b', '2']]);
  await watermarker.close();
});

test('retention deletes the oldest prefix only: it stops at the first event younger than the retention age', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const insert = (age: string) =>
    observer.query(`INSERT INTO tidemark.events (stream, kind, key, occurred_at) VALUES ('s', 'k', 'x', now() - $1::interval)`, [age]);
  await insert('10 days'); // 1
  await insert('8 days'); // 2
  await insert('1 day'); // 3: young
  await insert('9 days'); // 4: old, but after a young one
  await watermarker.step();

  const pruner = new Pruner(pool); // 7 days
  assert.equal(pruner.options.retentionMs, 7 * 24 * 3_600_000);
  const result = await pruner.prune();
  assert.equal(result.deleted, 2);
  assert.deepEqual(result.horizons, [{ stream: 's', prunedThroughSeq: 2n }]);
  const left = await observer.query('SELECT seq FROM tidemark.events ORDER BY seq');
  assert.deepEqual(left.rows.map((r) => r.seq), ['3', '4']);
  assert.equal((await pruner.prune()).deleted, 0, 'a second pass finds nothing more');
  await watermarker.close();
});

test('retention cannot delete between the horizon check and the page read: one snapshot serves both', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  const writer = await db.session('writer');
  const client = new StreamClient(pool, { listen: false });
  await client.drain('c', 's', () => undefined); // creates the cursor row at 0
  for (let i = 0; i < 3; i += 1) await insertEvent(writer);
  await watermarker.step();

  // A foreign session holds the cursor row, so the page statement, once its
  // snapshot is taken, waits on the row lock.
  const foreign = await db.session('foreign');
  await foreign.query('BEGIN');
  await foreign.query(`SELECT * FROM tidemark.cursors WHERE consumer = 'c' FOR UPDATE`);
  const delivered: StreamEvent[] = [];
  const draining = client.drain('c', 's', (e) => void delivered.push(e));
  await waitForBlockedStatement(observer, '.read_page(');

  // Meanwhile retention deletes all three events and moves the horizon to 3.
  const pruned = await new Pruner(pool, shortRetention).prune();
  assert.equal(pruned.deleted, 3);
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n, 0);
  await foreign.query('COMMIT');

  // The page saw the old horizon and the old rows, together: it delivers them,
  // and the next page finds cursor = horizon, so no resync and no skip.
  const result = await draining;
  assert.deepEqual(delivered.map((e) => e.seq), [1n, 2n, 3n]);
  assert.equal(result.cursor, 3n);
  assert.equal((await client.drain('c', 's', () => undefined)).delivered, 0);
  const row = (await observer.query(`SELECT resync_count FROM tidemark.cursors`)).rows[0];
  assert.equal(row.resync_count, 0);
  await watermarker.close();
});

test(`a retention below the ${MIN_RETENTION_MS} ms floor is rejected unless explicitly allowed`, async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  assert.throws(() => new Pruner(pool, { retentionMs: 7 }), { code: 'INVALID_OPTIONS', option: 'retentionMs', message: /below the floor/ });
  assert.throws(() => new Pruner(pool, { retentionMs: MIN_RETENTION_MS - 1 }), { option: 'retentionMs' });
  assert.equal(new Pruner(pool, { retentionMs: MIN_RETENTION_MS }).options.retentionMs, MIN_RETENTION_MS);
  assert.equal(new Pruner(pool, { retentionMs: 7, allowShortRetention: true }).options.retentionMs, 7);
  assert.throws(() => new Pruner(pool, { retentionMs: -1, allowShortRetention: true }), { option: 'retentionMs' });
  assert.throws(() => new Pruner(pool, { retentionMs: 1.5 * MIN_RETENTION_MS + 0.5 }), { option: 'retentionMs' });
  assert.throws(() => new Pruner(pool, { batchSize: 0 }), { option: 'batchSize' });
  assert.throws(() => new Pruner(pool, { allowShortRetention: 'yes' as never }), { option: 'allowShortRetention' });
});

test('run() prunes, writes a heartbeat, and stops when aborted', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const watermarker = new Watermarker(pool);
  await insertEvent(await db.session('writer'));
  await watermarker.step();
  const stop = new AbortController();
  const pruner = new Pruner(pool, {
    ...shortRetention,
    owner: 'p1',
    intervalMs: 600_000,
    observer: (result) => {
      if (result.deleted === 1) stop.abort();
    },
  });
  await pruner.run(stop.signal);
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n, 0);
  const beat = await observer.query(`SELECT details FROM tidemark.heartbeats WHERE operation = 'pruner' AND owner = 'p1'`);
  assert.deepEqual(beat.rows[0]?.details, { deleted: 1, safeSeq: '1' });
  await watermarker.close();
});
