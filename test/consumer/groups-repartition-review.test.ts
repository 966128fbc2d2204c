/**
 * The first adversarial review of re-partitioning (docs/PROTOCOL.md
 * section 10, "Re-partitioning"): its reproductions, kept as tests. Each
 * failed on 9e7e44c: a switch beside an open page (a request committed
 * while finish_repartition waited, which had locked no row), a switch past
 * events retention removed under a partition's cursor, and a page bound
 * below its own cursor.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Pruner } from '../../src/index.js';
import { closeAdmin, failsWith, testDb, waitFor, waitUntilWaiting, type TestDb } from '../support/db.js';
import { assertExactlyOnceInOrder, beat, createEffects, drainAll, finish, page, partitionOf, publish, repartition, RR } from '../support/groups.js';

after(closeAdmin);

/**
 * The suggested fix of finish_repartition (attacks 1 and 2), applied to the
 * test's database when TIDEMARK_REVIEW_PATCH=1, to check that the
 * reproductions pass with it. Built from 0017's own text:
 * (a) once the group's advisory lock is held and a re-partition is seen
 *     pending, every current partition row must be locked by this
 *     transaction (SKIP LOCKED: one a page holds is counted missing); if
 *     not, return unswitched (behind NULL) and let the caller poll again;
 * (b) refuse (TM002) while an old partition's cursor is below the stream's
 *     retention horizon, as every page of that partition does.
 */
const count = async (db: TestDb): Promise<number> => (await db.observer.query<{ partitions: number }>('SELECT partitions FROM tidemark.groups')).rows[0]!.partitions;

/** `n` distinct keys of partition `p` among `of`. */
function keysIn(p: number, of: number, n: number, prefix = 'k'): string[] {
  const keys: string[] = [];
  for (let i = 0; keys.length < n; i += 1) if (partitionOf(`${prefix}-${i}`, of) === p) keys.push(`${prefix}-${i}`);
  return keys;
}

