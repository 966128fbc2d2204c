import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { cli } from '../support/cli.js';

after(closeAdmin);

test('status --json reports the watermark, lease, streams and consumers: every seq and event count a string, ages numbers', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  await cli(['append', '--ndjson'], { env, input: '{"stream":"a","kind":"k","key":"1"}\n{"stream":"b","kind":"k","key":"2"}\n{"stream":"a","kind":"k","key":"3"}\n' });
  await cli(['watermark', '--once'], { env });
  await cli(['append', '--stream', 'a', '--kind', 'k', '--key', '4'], { env }); // above safe_seq
  await cli(['tail', '--consumer', 'c', '--stream', 'a', '--once', '--limit', '1'], { env });
  const r = await cli(['status', '--json'], { env });
  assert.equal(r.code, 0, r.stderr);
  const s = JSON.parse(r.stdout);
  assert.equal(s.schema, 'tidemark');
  assert.equal(s.safeSeq, '3');
  assert.equal(s.maxSeq, '4');
  assert.equal(s.lagEvents, '1');
  assert.equal(typeof s.lagSeconds, 'number');
  assert.deepEqual(s.lease, { owner: null, expiresAt: null, live: false });
  assert.deepEqual(s.streams, [
    { stream: 'a', events: '3', maxSeq: '4', prunedThroughSeq: '0' },
    { stream: 'b', events: '1', maxSeq: '2', prunedThroughSeq: '0' },
  ]);
  assert.equal(s.consumers.length, 1);
  assert.deepEqual({ ...s.consumers[0], updatedAt: undefined }, { consumer: 'c', stream: 'a', seq: '1', lagEvents: '1', resyncCount: 0, lastResyncAt: null, updatedAt: undefined });
  // The same kind of figure has the same type everywhere (README, "Command line").
  assert.equal(typeof s.lagEvents, typeof s.consumers[0].lagEvents);
  assert.equal(typeof s.watermarkUpdatedAt, 'string');
  const text = await cli(['status'], { env });
  assert.match(text.stdout, /^safe_seq +3$/m);
  assert.match(text.stdout, /^c +a +1 +1 +0 /m);
});

test('prune --once deletes below safe_seq; a consumer left behind exits 3 with how to bootstrap', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  await cli(['append', '--ndjson'], { env, input: '{"stream":"s","kind":"k","key":"1"}\n{"stream":"s","kind":"k","key":"2"}\n' });
  await cli(['watermark', '--once'], { env });
  const pruned = await cli(['prune', '--once', '--retention', '0s', '--allow-short-retention', '--json'], { env });
  assert.equal(pruned.code, 0, pruned.stderr);
  assert.deepEqual(JSON.parse(pruned.stdout), { deleted: '2', batches: 1, horizons: [{ stream: 's', prunedThroughSeq: '2' }], safeSeq: '2' });

  const behind = await cli(['tail', '--consumer', 'late', '--stream', 's', '--once'], { env });
  assert.equal(behind.code, 3);
  assert.match(behind.stderr, /retention removed events through seq 2/);
  assert.match(behind.stderr, /tidemark tail --consumer late --stream s --bootstrap/);
  assert.equal(behind.stderr.trim().split('\n').length, 1);
  const resynced = await db.observer.query(`SELECT resync_count FROM tidemark.cursors WHERE consumer = 'late'`);
  assert.equal(resynced.rows[0].resync_count, 1);

  const boot = await cli(['tail', '--consumer', 'late', '--stream', 's', '--once', '--bootstrap'], { env });
  assert.equal(boot.code, 0, boot.stderr);
  assert.match(boot.stderr, /bootstrapped late on s: cursor 0 -> 2/);
});

test('status names the writer safe_seq waits for, with an age that grows; once it commits, nothing is listed', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const slow = new pg.Client({ connectionString: db.url, application_name: 'slow-batch-import' });
  slow.on('error', () => undefined);
  await slow.connect();
  db.defer(() => slow.end());
  await slow.query('BEGIN');
  await slow.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'slow') RETURNING seq`);
  await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'fast'], { env });
  const step = await cli(['watermark', '--once'], { env });
  assert.match(step.stdout, /^pending: safe_seq 0 \(last seq 2, 1 writer in flight, 1 observation waiting for them\)$/m);

  const status = async () => {
    const r = await cli(['status', '--json'], { env });
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout).blockingWriters as { pid: number; applicationName: string; ageSeconds: number; query: string; pendingSeq: string }[];
  };
  const first = await status();
  assert.equal(first.length, 1);
  assert.equal(first[0]!.pid, (slow as unknown as { processID: number }).processID);
  assert.equal(first[0]!.applicationName, 'slow-batch-import');
  assert.match(first[0]!.query, /^INSERT INTO tidemark\.events/);
  assert.equal(first[0]!.pendingSeq, '2');
  await waitFor('the age to grow', async () => (await status())[0]!.ageSeconds > first[0]!.ageSeconds);
  const text = await cli(['status'], { env });
  assert.match(text.stdout, /^safe_seq waits for 1 writer to finish \(seq 2 pending since /m);
  assert.match(text.stdout, /slow-batch-import/);

  await slow.query('COMMIT');
  await cli(['watermark', '--once'], { env });
  assert.deepEqual(await status(), []);
  assert.doesNotMatch((await cli(['status'], { env })).stdout, /waits for/);
});

test('watermark --once, run again and again while writers overlap without pause, advances every time', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const writers = [0, 1].map(() => new pg.Client({ connectionString: db.url }));
  for (const w of writers) {
    w.on('error', () => undefined);
    await w.connect();
    db.defer(() => w.end());
  }
  const insert = (w: pg.Client) => w.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  let open = writers[0]!;
  await open.query('BEGIN');
  await insert(open);
  assert.match((await cli(['watermark', '--once'], { env })).stdout, /^pending: safe_seq 0 /);
  for (let seq = 2; seq <= 4; seq += 1) {
    // The next writer begins before the open one commits: one is always in flight.
    const next = writers[(seq + 1) % 2]!;
    await next.query('BEGIN');
    await insert(next);
    await open.query('COMMIT');
    open = next;
    // Each one-shot process finds the observation an earlier one stored.
    const r = await cli(['watermark', '--once'], { env });
    assert.match(r.stdout, new RegExp(`^advanced: safe_seq ${seq - 1} \\(last seq ${seq}, 1 writer in flight`, 'm'));
  }
  await open.query('COMMIT');
});
