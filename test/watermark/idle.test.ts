import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { InvalidOptionsError, Watermarker, type WatermarkerOptions } from '../../src/index.js';
import { closeAdmin, fenceLocks, insertEvent, testDb, waitFor } from '../support/db.js';

after(closeAdmin);

test('idle steps publish nothing, take no fence and leave the watermark row untouched; heartbeats are throttled', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool(), { leaseTtlMs: 600_000, heartbeatIntervalMs: 600_000 });
  const first = await wm.step(); // acquires the lease (a write) and beats once
  assert.equal(first.outcome, 'idle');
  assert.equal(first.heartbeat, 'written');
  const rowVersion = async () => (await observer.query(`SELECT xmin::text AS v, updated_at FROM tidemark.watermark`)).rows[0];
  const beatAt = async () => (await observer.query(`SELECT beat_at FROM tidemark.heartbeats`)).rows.map((r) => r.beat_at.getTime());
  const before = await rowVersion();
  const beatsBefore = await beatAt();

  for (let i = 0; i < 20; i++) {
    const p = await wm.step();
    assert.equal(p.outcome, 'idle');
    assert.equal(p.heartbeat, 'throttled');
    assert.equal(p.fenceHoldMs, 0);
  }
  assert.deepEqual(await rowVersion(), before, 'no idle step rewrote the watermark row');
  assert.deepEqual(await beatAt(), beatsBefore, 'no heartbeat within the interval');

  // An event makes the next step advance, and the row changes exactly then.
  await insertEvent(await db.session('writer'));
  assert.equal((await wm.step()).outcome, 'advanced');
  const after1 = await rowVersion();
  assert.notEqual(after1.v, before.v);
  assert.equal((await wm.step()).outcome, 'idle');
  assert.deepEqual(await rowVersion(), after1);
  assert.deepEqual(await fenceLocks(observer), []);
  await wm.close();
});

test('invalid watermarker options are rejected at construction, naming the option, and nothing is written', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const cases: [WatermarkerOptions | unknown, string][] = [
    [{ schema: 'Bad-Name' }, 'schema'],
    [{ owner: '' }, 'owner'],
    [{ owner: 'x'.repeat(201) }, 'owner'],
    [{ leaseTtlMs: 0 }, 'leaseTtlMs'],
    [{ leaseTtlMs: 1.5 }, 'leaseTtlMs'],
    [{ leaseTtlMs: '10s' }, 'leaseTtlMs'],
    [{ leaseTtlMs: 1000, leaseRenewMs: 500 }, 'leaseRenewMs'],
    [{ lockTimeoutMs: 0 }, 'lockTimeoutMs'],
    [{ lockTimeoutMs: Number.NaN }, 'lockTimeoutMs'],
    [{ fenceTryLimit: -1 }, 'fenceTryLimit'],
    [{ pollMinMs: 50, pollMaxMs: 10 }, 'pollMaxMs'],
    [{ idleGraceMs: -1 }, 'idleGraceMs'],
    [{ heartbeatIntervalMs: -5 }, 'heartbeatIntervalMs'],
    [{ heartbeatTimeoutMs: 0 }, 'heartbeatTimeoutMs'],
    [{ synchronousCommit: 'yes' }, 'synchronousCommit'],
    [{ observer: 'log' }, 'observer'],
    [null, 'options'],
  ];
  for (const [options, option] of cases) {
    assert.throws(
      () => new Watermarker(pool, options as WatermarkerOptions),
      (err: unknown) => err instanceof InvalidOptionsError && err.option === option && err.message.startsWith(`${option}:`),
      `expected ${option} to be rejected for ${JSON.stringify(options)}`,
    );
  }
  assert.throws(() => new Watermarker(undefined as never), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'pool');
  const row = await db.observer.query('SELECT lease_owner, safe_seq FROM tidemark.watermark');
  assert.deepEqual(row.rows[0], { lease_owner: null, safe_seq: '0' });
  const beats = await db.observer.query('SELECT count(*)::int AS n FROM tidemark.heartbeats');
  assert.equal(beats.rows[0].n, 0);
});

test('the resolved options are frozen and carry the defaults', async (t) => {
  const db = await testDb(t);
  const wm = new Watermarker(db.pool());
  assert.ok(Object.isFrozen(wm.options));
  assert.equal(wm.options.schema, 'tidemark');
  assert.equal(wm.options.leaseTtlMs, 10_000);
  assert.equal(wm.options.leaseRenewMs, 3333);
  assert.equal(wm.options.synchronousCommit, false);
  assert.equal(wm.options.lockTimeoutMs, 5);
  assert.equal(wm.options.fenceTryLimit, 0);
  assert.equal(wm.options.idleGraceMs, 1000);
  assert.match(wm.options.owner, /^.+:\d+:[0-9a-f]{8}$/);
});

test('the watermarker refuses to step outside READ COMMITTED', async (t) => {
  const db = await testDb(t);
  const s = db.observer;
  await s.query(`UPDATE tidemark.watermark SET lease_owner = 'x', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  await s.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await assert.rejects(s.query(`SELECT * FROM tidemark.watermark_step('x', true, 1000, true, 50)`), /must run in READ COMMITTED/);
  await s.query('ROLLBACK');
});

test('after a publication, idle steps keep the pollMinMs cadence for idleGraceMs instead of backing off', async (t) => {
  const db = await testDb(t);
  await insertEvent(await db.session('writer'));
  const outcomes: string[] = [];
  // Without the grace, idle waits double from 5 ms toward the one-hour cap:
  // the 20th idle step would come about 5 * 2^20 ms (1.5 h) after the first.
  const wm = new Watermarker(db.pool(), { pollMinMs: 5, pollMaxMs: 3_600_000, idleGraceMs: 3_600_000, observer: (p) => outcomes.push(p.outcome) });
  const stop = new AbortController();
  const running = wm.run(stop.signal);
  try {
    await waitFor('20 idle steps after the publication', async () => outcomes.filter((o) => o === 'idle').length >= 20);
  } finally {
    stop.abort();
    await running;
    await wm.close();
  }
  assert.equal(outcomes[0], 'advanced');
});
