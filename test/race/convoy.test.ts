import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker, type WatermarkProgress } from '../../src/index.js';
import {
  closeAdmin,
  fenceLocks,
  insertEvent,
  lastAllocatedSeq,
  safeSeq,
  testDb,
  waitFor,
  waitForBlockedStatement,
  waitForExclusiveWaiter,
  waitUntilWaiting,
  type Session,
  type TestDb,
} from '../support/db.js';

after(closeAdmin);

/** Holds a row lock on the watermarker's heartbeat row, so its post-commit heartbeat waits. */
async function gateHeartbeat(db: TestDb, owner: string): Promise<Session> {
  const gate = await db.session('heartbeat-gate');
  await gate.query('BEGIN');
  const r = await gate.query(`SELECT 1 FROM tidemark.heartbeats WHERE operation = 'watermarker' AND owner = $1 FOR UPDATE`, [owner]);
  assert.equal(r.rowCount, 1, 'the heartbeat row exists');
  return gate;
}

function watermarker(db: TestDb, observed: WatermarkProgress[], errors: unknown[] = []): Watermarker {
  return new Watermarker(db.pool(), {
    owner: 'wm',
    fenceTryLimit: 0, // always queue for the exclusive side, as in the reference design
    lockTimeoutMs: 60_000,
    heartbeatIntervalMs: 0, // beat after every step
    heartbeatTimeoutMs: 60_000,
    observer: (p) => observed.push(p),
    onError: (err) => errors.push(err),
  });
}

test('convoy: a late lower seq held open while a higher one commits during the heartbeat stays unpublished until the next step', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const observed: WatermarkProgress[] = [];
  const wm = watermarker(db, observed);
  await wm.step(); // take the lease and write the heartbeat row

  // 1. A leading writer holds the shared fence with seq 1; seq 2 commits
  //    beside it, so the step has something to publish and must queue.
  const w1 = await db.session('w1');
  await w1.query('BEGIN');
  assert.equal(await insertEvent(w1), 1n);
  assert.equal(await insertEvent(await db.session('w0')), 2n);

  // 2. The heartbeat row is locked, so the step will stall after its commit.
  const gate = await gateHeartbeat(db, 'wm');

  // 3. The watermarker queues for the exclusive side behind w1.
  const stepping = wm.step();
  await waitForExclusiveWaiter(observer);

  // 4. A second writer queues behind the watermarker, with no seq yet.
  const w2 = await db.session('w2');
  await w2.query('BEGIN');
  const w2Insert = insertEvent(w2);
  await waitUntilWaiting(observer, w2.pid, 'w2 to queue behind the exclusive request');
  assert.equal(await lastAllocatedSeq(observer), 2n);

  // 5. w1 commits: the watermarker takes the fence, publishes 2 and commits;
  //    then w2 draws seq 3 and keeps its transaction open (the late lower seq).
  await w1.query('COMMIT');
  assert.equal(await w2Insert, 3n);

  // 6. The step is now stuck in its post-commit heartbeat, holding no fence.
  await waitForBlockedStatement(observer, '.beat(');
  assert.deepEqual((await fenceLocks(observer)).filter((l) => l.mode === 'ExclusiveLock'), []);
  assert.equal(await safeSeq(observer), 2n);
  assert.equal(observed.at(-1)?.safeSeq, 2n, 'progress was observed after commit, before the heartbeat');

  // 7. A higher writer commits seq 4 meanwhile: nothing blocks it.
  const w3 = await db.session('w3');
  assert.equal(await insertEvent(w3), 4n);
  assert.equal(await safeSeq(observer), 2n, 'safe_seq stays below the open seq 3');

  // 8. Release the heartbeat: the step returns what it published, nothing more.
  await gate.query('COMMIT');
  const progress = await stepping;
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 2n);
  assert.equal(progress.heartbeat, 'written');
  assert.equal(await safeSeq(observer), 2n);

  // 9. Once seq 3 commits, the next step publishes through 4.
  await w2.query('COMMIT');
  const next = await wm.step();
  assert.equal(next.outcome, 'advanced');
  assert.equal(next.safeSeq, 4n);
  assert.equal(await safeSeq(observer), 4n);
  await wm.close();
});

test('a heartbeat failure after commit still returns and observes the committed progress, with the fence released', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const observed: WatermarkProgress[] = [];
  const errors: unknown[] = [];
  const wm = watermarker(db, observed, errors);
  await wm.step();
  await insertEvent(await db.session('writer'));

  const gate = await gateHeartbeat(db, 'wm');
  const stepping = wm.step();
  const beatPid = await waitForBlockedStatement(observer, '.beat(');
  // The heartbeat fails (its statement is cancelled on the server).
  await observer.query('SELECT pg_cancel_backend($1)', [beatPid]);
  const progress = await stepping;

  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, 1n);
  assert.equal(progress.heartbeat, 'failed');
  assert.equal(observed.at(-1)?.outcome, 'advanced');
  assert.equal(observed.at(-1)?.safeSeq, 1n);
  assert.equal((errors.at(-1) as { code?: string }).code, '57014');
  assert.equal(await safeSeq(observer), 1n);
  assert.deepEqual(await fenceLocks(observer), []);
  await gate.query('COMMIT');
  await wm.close();
});

test('aborting the signal cancels a waiting heartbeat: the watermark is complete and no fence is held', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = watermarker(db, []);
  await wm.step();
  await insertEvent(await db.session('writer'));

  const gate = await gateHeartbeat(db, 'wm');
  const controller = new AbortController();
  const stepping = wm.step({ signal: controller.signal });
  const beatPid = await waitForBlockedStatement(observer, '.beat(');
  controller.abort();
  const progress = await stepping;

  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.heartbeat, 'cancelled');
  assert.equal(await safeSeq(observer), 1n);
  assert.deepEqual(await fenceLocks(observer), []);
  // The heartbeat's statement was cancelled on the server, not abandoned there.
  await waitFor('the heartbeat backend to stop waiting', async () => {
    const r = await observer.query(`SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, [beatPid]);
    return r.rows[0]?.wait_event_type !== 'Lock';
  });
  const beat = await gate.query(`SELECT details->>'safeSeq' AS s FROM tidemark.heartbeats WHERE owner = 'wm'`);
  assert.equal(beat.rows[0].s, '0', 'the cancelled heartbeat wrote nothing');
  await gate.query('COMMIT');
  await wm.close();
});
