import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import fc from 'fast-check';
import { Watermarker } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, type Session } from '../support/db.js';

after(closeAdmin);

/** Records (safe_seq, committed seqs <= safe_seq) and checks that no later read adds a seq below an earlier safe_seq. */
class HoleDetector {
  private readonly observations: { safe: bigint; seqs: string }[] = [];
  constructor(private readonly observer: Session) {}

  async observe(): Promise<bigint> {
    const { rows } = await this.observer.query<{ safe: string; seqs: string[] | null }>(
      `SELECT w.safe_seq AS safe, (SELECT array_agg(seq::text ORDER BY seq) FROM tidemark.events WHERE seq <= w.safe_seq) AS seqs
         FROM tidemark.watermark w`,
    );
    const safe = BigInt(rows[0]!.safe);
    const visible = (rows[0]!.seqs ?? []).map(BigInt);
    for (const earlier of this.observations) {
      const now = visible.filter((s) => s <= earlier.safe).join(',');
      assert.equal(now, earlier.seqs, `a seq appeared at or below safe_seq ${earlier.safe} after it was published`);
    }
    this.observations.push({ safe, seqs: visible.join(',') });
    return safe;
  }
}

test('savepoints, rolled-back statements and aborted transactions leave no hole that later fills', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const holes = new HoleDetector(observer);
  const wm = new Watermarker(db.pool());
  const [w1, w2, w3] = [await db.session('w1'), await db.session('w2'), await db.session('w3')];

  await w1.query('BEGIN');
  await w1.query('SAVEPOINT a');
  assert.equal(await insertEvent(w1), 1n);
  await w1.query('ROLLBACK TO SAVEPOINT a'); // seq 1 will never exist
  assert.equal(await insertEvent(w1), 2n); // open at top level
  assert.equal(await insertEvent(w2), 3n); // committed

  await w3.query('BEGIN');
  assert.equal(await insertEvent(w3), 4n);
  // A statement that draws seq 5 and then fails aborts w3.
  await assert.rejects(w3.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', 'x', '[]')`), /check constraint/);
  await w3.query('ROLLBACK');

  assert.equal((await wm.step()).outcome, 'pending'); // w1 still holds the fence
  assert.equal(await holes.observe(), 0n);

  await w1.query('SAVEPOINT b');
  assert.equal(await insertEvent(w1), 6n);
  await w1.query('RELEASE SAVEPOINT b');
  await w1.query('COMMIT');

  assert.equal((await wm.step()).safeSeq, 6n);
  assert.equal(await holes.observe(), 6n);
  assert.equal(await insertEvent(w2), 7n);
  assert.equal((await wm.step()).safeSeq, 7n);
  assert.equal(await holes.observe(), 7n);
  const all = await observer.query('SELECT array_agg(seq::int ORDER BY seq) AS seqs FROM tidemark.events');
  assert.deepEqual(all.rows[0].seqs, [2, 3, 6, 7]);
  await wm.close();
});

type Op = 'insert' | 'insertSelect' | 'savepoint' | 'rollbackTo' | 'release' | 'fail' | 'commit' | 'rollback' | 'step' | 'stepPgLocks';

test('randomized interleavings of writers and steps never publish past an open seq (fast-check)', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const writers: Session[] = [];
  for (let i = 0; i < 4; i++) writers.push(await db.session(`w${i}`));
  // Two watermarkers of one owner (so both hold the lease): one learns the
  // writers in flight by the try-lock when it can, the other always from pg_locks.
  const pool = db.pool();
  const wm = new Watermarker(pool, { owner: 'prop' });
  const wmLocks = new Watermarker(pool, { owner: 'prop', tryLockFirst: false });

  const op = fc.record({
    writer: fc.nat(writers.length - 1),
    op: fc.constantFrom<Op>(
      'insert',
      'insert',
      'insertSelect',
      'savepoint',
      'rollbackTo',
      'release',
      'fail',
      'commit',
      'commit',
      'rollback',
      'step',
      'step',
      'stepPgLocks',
    ),
  });

  await fc.assert(
    fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 80, size: 'max' }), async (ops) => {
      // Every run ends all its writers, so earlier runs' seqs are settled and
      // a fresh detector per run keeps counterexamples meaningful.
      const holes = new HoleDetector(observer);
      await holes.observe();
      const state = writers.map(() => ({ open: false, savepoints: 0, aborted: false }));
      for (const { writer, op } of ops) {
        const w = writers[writer]!;
        const s = state[writer]!;
        if (op === 'step' || op === 'stepPgLocks') {
          await (op === 'step' ? wm : wmLocks).step();
          await holes.observe();
          continue;
        }
        if (s.aborted && op !== 'rollback' && op !== 'commit') continue;
        switch (op) {
          case 'insert':
          case 'insertSelect':
            if (!s.open) {
              await w.query('BEGIN');
              s.open = true;
            }
            if (op === 'insert') await insertEvent(w);
            else await w.query(`INSERT INTO tidemark.events (stream, kind, key) SELECT 's', 'k', 'x' || n FROM generate_series(1, 3) n`);
            break;
          case 'savepoint':
            if (s.open) await w.query(`SAVEPOINT sp${++s.savepoints}`);
            break;
          case 'rollbackTo':
            if (s.savepoints > 0) await w.query(`ROLLBACK TO SAVEPOINT sp${s.savepoints--}`);
            break;
          case 'release':
            if (s.savepoints > 0) await w.query(`RELEASE SAVEPOINT sp${s.savepoints--}`);
            break;
          case 'fail':
            if (s.savepoints > 0 || !s.open) break; // keep the model simple: abort only at top level
            await w.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', 'x', '[]')`).catch(() => undefined);
            s.aborted = true;
            break;
          case 'commit':
          case 'rollback':
            if (s.open) await w.query(op === 'commit' ? 'COMMIT' : 'ROLLBACK');
            Object.assign(s, { open: false, savepoints: 0, aborted: false });
            break;
        }
      }
      // End every transaction; the next step must publish everything committed.
      for (const [i, w] of writers.entries()) if (state[i]!.open) await w.query('ROLLBACK');
      await wm.step();
      const safe = await holes.observe();
      const last = await observer.query<{ last: string | null }>(`SELECT pg_sequence_last_value('tidemark.events_seq_seq')::text AS last`);
      assert.equal(safe, BigInt(last.rows[0]!.last ?? 0), 'after all writers end, one step publishes every number drawn');
    }),
    { numRuns: 60 },
  );
  await wm.close();
  await wmLocks.close();
});
