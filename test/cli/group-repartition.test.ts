/**
 * `tidemark group repartition` under running members (PROTOCOL §6.6): two
 * tailGroup members started with 4 partitions go on through a switch to 8
 * while events are appended before, during and after it; every event is
 * applied once, each key in order, the old split up to the barrier and the
 * new one above it. Progress is awaited through the effects table and the
 * observer, never by sleeping.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { StreamClient, Watermarker, type ConsumerEvent } from '../../src/index.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { partitionOf } from '../support/groups.js';
import { cli, exited, startCli } from '../support/cli.js';

after(closeAdmin);

/** Appends `n` events over 30 keys, in transactions of 25, and publishes them. */
async function append(db: TestDb, watermarker: Watermarker, from: number, n: number): Promise<void> {
  const writer = await db.session('writer');
  for (let i = from; i < from + n; i += 25) {
    await writer.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 's', 'k', 'key-' || (g % 30), pg_catalog.jsonb_build_object('i', g) FROM generate_series($1::int, $2::int) g ORDER BY g`,
      [i, Math.min(from + n, i + 25) - 1],
    );
    await watermarker.step();
  }
}

test('group repartition switches running members from 4 to 8 partitions at a barrier: every event once, each key in order; a member started later with the old count is refused', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  await db.observer.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, partition int NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  const pool = db.pool({ max: 20 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());

  const assignments: Record<string, number[]> = {};
  const start = (name: string, partitions: number) => {
    const client = new StreamClient(pool, {
      batchSize: 5,
      pollIntervalMs: 50,
      observer: (e: ConsumerEvent) => {
        if (e.type === 'group:assignment') assignments[e.member] = e.partitions;
      },
    });
    db.defer(() => client.close());
    const stop = new AbortController();
    db.defer(() => stop.abort(new Error('test over')));
    const run = client.tailGroup(
      'mailer',
      's',
      async (event, tx, context) => {
        await tx.query('INSERT INTO effects (seq, key, partition) VALUES ($1, $2, $3)', [event.seq.toString(), event.key, context.partition]);
      },
      { partitions, member: name, concurrency: 4, leaseTtlMs: 3000, signal: stop.signal },
    );
    run.catch(() => undefined);
    return run;
  };
  start('a', 4);
  start('b', 4);
  await waitFor('the split over two members', async () => JSON.stringify([assignments.a, assignments.b]) === JSON.stringify([[0, 2], [1, 3]]));
  await append(db, watermarker, 0, 300);
  await waitFor('some events applied', async () => (await db.observer.query('SELECT 1 FROM effects')).rowCount! > 0);

  // The re-partition waits for the old split to drain to the barrier while
  // more events come.
  const repartition = startCli(['group', 'repartition', '--consumer', 'mailer', '--stream', 's', '--partitions', '8'], { env });
  let out = '';
  repartition.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  await append(db, watermarker, 300, 300);
  assert.equal(await exited(repartition), 0);
  const switched = /^switched: the group of consumer "mailer" on stream "s" has 8 partitions \(was 4\) from seq (\d+)$/m.exec(out);
  assert.ok(switched, out);
  const barrier = BigInt(switched[1]!);
  assert.match(out, /^created index events_partition_8$/m);
  assert.match(out, /^dropped index events_partition_4 \(no group has 4 partitions now\)$/m);
  await append(db, watermarker, 600, 300);

  await waitFor('every event applied', async () => (await db.observer.query('SELECT 1 FROM effects')).rowCount === 900, 60_000);
  await waitFor('the split of 8 over two members', async () => JSON.stringify([assignments.a, assignments.b]) === JSON.stringify([[0, 2, 4, 6], [1, 3, 5, 7]]));
  const rows = (await db.observer.query<{ seq: string; key: string; partition: number }>('SELECT seq, key, partition FROM effects ORDER BY at')).rows;
  assert.deepEqual(rows.map((r) => Number(r.seq)).sort((x, y) => x - y), Array.from({ length: 900 }, (_, i) => i + 1), 'every event once');
  const last = new Map<string, bigint>();
  for (const r of rows) {
    const seq = BigInt(r.seq);
    assert.ok((last.get(r.key) ?? 0n) < seq, `key ${r.key}: ${seq} after ${last.get(r.key)}`);
    last.set(r.key, seq);
    assert.equal(r.partition, partitionOf(r.key, seq <= barrier ? 4 : 8), `seq ${seq} applied in its partition of the split of its side of the barrier`);
  }
  assert.ok(barrier >= 300n && barrier < 900n, `the barrier ${barrier} was the safe_seq of the moment`);

  // A member started now with the old count is refused, and told why.
  await assert.rejects(start('c', 4), (err: Error & { code?: string }) => err.code === 'TM007' && new RegExp(`has 8 partitions, not 4 \\(re-partitioned at seq ${barrier}\\)`).test(err.message));
  const refused = await cli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '4'], { env });
  assert.equal(refused.code, 2, refused.stderr);
  assert.match(refused.stderr, /has 8 partitions, not 4 \(re-partitioned at seq \d+\)/);
  assert.equal(refused.stderr.trim().split('\n').length, 1, 'one line');

  // Asked again with the count it has: nothing to do.
  const again = await cli(['group', 'repartition', '--consumer', 'mailer', '--stream', 's', '--partitions', '8', '--json'], { env });
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(
    (({ partitions, nextPartitions, sinceSeq, cancelled }) => ({ partitions, nextPartitions, sinceSeq, cancelled }))(JSON.parse(again.stdout) as Record<string, unknown>),
    { partitions: 8, nextPartitions: null, sinceSeq: barrier.toString(), cancelled: false },
  );
});

test('group repartition refuses what it cannot do with one line and changes nothing: no such group, a bad count, --no-wait then a cancel', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const none = await cli(['group', 'repartition', '--consumer', 'nobody', '--stream', 's', '--partitions', '8'], { env });
  assert.equal(none.code, 2);
  assert.match(none.stderr, /^tidemark: "nobody" on stream "s" is not a group: its first member creates it/);
  for (const bad of ['0', '1025', 'x']) {
    const r = await cli(['group', 'repartition', '--consumer', 'g', '--stream', 's', '--partitions', bad], { env });
    assert.equal(r.code, 2, bad);
    assert.match(r.stderr, /^tidemark: --partitions: /);
    assert.equal(r.stderr.trim().split('\n').length, 1);
  }
  await db.observer.query(`SELECT * FROM tidemark.group_beat('g', 's', 4, 'm', 60000)`);
  const pending = await cli(['group', 'repartition', '--consumer', 'g', '--stream', 's', '--partitions', '2', '--no-wait', '--no-partition-index'], { env });
  assert.equal(pending.code, 0, pending.stderr);
  assert.match(pending.stdout, /^pending: the group of consumer "g" on stream "s" goes from 4 to 2 partitions at seq 0; its pages read up to there\. Run this command again \(without --no-wait\) to switch\.$/m);
  const status = await cli(['status'], { env });
  assert.match(status.stdout, /^re-partition pending: g on s, 4 -> 2 partitions at seq 0; the pages read up to there until `tidemark group repartition --consumer g --stream s --partitions 2` switches$/m);
  const json = JSON.parse((await cli(['status', '--json'], { env })).stdout) as { repartitions: unknown };
  assert.deepEqual(json.repartitions, [{ consumer: 'g', stream: 's', partitions: 4, nextPartitions: 2, barrier: '0' }]);
  const cancelled = await cli(['group', 'repartition', '--consumer', 'g', '--stream', 's', '--partitions', '4'], { env });
  assert.equal(cancelled.code, 0, cancelled.stderr);
  assert.match(cancelled.stdout, /^cancelled: the group of consumer "g" on stream "s" keeps its 4 partitions$/m);
  assert.deepEqual((await db.observer.query('SELECT partitions, next_partitions, barrier FROM tidemark.groups')).rows, [{ partitions: 4, next_partitions: null, barrier: null }]);
});
