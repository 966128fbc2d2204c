import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker, type WatermarkProgress } from '../../src/index.js';
import { closeAdmin, fenceLocks, insertEvent, safeSeq, testDb, waitFor, waitForBlockedStatement, type Session, type TestDb } from '../support/db.js';

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
    heartbeatIntervalMs: 0, // beat after every step
    heartbeatTimeoutMs: 60_000,
    observer: (e) => {
      if (e.type === 'step') observed.push(e.progress);
    },
    onError: (err) => errors.push(err),
  });
}

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

test('an observer that throws after a publication is reported; the step still returns what it published', async (t) => {
  const db = await testDb(t);
  const errors: unknown[] = [];
  const boom = new Error('observer failed');
  const wm = new Watermarker(db.pool(), {
    observer: () => {
      throw boom;
    },
    onError: (err) => errors.push(err),
  });
  await insertEvent(await db.session('writer'));
  const p = await wm.step();
  assert.deepEqual([p.outcome, p.safeSeq], ['advanced', 1n]);
  assert.equal(await safeSeq(db.observer), 1n);
  assert.deepEqual(errors, [boom]);
  await wm.close();
});