/** Every event applied once (effects.seq is a primary key), and each key's events in seq order. */
// ---------------------------------------------------------------------------
// 1. finish_repartition decides whether to lock the partition rows from a
//    read taken BEFORE it waits for the group's advisory lock. A call that
//    saw nothing pending there, then found a re-partition pending once it
//    had the advisory lock, switches without holding the rows: beside an
//    open page. Its UPDATE of the cursors then waits for that page's row
//    and, in READ COMMITTED, overwrites the page's committed cursor with
//    the (lower) barrier: the new split applies the page's events again.
// ---------------------------------------------------------------------------
test('finish_repartition that saw nothing pending before the advisory lock does not switch beside an open page (cursor moved back, events applied twice)', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const asker = await db.session('asker');
  const finisher = await db.session('finisher');
  await createEffects(a);
  const keys = keysIn(0, 4, 5, 'z');
  const first = await publish(db, keys);
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  assert.deepEqual(await drainAll(a, 'a', 4), first, 'the old split is drained up to the first batch');

  // The owner asks for 8 in a transaction (the group's advisory lock held,
  // nothing committed yet)...
  await asker.query('BEGIN');
  const asked = await repartition(asker, 8);
  const barrier = BigInt(asked.barrier!);
  assert.equal(barrier, first.at(-1)!);
  // ...while a finish_repartition poll (another operator, a retrying
  // repartitionGroup, a cancelled one's poll) reads nothing pending, skips
  // the row locks, and waits for the advisory lock.
  let settled = false;
  const finishing = finish(finisher).finally(() => (settled = true));
  finishing.catch(() => undefined);
  await waitUntilWaiting(db.observer, finisher.pid, 'finish to wait for the group\'s advisory lock');

  // More events of partition 0 are published; a page begins that sees the
  // newer safe_seq and no barrier (uncommitted), and reads them.
  const second = await publish(db, keys);
  await a.query(RR);
  const read = await a.query<{ seq: string; key: string }>(`SELECT seq, key FROM tidemark.read_partition_page('g', 's', 0, 'a', 100)`);
  assert.deepEqual(read.rows.map((r) => BigInt(r.seq)), second);
  await a.query('INSERT INTO effects (seq, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [read.rows.map((x) => x.seq), read.rows.map((x) => x.key)]);

  // The barrier commits: the finisher gets the advisory lock, reads the
  // pending re-partition, finds nothing behind (the page's cursor is not
  // committed); it must not switch beside the page (it did at 9e7e44c).
  await asker.query('COMMIT');
  await waitFor('the finisher to return or to wait for the open page\'s row', async () => {
    if (settled) return true;
    const r = await db.observer.query(`SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype IN ('transactionid', 'tuple')`, [finisher.pid]);
    return r.rowCount! > 0;
  });
  await a.query(`SELECT tidemark.advance_partition('g', 's', 0, 'a', $1)`, [second.at(-1)]);
  await a.query('COMMIT');
  await finishing.catch(() => undefined);

  // Whatever finish did, finish the re-partition and drain the new split.
  // (finish first: a partition whose cursor crossed the barrier has a
  // `through` below its cursor until finish raises the barrier; see the
  // report.)
  for (let i = 0; i < 10 && (await count(db)) !== 8; i += 1) {
    await finish(finisher);
    if ((await count(db)) !== 8) await drainAll(a, 'a', 4);
  }
  assert.equal(await count(db), 8);
  const c0 = (await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.partition_cursors WHERE partition = 0')).rows[0]!.seq;
  assert.ok(BigInt(c0) >= second.at(-1)!, `the new split must start at or above the page's committed cursor ${second.at(-1)}, not at ${c0}`);
  assert.deepEqual(await beat(a, 'a', 8), [0, 1, 2, 3, 4, 5, 6, 7]);
  await drainAll(a, 'a', 8);
  await assertExactlyOnceInOrder(db, [...first, ...second]);
});

// ---------------------------------------------------------------------------
// 2. Retention. A partition of the old split whose cursor is below the
//    stream's horizon is told to resync (TM002) by every page. The switch
//    counts it as drained when retention removed all its events up to the
//    barrier (the probe finds none), moves its cursor to the barrier, which
//    is above the horizon: the events lost to retention are skipped
//    silently, and no page ever says so.
// ---------------------------------------------------------------------------
test('the switch does not silently skip the events retention removed from under an old partition\'s cursor (TM002 stays loud)', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  // Partition 2's events: never applied (its member was down, say); the
  // other partitions' events of the same batch are.
  const lost = keysIn(2, 4, 5, 'lost');
  const batch = await publish(db, [...lost, ...keysIn(0, 4, 2, 'a'), ...keysIn(1, 4, 2, 'b'), ...keysIn(3, 4, 2, 'c')]);
  for (const p of [0, 1, 3]) await page(a, 'a', p);
  // Retention prunes the batch: the horizon passes partition 2's cursor.
  const pool = db.pool({ max: 1 });
  await new Pruner(pool, { retentionMs: 0, allowShortRetention: true }).prune();
  const horizon = BigInt((await db.observer.query<{ p: string }>(`SELECT pruned_through_seq AS p FROM tidemark.horizons WHERE stream = 's'`)).rows[0]!.p);
  assert.equal(horizon, batch.at(-1)!);
  assert.equal(await failsWith(page(a, 'a', 2)), 'TM002', 'before the re-partition, partition 2 is told to resync');
  // Partition 0 goes on.
  await publish(db, keysIn(0, 4, 3, 'live'));
  await page(a, 'a', 0);

  await repartition(owner, 8);
  const state = await finish(owner).catch((err: Error & { code?: string }) => err);
  // Whatever the fix (finish refuses, or does not switch), the loss must
  // still be reported to the partition that owns the lost keys now.
  const n = await count(db);
  const codes = new Set<string>();
  for (const key of lost) {
    const p = partitionOf(key, n);
    await beat(a, 'a', n);
    codes.add(await failsWith(page(a, 'a', p)).catch(() => 'read without error'));
  }
  assert.deepEqual([...codes], ['TM002'], `after finish (${state instanceof Error ? state.message : JSON.stringify(state)}), the lost keys' partitions must still be told to resync`);
});

// 3. A short page of a partition that crossed the barrier (before finish
//    raises it) is bounded at its cursor, not below it.
test('a short page of a partition that crossed the barrier can be advanced to its `through`', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const owner = await db.session('owner');
  await createEffects(a);
  const keys = keysIn(0, 4, 4, 'c');
  await publish(db, keys);
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  await owner.query('BEGIN');
  await repartition(owner, 2);
  await publish(db, keys);
  assert.equal((await page(a, 'a', 0)).length, 8, 'read past the barrier it did not see');
  await owner.query('COMMIT');
  // Before any finish_repartition call:
  await a.query(RR);
  await a.query(`SELECT * FROM tidemark.read_partition_page('g', 's', 0, 'a', 100)`);
  const info = (await a.query<{ cursor: string; through: string }>(`SELECT cursor, through FROM tidemark.partition_page_info('g', 's', 0)`)).rows[0]!;
  await a.query('ROLLBACK');
  assert.ok(BigInt(info.through) >= BigInt(info.cursor), `through ${info.through} is below the cursor ${info.cursor}`);
});
