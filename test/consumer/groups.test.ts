/**
 * StreamClient.tailGroup: members of a consumer's group share a stream by
 * partition (PROTOCOL §6.4). Progress is awaited through the observer and
 * the effects table, never by sleeping.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, test } from 'node:test';
import { createMetrics, CursorContentionError, InvalidOptionsError, Pruner, ResyncRequiredError, StreamClient, Watermarker, type ConsumerEvent } from '../../src/index.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';

after(closeAdmin);

function partitionOf(key: string, partitions: number): number {
  return createHash('md5').update(key, 'utf8').digest().readUInt32BE(0) % partitions;
}

/** Appends `n` events over `keys` keys (key-0 .. key-<keys-1>, round robin) in transactions of 50, and publishes them. */
async function append(db: TestDb, watermarker: Watermarker, n: number, keys: number, from = 0): Promise<void> {
  const writer = await db.session('writer');
  for (let i = from; i < from + n; i += 50) {
    await writer.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 's', 'k', 'key-' || (g % $3), pg_catalog.jsonb_build_object('i', g) FROM generate_series($1::int, $2::int) g ORDER BY g`,
      [i, Math.min(from + n, i + 50) - 1, keys],
    );
  }
  await watermarker.step();
}

async function effects(db: TestDb): Promise<{ seq: bigint; key: string; partition: number; member: string }[]> {
  const r = await db.observer.query<{ seq: string; key: string; partition: number; member: string }>('SELECT seq, key, partition, member FROM effects ORDER BY at');
  return r.rows.map((row) => ({ ...row, seq: BigInt(row.seq) }));
}

test('three members share a stream by partition: every event once, each key in order, the partitions spread; a member that leaves hands its partitions over', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, partition int NOT NULL, member text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  const pool = db.pool({ max: 20 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 600, 40);

  const assignments: Record<string, number[]> = {};
  const members = new Map<string, { client: StreamClient; stop: AbortController; run: Promise<never> }>();
  const start = (name: string) => {
    const client = new StreamClient(pool, {
      batchSize: 7,
      pollIntervalMs: 50,
      observer: (e: ConsumerEvent) => {
        if (e.type === 'group:assignment') assignments[e.member] = e.partitions;
      },
    });
    const stop = new AbortController();
    const run = client.tailGroup(
      'mailer',
      's',
      async (event, tx, context) => {
        assert.equal(context.partition, partitionOf(event.key, 8), 'the context names the event\'s partition');
        await tx.query('INSERT INTO effects (seq, key, partition, member) VALUES ($1, $2, $3, $4)', [event.seq.toString(), event.key, context.partition, name]);
      },
      { partitions: 8, member: name, concurrency: 3, leaseTtlMs: 600, signal: stop.signal },
    );
    run.catch(() => undefined);
    members.set(name, { client, stop, run });
    db.defer(() => client.close());
  };
  start('a');
  start('b');
  start('c');
  // Partition p to member p % 3 by name, once every beat has given up and
  // taken what the split says (a beat gives up before the next one takes).
  const split = JSON.stringify({ a: [0, 3, 6], b: [1, 4, 7], c: [2, 5] });
  await waitFor('the split over three members', async () => JSON.stringify({ a: assignments.a, b: assignments.b, c: assignments.c }) === split);
  // Events for every partition now, each handled by the member holding it: all
  // three have handled events before b leaves (the first 600 may all go to
  // whichever member took the partitions first).
  await append(db, watermarker, 100, 40, 1300);
  await waitFor('each member handled events', async () => new Set((await effects(db)).map((r) => r.member)).size === 3, 60_000);

  // More events while b leaves: its partitions go to a and c.
  await append(db, watermarker, 400, 40, 600);
  const b = members.get('b')!;
  b.stop.abort(new Error('b leaves'));
  await assert.rejects(b.run, { message: 'b leaves' });
  assert.equal((await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'b'`)).rowCount, 0, 'b left the group');
  await append(db, watermarker, 300, 40, 1000);
  await waitFor('every event handled', async () => (await effects(db)).length >= 1400, 60_000);
  assert.deepEqual([...(assignments.a ?? []), ...(assignments.c ?? [])].sort((x, y) => x - y), [0, 1, 2, 3, 4, 5, 6, 7]);

  const rows = await effects(db);
  const seqs = (await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.events ORDER BY seq')).rows.map((r) => BigInt(r.seq));
  assert.deepEqual(rows.map((r) => r.seq).sort((x, y) => (x < y ? -1 : 1)), seqs, 'every event once (effects has a primary key on seq)');
  const last = new Map<string, bigint>();
  for (const row of rows) {
    assert.ok((last.get(row.key) ?? 0n) < row.seq, `key ${row.key} in order`);
    last.set(row.key, row.seq);
  }
  assert.ok(new Set(rows.map((r) => r.member)).size === 3, 'all three members handled events');
  // /metrics: the group's lag, moves and unheld partitions, and each partition's lag.
  const metrics = await createMetrics({ pool, processMetrics: false }).registry.metrics();
  assert.match(metrics, /^tidemark_group_lag_events\{consumer="mailer",stream="s"\} 0$/m);
  assert.match(metrics, /^tidemark_group_partitions_unheld\{consumer="mailer",stream="s"\} 0$/m);
  assert.match(metrics, /^tidemark_group_partition_moves\{consumer="mailer",stream="s"\} (1[1-9]|[2-9]\d)$/m, 'at least one move a partition, and some rebalanced');
  assert.match(metrics, /^tidemark_group_partition_lag_events\{consumer="mailer",stream="s",partition="7"\} 0$/m);
  for (const m of ['a', 'c']) members.get(m)!.stop.abort(new Error('done'));
  await Promise.allSettled([...members.values()].map((m) => m.run));
  const cursors = await db.observer.query<{ partition: number; seq: string }>(`SELECT partition, seq FROM tidemark.partition_cursors WHERE consumer = 'mailer'`);
  for (const c of cursors.rows) {
    const lastOfPartition = rows.filter((r) => r.partition === c.partition).at(-1)?.seq ?? 0n;
    assert.ok(BigInt(c.seq) >= lastOfPartition, `partition ${c.partition}'s cursor past its last event`);
  }
});

