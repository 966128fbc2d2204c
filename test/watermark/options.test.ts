import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { InvalidOptionsError, Watermarker, type WatermarkerOptions } from '../../src/index.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

test('options of earlier versions are refused with the reason they went away', async (t) => {
  const db = await testDb(t);
  for (const option of ['lockTimeoutMs', 'lockTimeoutMaxMs', 'fenceTryLimit']) {
    assert.throws(
      () => new Watermarker(db.pool(), { [option]: 5 } as WatermarkerOptions),
      (err: unknown) => err instanceof InvalidOptionsError && err.option === option && /^\w+: was removed: the watermark step no longer/.test(err.message),
    );
  }
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
    [{ pollMinMs: 50, pollMaxMs: 10 }, 'pollMaxMs'],
    [{ pollMinMs: 0 }, 'pollMinMs'],
    [{ summaryIntervalMs: 5000 }, 'summaryIntervalMs'],
    [{ retryMinMs: 100, retryMaxMs: 50 }, 'retryMaxMs'],
    [{ tryLockFirst: 'no' }, 'tryLockFirst'],
    [{ maxStepsPerSecond: 0 }, 'maxStepsPerSecond'],
    [{ maxStepsPerSecond: 2.5 }, 'maxStepsPerSecond'],
    [{ bogus: 1 }, 'bogus'],
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
  assert.equal(wm.options.pollMinMs, 1);
  assert.equal(wm.options.pollMaxMs, 100);
  assert.equal(wm.options.idleGraceMs, 1000);
  assert.equal(wm.options.summaryIntervalMs, 1000);
  assert.equal(wm.options.tryLockFirst, true);
  assert.equal(new Watermarker(db.pool(), { leaseTtlMs: 1500 }).options.summaryIntervalMs, 500, 'a run returns within the renewal interval');
  assert.match(wm.options.owner, /^.+:\d+:[0-9a-f]{8}$/);
});

test('the watermarker refuses to step outside READ COMMITTED', async (t) => {
  const db = await testDb(t);
  const s = db.observer;
  await s.query(`UPDATE tidemark.watermark SET lease_owner = 'x', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  await s.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await assert.rejects(s.query(`SELECT * FROM tidemark.watermark_step('x')`), /must run in READ COMMITTED/);
  await s.query('ROLLBACK');
});
