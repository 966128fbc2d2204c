/**
 * Re-partitioning a consumer group at a barrier seq (migration 0017,
 * docs/PROTOCOL.md section 6.6), scripted step by step on named sessions:
 * the old split drains up to the barrier and reads nothing above it, the
 * switch waits for that and for open pages, and the new split starts at
 * the barrier, so that every event is applied once and each key in order.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { closeAdmin, failsWith, testDb, testRole, waitUntilWaiting, type TestDb } from '../support/db.js';
import { assertExactlyOnceInOrder, beat, createEffects, drainAll, finish, page, partitionOf, publish, repartition, RR } from '../support/groups.js';

after(closeAdmin);

async function cursors(db: TestDb): Promise<{ partition: number; seq: bigint; holder: string | null }[]> {
  const r = await db.observer.query<{ partition: number; seq: string; holder: string | null }>('SELECT partition, seq, holder FROM tidemark.partition_cursors ORDER BY partition');
  return r.rows.map((row) => ({ partition: row.partition, seq: BigInt(row.seq), holder: row.holder }));
}

const keysOf = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => `${prefix}-${i % 25}`);

test('a re-partition: the old split reads nothing above the barrier, the switch waits until it drained there, and the new split starts at the barrier: every event once, each key in order', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  const first = await publish(db, keysOf('k', 60));
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  // Two of the four partitions are applied before the re-partition.
  await page(a, 'a', 0);
  await page(a, 'a', 1);

  const asked = await repartition(owner, 8);
  const barrier = first.at(-1)!;
  assert.deepEqual({ ...asked, barrier: BigInt(asked.barrier!) }, { partitions: 4, next_partitions: 8, barrier, since_seq: '0', behind: null }, 'the barrier is safe_seq now');
  const second = await publish(db, keysOf('k', 60));

  const waiting = await finish(owner);
  assert.equal(waiting.next_partitions, 8, 'not switched');
  assert.equal(waiting.behind, [2, 3].filter((p) => first.some((_, i) => partitionOf(keysOf('k', 60)[i]!, 4) === p)).length, 'partitions 2 and 3 still have events up to the barrier');
  assert.equal((await db.observer.query('SELECT partitions FROM tidemark.groups')).rows[0]!.partitions, 4);

  // The old split's pages read up to the barrier, no further, while
  // partition_page_info shows the published safe_seq (a member waits to
  // pass that, not the barrier).
  for (const p of [2, 3]) {
    await a.query(RR);
    const read = await a.query<{ seq: string }>(`SELECT seq FROM tidemark.read_partition_page('g', 's', $1, 'a', 1000)`, [p]);
    assert.ok(read.rows.length > 0 && read.rows.every((r) => BigInt(r.seq) <= barrier), `partition ${p}: only events up to the barrier`);
    const info = (await a.query<{ through: string; safe_seq: string }>(`SELECT through, safe_seq FROM tidemark.partition_page_info('g', 's', $1)`, [p])).rows[0]!;
    assert.equal(BigInt(info.through), barrier);
    assert.equal(BigInt(info.safe_seq), second.at(-1)!);
    await a.query('ROLLBACK');
    await page(a, 'a', p);
  }
  assert.deepEqual(await drainAll(a, 'a', 4), [], 'drained: nothing above the barrier is read by the old split');

  const switched = await finish(owner);
  assert.deepEqual(switched, { partitions: 8, next_partitions: null, barrier: null, since_seq: barrier.toString(), behind: 0 });
  assert.deepEqual(
    await cursors(db),
    Array.from({ length: 8 }, (_, p) => ({ partition: p, seq: barrier, holder: p < 4 ? 'a' : null })),
    'every cursor at the barrier; a partition number keeps its live holder; new ones are free',
  );
  // a was started with 4: as a live member it follows the group.
  assert.deepEqual(await beat(a, 'a', 4), [0, 1, 2, 3, 4, 5, 6, 7]);
  const after8 = await drainAll(a, 'a', 8);
  assert.deepEqual([...after8].sort((x, y) => (x < y ? -1 : 1)), second, 'the new split delivers the events above the barrier');
  const rows = await db.observer.query<{ seq: string; key: string }>('SELECT e.seq, e.key FROM effects f JOIN tidemark.events e USING (seq) WHERE e.seq > $1', [barrier]);
  assert.equal(rows.rowCount, second.length);
  await assertExactlyOnceInOrder(db, [...first, ...second]);

  // A new member must join with the group's count now, and is told so.
  const b = await db.session('b');
  const refused = await b.query(`SELECT * FROM tidemark.group_beat('g', 's', 4, 'b', 60000)`).then(
    () => assert.fail('joined with the old count'),
    (err: Error & { code?: string }) => err,
  );
  assert.equal(refused.code, 'TM007');
  assert.match(refused.message, new RegExp(`has 8 partitions, not 4 \\(re-partitioned at seq ${barrier}\\)`));
  assert.deepEqual(await beat(b, 'b', 8), []);
});

test('a page that began before the barrier was recorded may read past it: the switch raises the barrier to its cursor and waits for the other partitions to drain there', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  const keys = keysOf('x', 60);
  const first = await publish(db, keys);
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);

  // The owner records the barrier (safe_seq: the first batch), but has not
  // committed when more events are published and a page of partition 0
  // begins: its snapshot has the newer safe_seq and no barrier.
  await owner.query('BEGIN');
  const asked = await repartition(owner, 2);
  assert.equal(BigInt(asked.barrier!), first.at(-1)!);
  const second = await publish(db, keys);
  const crossed = await page(a, 'a', 0);
  assert.ok(crossed.some((s) => s > first.at(-1)!), 'the page read past the barrier it did not see');
  await owner.query('COMMIT');

  const raised = await finish(owner);
  assert.equal(BigInt(raised.barrier!), second.at(-1)!, 'the barrier is raised to partition 0\'s cursor');
  assert.equal(raised.behind, 3, 'partitions 1-3 must drain up to the raised barrier');
  const drained = await drainAll(a, 'a', 4);
  assert.ok(drained.some((s) => s > first.at(-1)!), 'they read up to the raised barrier');
  const switched = await finish(owner);
  assert.equal(switched.partitions, 2);
  assert.equal(BigInt(switched.since_seq), second.at(-1)!);
  assert.deepEqual((await cursors(db)).map((c) => c.partition), [0, 1], 'partitions beyond the new count are gone');

  const third = await publish(db, keys);
  assert.deepEqual(await beat(a, 'a', 4), [0, 1]);
  await drainAll(a, 'a', 2);
  await assertExactlyOnceInOrder(db, [...first, ...second, ...third]);
});

test('the switch waits for a page open on the group, and beats go on meanwhile: none of them waits for the switch', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const beats = await db.session('beats');
  const owner = await db.session('owner');
  await createEffects(a);
  // Every event in partition 0 of 4.
  const keys = Array.from({ length: 200 }, (_, i) => `p-${i}`).filter((k) => partitionOf(k, 4) === 0).slice(0, 10);
  const seqs = await publish(db, keys);
  assert.deepEqual(await beat(beats, 'a'), [0, 1, 2, 3]);
  assert.deepEqual((await repartition(owner, 8)).next_partitions, 8);

  // a's page of partition 0 is open, its events applied, not committed.
  await a.query(RR);
  const read = await a.query<{ seq: string; key: string }>(`SELECT seq, key FROM tidemark.read_partition_page('g', 's', 0, 'a', 100)`);
  assert.equal(read.rowCount, seqs.length);
  await a.query('INSERT INTO effects (seq, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [read.rows.map((x) => x.seq), read.rows.map((x) => x.key)]);

  const switching = finish(owner);
  await waitUntilWaiting(db.observer, owner.pid, 'the switch to wait for the open page');
  // A beat neither waits for the switch nor moves a row it holds.
  assert.deepEqual(await beat(beats, 'a'), [0, 1, 2, 3]);
  assert.deepEqual(await beat(beats, 'b'), [], 'b targets 1 and 3; a holds them');
  await a.query(`SELECT tidemark.advance_partition('g', 's', 0, 'a', $1)`, [seqs.at(-1)]);
  await a.query('COMMIT');
  const switched = await switching;
  assert.equal(switched.partitions, 8, 'the switch saw the page\'s commit: nothing left to drain');
  assert.equal(BigInt(switched.since_seq), seqs.at(-1)!);
  await assertExactlyOnceInOrder(db, seqs);
});

test('a page whose snapshot is older than the switch cannot run on the new split: serialization failure, nothing applied', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  await publish(db, keysOf('y', 20));
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  await drainAll(a, 'a', 4);
  await repartition(owner, 8);
  // The page's snapshot is taken before the switch commits.
  await a.query(RR);
  await a.query('SELECT 1 FROM tidemark.groups');
  assert.equal((await finish(owner)).partitions, 8);
  assert.equal(await failsWith(a.query(`SELECT * FROM tidemark.read_partition_page('g', 's', 1, 'a', 100)`)), '40001');
  await a.query('ROLLBACK');
  assert.deepEqual(await page(a, 'a', 1), [], 'the next page runs on the new split');
});

test('the group\'s dead letters move to their key\'s partition of the new split, at or below its cursor', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  const keys = keysOf('d', 30);
  const seqs = await publish(db, keys);
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  // The first event of partition 2 set aside as a dead letter.
  const i = keys.findIndex((k) => partitionOf(k, 4) === 2);
  await a.query(RR);
  await a.query(`SELECT seq FROM tidemark.read_partition_page('g', 's', 2, 'a', 1)`);
  await a.query(`SELECT tidemark.record_partition_dead_letter('g', 's', 2, 'a', $1, 3, 'boom')`, [seqs[i]]);
  await a.query('COMMIT');
  await drainAll(a, 'a', 4);
  await repartition(owner, 8);
  assert.equal((await finish(owner)).partitions, 8);
  const dead = await db.observer.query<{ partition: number; seq: string }>('SELECT partition, seq FROM tidemark.dead_letters');
  assert.deepEqual(dead.rows, [{ partition: partitionOf(keys[i]!, 8), seq: seqs[i]!.toString() }]);
});

test('refused with a clear error and nothing changed: not a group, a bad count, a member role, finish in REPEATABLE READ; the current count cancels a pending re-partition', async (t) => {
  const db = await testDb(t);
  const owner = await db.session('owner');
  const a = await db.session('a');
  await createEffects(a);
  const first = await publish(db, keysOf('r', 20));
  assert.equal(await failsWith(repartition(owner, 8)), 'TM007', 'no group yet');
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  assert.equal(await failsWith(repartition(owner, 0)), '22023');
  assert.equal(await failsWith(repartition(owner, 1025)), '22023');
  await owner.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  assert.equal(await failsWith(finish(owner)), 'TM003');
  await owner.query('ROLLBACK');

  const role = testRole(t, 'member');
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['g'])`, [role]);
  const member = await db.session('member');
  await member.query(`SET ROLE ${role}`);
  assert.equal(await failsWith(repartition(member, 8)), '42501', 'a member role may not re-partition');
  assert.equal(await failsWith(finish(member)), '42501');

  // Pending, then cancelled with the current count: the old split reads on past the barrier.
  await repartition(owner, 8);
  const second = await publish(db, keysOf('r', 20));
  assert.deepEqual(await repartition(owner, 4), { partitions: 4, next_partitions: null, barrier: null, since_seq: '0', behind: null });
  await drainAll(a, 'a', 4);
  await assertExactlyOnceInOrder(db, [...first, ...second]);
  assert.equal((await db.observer.query('SELECT partitions FROM tidemark.groups')).rows[0]!.partitions, 4);
});