test('tailGroup validates its options before touching the database, and a member with another partition count is refused', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 4 });
  const client = new StreamClient(pool, { pollIntervalMs: 50 });
  db.defer(() => client.close());
  const handler = () => undefined;
  for (const [options, name] of [
    [{ partitions: 0 }, 'partitions'],
    [{ partitions: 1025 }, 'partitions'],
    [{ concurrency: 0 }, 'concurrency'],
    [{ leaseTtlMs: 50 }, 'leaseTtlMs'],
    [{ member: '' }, 'member'],
    [{ partition: 3 }, 'partition'],
    [{ partitionIndex: 'yes' }, 'partitionIndex'],
    [{ failures: { maxAttempts: 2, onExhausted: 'dead-letter' }, beforeCommit: () => undefined }, 'failures.onExhausted'],
  ] as const) {
    await assert.rejects(client.tailGroup('g', 's', handler, options as never), (err: unknown) => err instanceof InvalidOptionsError && err.option === name, JSON.stringify(options));
  }
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.groups')).rowCount, 0);

  const stop = new AbortController();
  const first = client.tailGroup('g', 's', handler, { partitions: 4, member: 'a', signal: stop.signal });
  first.catch(() => undefined);
  await waitFor('the group', async () => (await db.observer.query('SELECT 1 FROM tidemark.groups')).rowCount === 1);
  await assert.rejects(client.tailGroup('g', 's', handler, { partitions: 8, member: 'b' }), { code: 'TM007', message: /has 4 partitions, not 8/ });
  stop.abort(new Error('done'));
  await assert.rejects(first, { message: 'done' });
});

