import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker } from '../../src/index.js';
import { closeAdmin, insertEvent, safeSeq, testDb, waitFor } from '../support/db.js';

after(closeAdmin);

test('a standby publishes nothing, and takes over once the active lease expires', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  const active = new Watermarker(pool, { owner: 'active', leaseTtlMs: 2000, leaseRenewMs: 600 });
  const standby = new Watermarker(pool, { owner: 'standby', leaseTtlMs: 2000, leaseRenewMs: 600 });

  assert.equal((await active.step()).leader, true);
  await insertEvent(await db.session('writer'));
  const waiting = await standby.step();
  assert.equal(waiting.outcome, 'not_leader');
  assert.equal(waiting.leaseOwner, 'active');
  assert.equal(await safeSeq(observer), 0n, 'a standby never publishes');
  assert.equal((await active.step()).safeSeq, 1n);

  // The active one stops stepping (a crash). The standby keeps trying and
  // takes over only once the lease has expired by the database's clock.
  const { expires } = (await observer.query(`SELECT lease_expires_at AS expires FROM tidemark.watermark`)).rows[0];
  const takeover = await waitFor('the standby to take over', async () => {
    const p = await standby.step();
    return p.leader ? p : undefined;
  });
  assert.ok(takeover.leaseExpiresAt! > expires);
  const { acquired } = (await observer.query(`SELECT lease_expires_at - make_interval(secs => 2) AS acquired FROM tidemark.watermark`)).rows[0];
  assert.ok(acquired >= expires, 'the standby acquired the lease no earlier than its expiry');
  await insertEvent(await db.session('writer2'));
  assert.equal((await standby.step()).safeSeq, 2n);
  await standby.close();
  await active.close();
});

test('a stale owner that still believes it leads cannot publish', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const pool = db.pool();
  // Renewal far apart, so the stale owner goes straight to the fenced section.
  const stale = new Watermarker(pool, { owner: 'stale', leaseTtlMs: 60_000, leaseRenewMs: 29_000 });
  const next = new Watermarker(pool, { owner: 'next', leaseTtlMs: 60_000 });
  assert.equal((await stale.step()).leader, true);

  // Time passes (simulated on the lease row); the other instance takes over.
  await observer.query(`UPDATE tidemark.watermark SET lease_expires_at = clock_timestamp() - interval '1 second'`);
  assert.equal((await next.step()).leader, true);

  await insertEvent(await db.session('writer'));
  assert.equal(stale.isLeader, true, 'the stale owner has not noticed yet');
  const refused = await stale.step();
  assert.equal(refused.outcome, 'not_leader');
  assert.equal(refused.leaseOwner, 'next');
  assert.equal(stale.isLeader, false);
  assert.equal(await safeSeq(observer), 0n, 'the stale owner published nothing');

  // An expired lease nobody took over is no licence either.
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = 'stale', lease_expires_at = clock_timestamp() - interval '1 second'`);
  const row = await observer.query(`SELECT * FROM tidemark.watermark_step('stale', true, 1000, true, 50)`);
  assert.equal(row.rows[0].outcome, 'not_leader');
  assert.equal(await safeSeq(observer), 0n);

  // 'next' learns from the fenced section that its lease is gone, then
  // acquires the expired lease again on its following step.
  assert.equal((await next.step()).outcome, 'not_leader');
  assert.equal((await next.step()).safeSeq, 1n);
  await next.close();
  await stale.close();
});

test('close releases the lease so a standby takes over at once', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const a = new Watermarker(pool, { owner: 'a', leaseTtlMs: 600_000 });
  const b = new Watermarker(pool, { owner: 'b', leaseTtlMs: 600_000 });
  assert.equal((await a.step()).leader, true);
  assert.equal((await b.step()).leader, false);
  await a.close();
  await a.close(); // idempotent
  await assert.rejects(a.step(), { code: 'CLOSED' });
  assert.equal((await b.step()).leader, true);
  const lease = await db.observer.query('SELECT lease_owner FROM tidemark.watermark');
  assert.equal(lease.rows[0].lease_owner, 'b');
  await b.close();
  const released = await db.observer.query('SELECT lease_owner, lease_expires_at FROM tidemark.watermark');
  assert.deepEqual(released.rows[0], { lease_owner: null, lease_expires_at: null });
});