test('a member stopped while its beat waits starts nothing afterwards: no partition loop, no handler call', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 6 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 20, 4);
  // A lock gate: the group's beat lock, held by a session of the test.
  const gate = await db.session('gate');
  await gate.query('BEGIN');
  await gate.query(`SELECT pg_catalog.pg_advisory_xact_lock(tidemark.partition_key('g', 's', -1))`);
  let calls = 0;
  const client = new StreamClient(pool, { pollIntervalMs: 50 });
  db.defer(() => client.close());
  const stop = new AbortController();
  const run = client.tailGroup('g', 's', () => void (calls += 1), { partitions: 2, member: 'm', signal: stop.signal });
  run.catch(() => undefined);
  await waitFor('the beat to wait for the gate', async () => {
    const r = await db.observer.query(`SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`);
    return r.rowCount === 1;
  });
  stop.abort(new Error('stopped'));
  await gate.query('COMMIT'); // the beat goes through now, after the stop
  await assert.rejects(run, { message: 'stopped' });
  assert.equal(calls, 0);
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.group_members')).rowCount, 0, 'it left');
});

test('a failing event\'s back-off holds neither a page slot nor a connection: the member\'s other partitions go on meanwhile', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 8 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 40, 8);
  const poison = 'key-0';
  const stuck = partitionOf(poison, 2);
  const handled: string[] = [];
  const retries: ConsumerEvent[] = [];
  const client = new StreamClient(pool, { pollIntervalMs: 50, observer: (e) => void (e.type === 'handler:retry' && retries.push(e)) });
  db.defer(() => client.close());
  const stop = new AbortController();
  const run = client.tailGroup(
    'g',
    's',
    (e) => {
      if (e.key === poison) throw new Error('poison');
      handled.push(e.key);
    },
    // One page at a time, and a back-off far longer than the test.
    { partitions: 2, member: 'm', concurrency: 1, signal: stop.signal, failures: { maxAttempts: 3, backoffMinMs: 600_000, backoffMaxMs: 600_000 } },
  );
  run.catch(() => undefined);
  const others = Array.from({ length: 40 }, (_, i) => `key-${i % 8}`).filter((k) => partitionOf(k, 2) !== stuck);
  await waitFor('the other partition\'s events, during the back-off', async () => handled.filter((k) => partitionOf(k, 2) !== stuck).length === others.length && retries.length === 1);
  assert.deepEqual(retries.map((e) => e.type === 'handler:retry' && [e.attempt, e.partition]), [[2, stuck]]);
  stop.abort(new Error('done'));
  await assert.rejects(run, { message: 'done' });
});

test('an invalid partition index (a build that did not finish) is reported once, and pages go on without it', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 6 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 10, 4);
  await db.observer.query((await db.observer.query<{ ddl: string }>('SELECT tidemark.partition_index_ddl(2) AS ddl')).rows[0]!.ddl);
  await db.observer.query(`UPDATE pg_catalog.pg_index SET indisvalid = false WHERE indexrelid = 'tidemark.events_partition_2'::regclass`);
  const reports: ConsumerEvent[] = [];
  let handled = 0;
  const client = new StreamClient(pool, { pollIntervalMs: 50, observer: (e) => void (e.type === 'group:index' && reports.push(e)) });
  db.defer(() => client.close());
  const stop = new AbortController();
  const run = client.tailGroup('g', 's', () => void (handled += 1), { partitions: 2, member: 'm', signal: stop.signal });
  run.catch(() => undefined);
  await waitFor('every event, and the report', async () => handled === 10 && reports.length === 1);
  assert.match(String((reports[0] as { error: Error }).error.message), /events_partition_2 is invalid/);
  stop.abort(new Error('done'));
  await assert.rejects(run, { message: 'done' });
});

test('partitionIndex: false pages without creating the group\'s index; by default a member creates it', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 8 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 12, 4);
  const index = async (n: number) => (await db.observer.query(`SELECT 1 FROM pg_catalog.pg_index WHERE indexrelid = pg_catalog.to_regclass('tidemark.events_partition_${n}') AND indisvalid`)).rowCount;
  for (const [consumer, partitions, create] of [['without', 3, false], ['with', 2, true]] as const) {
    let handled = 0;
    const client = new StreamClient(pool, { pollIntervalMs: 50 });
    db.defer(() => client.close());
    const stop = new AbortController();
    const run = client.tailGroup(consumer, 's', () => void (handled += 1), { partitions, member: 'm', partitionIndex: create, signal: stop.signal });
    run.catch(() => undefined);
    await waitFor(`${consumer}: every event${create ? ', and the index' : ''}`, async () => handled === 12 && (!create || (await index(partitions)) === 1));
    stop.abort(new Error('done'));
    await assert.rejects(run, { message: 'done' });
    assert.equal(await index(partitions), create ? 1 : 0);
  }
});

test('a member whose connections are all terminated (a restart, as its sessions see it) recovers by itself: every event once, each key in order', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, partition int NOT NULL, member text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  const pool = db.pool({ max: 8, application_name: 'group-member' });
  pool.on('error', () => undefined); // idle clients terminated below
  const watermarker = new Watermarker(db.pool({ max: 2 }), { owner: 'test' });
  db.defer(() => watermarker.close());
  await append(db, watermarker, 200, 20);
  const retries: ConsumerEvent[] = [];
  const client = new StreamClient(pool, { batchSize: 5, pollIntervalMs: 50, retryMinMs: 10, retryMaxMs: 100, observer: (e) => void (e.type === 'retry' && retries.push(e)) });
  db.defer(() => client.close());
  const stop = new AbortController();
  const run = client.tailGroup(
    'g',
    's',
    async (event, tx, context) => {
      await tx.query('INSERT INTO effects (seq, key, partition, member) VALUES ($1, $2, $3, $4)', [event.seq.toString(), event.key, context.partition, 'm']);
    },
    { partitions: 4, member: 'm', leaseTtlMs: 3000, signal: stop.signal },
  );
  run.catch(() => undefined);
  await waitFor('some events handled', async () => (await effects(db)).length >= 20);
  const killed = await db.observer.query(`SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity WHERE application_name = 'group-member' AND datname = current_database()`);
  assert.ok(killed.rowCount! > 0);
  await append(db, watermarker, 100, 20, 200);
  await waitFor('every event handled after the terminations', async () => (await effects(db)).length >= 300, 60_000);
  // Its beat connection too: the next beat finds it dead and retries (the pages may all be done by then).
  await waitFor('the member to see its connections die and retry', async () => retries.length > 0);
  const rows = await effects(db);
  const seqs = (await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.events ORDER BY seq')).rows.map((r) => BigInt(r.seq));
  assert.deepEqual(rows.map((r) => r.seq).sort((x, y) => (x < y ? -1 : 1)), seqs, 'every event once');
  const last = new Map<string, bigint>();
  for (const row of rows) {
    assert.ok((last.get(row.key) ?? 0n) < row.seq, `key ${row.key} in order`);
    last.set(row.key, row.seq);
  }
  stop.abort(new Error('done'));
  await assert.rejects(run, { message: 'done' });
});

test('a member beats again once another member\'s lease ends, not a beat interval later: a dead member\'s partitions move when its lease does', async (t) => {
  const db = await testDb(t);
  // b joins and holds every partition, then dies (it never beats again): its lease ends 3 s on.
  await db.observer.query(`SELECT * FROM tidemark.group_beat('g', 's', 4, 'b', 3000)`);
  const pool = db.pool({ max: 8 });
  const assignments: number[][] = [];
  const client = new StreamClient(pool, { pollIntervalMs: 50, observer: (e) => void (e.type === 'group:assignment' && assignments.push(e.partitions)) });
  db.defer(() => client.close());
  const stop = new AbortController();
  // a's own beats are 20 minutes apart: only b's lease end can bring the next one.
  const run = client.tailGroup('g', 's', () => undefined, { partitions: 4, member: 'a', leaseTtlMs: 3_600_000, signal: stop.signal });
  run.catch(() => undefined);
  await waitFor('a to take b\'s partitions', async () => JSON.stringify(assignments.at(-1)) === '[0,1,2,3]');
  const b = await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'b'`);
  assert.equal(b.rowCount, 0, 'b forgotten');
  stop.abort(new Error('done'));
  await assert.rejects(run, { message: 'done' });
});

test('retention past a stopped group: its member ends with ResyncRequiredError; bootstrapGroup (refused while a member runs) moves every partition cursor to the snapshot with the rebuild, and the members go on from there', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE totals (key text PRIMARY KEY, n int NOT NULL)');
  const pool = db.pool({ max: 10 });
  const watermarker = new Watermarker(pool, { owner: 'test' });
  db.defer(() => watermarker.close());
  const handler = async (event: { key: string }, tx: { query: (sql: string, values: unknown[]) => Promise<unknown> }) => {
    await tx.query('INSERT INTO totals (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = totals.n + 1', [event.key]);
  };
  const member = (client: StreamClient, signal: AbortSignal) => client.tailGroup('g', 's', handler, { partitions: 4, member: 'm', leaseTtlMs: 2000, signal });

  // The group exists with its cursors at 0; retention then removes what it never read.
  const client = new StreamClient(pool, { pollIntervalMs: 50 });
  db.defer(() => client.close());
  const first = new AbortController();
  const running = member(client, first.signal);
  running.catch(() => undefined);
  await waitFor('the group', async () => (await db.observer.query('SELECT 1 FROM tidemark.partition_cursors')).rowCount === 4);
  first.abort(new Error('stopped'));
  await assert.rejects(running, { message: 'stopped' });
  await append(db, watermarker, 40, 8);
  await new Pruner(pool, { retentionMs: 0, allowShortRetention: true }).prune();
  await assert.rejects(member(client, new AbortController().signal), (err: unknown) => err instanceof ResyncRequiredError);

  // Refused while a member's lease is live.
  const beat = await db.session('beat');
  await beat.query(`SELECT * FROM tidemark.group_beat('g', 's', 4, 'other', 60000)`);
  await assert.rejects(client.bootstrapGroup('g', 's', { partitions: 4 }), (err: unknown) => err instanceof CursorContentionError && /member 'other'/.test(String((err.cause as Error).message)));
  await beat.query(`SELECT tidemark.leave_group('g', 's', 'other')`);
  await assert.rejects(client.bootstrapGroup('g', 's', { partitions: 8 }), /has 4 partitions, not 8/);

  // The rebuild: totals from the events of the snapshot (what retention
  // kept is nothing here, so the application's own data: none), committed
  // with every cursor at the snapshot's point.
  const snap = await client.bootstrapGroup('g', 's', { partitions: 4 });
  assert.equal(snap.priorSeq, 0n);
  await snap.tx.query('DELETE FROM totals');
  await snap.commit();
  const cursors = await db.observer.query<{ seq: string; holder: string | null }>('SELECT seq, holder FROM tidemark.partition_cursors ORDER BY partition');
  assert.deepEqual(cursors.rows, Array.from({ length: 4 }, () => ({ seq: snap.safeSeq.toString(), holder: null })));

  // The members go on from there: only what comes after.
  await append(db, watermarker, 16, 8, 40);
  const second = new AbortController();
  const again = member(client, second.signal);
  again.catch(() => undefined);
  await waitFor('the new events', async () => (await db.observer.query<{ n: number }>('SELECT coalesce(sum(n), 0)::int AS n FROM totals')).rows[0]!.n === 16);
  second.abort(new Error('done'));
  await assert.rejects(again, { message: 'done' });
});
