import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createMetrics, Watermarker, type WatermarkerEvent } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, waitFor } from '../support/db.js';
import { Recorder } from '../support/latch.js';
import { startProxy } from '../support/proxy.js';

after(closeAdmin);

test('a blackholed watermarker drops the connection, stops believing it leads before the lease can expire, and a standby takes over', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const target = new URL(db.url);
  const proxy = await startProxy({ target: { host: target.hostname, port: Number(target.port || 5432) } });
  db.defer(() => proxy.close());
  // The active watermarker reaches the server through the proxy; the standby and the test directly.
  const pool = db.pool({ connectionString: proxy.url(db.url), connectionTimeoutMillis: 1000 });
  const direct = db.pool();
  const timing = { leaseTtlMs: 2000, leaseRenewMs: 600, summaryIntervalMs: 300, responseTimeoutMs: 500, retryMinMs: 50, retryMaxMs: 200 };
  const events = new Recorder<WatermarkerEvent>();
  const errors: unknown[] = [];
  const active = new Watermarker(pool, { ...timing, owner: 'active', observer: events.push, onError: (e) => errors.push(e) });
  const stop = new AbortController();
  const running = active.run(stop.signal);
  db.defer(() => (stop.abort(), proxy.heal(), running));
  await events.next((e) => e.type === 'run' && e.summary.leader);
  assert.equal(active.isLeader, true);

  // A blackhole: the path stops answering without closing. The loop's run on
  // the server ends on time (its answer is held by the proxy), and nothing
  // renews the lease after that.
  proxy.blackhole();
  const lastRun = events.items.filter((e) => e.type === 'run').at(-1);
  assert.ok(lastRun?.type === 'run' && lastRun.summary.leaderUntil !== null && lastRun.summary.leaseExpiresAt !== null);
  const believedUntil = lastRun.summary.leaderUntil;
  // The belief never outlasts the lease it was derived from (same machine, same clock).
  assert.ok(believedUntil.getTime() <= lastRun.summary.leaseExpiresAt.getTime(), `believed until ${believedUntil.toISOString()}, lease expires ${lastRun.summary.leaseExpiresAt.toISOString()}`);

  // The dead connection is noticed (no answer within summaryIntervalMs + responseTimeoutMs) and retried.
  const retry = await events.next((e) => e.type === 'retry');
  assert.ok(retry.type === 'retry');
  assert.match(String(retry.error), /no answer from the server within (500|5800) ms/);
  await waitFor('the active one to stop believing it leads', async () => !active.isLeader);

  // A standby takes the lease once it expires, and publishes.
  const standby = new Watermarker(direct, { ...timing, owner: 'standby' });
  const standbyStop = new AbortController();
  const standbyRunning = standby.run(standbyStop.signal);
  await waitFor('the standby to take over', async () => standby.isLeader);
  const seq = await insertEvent(await db.session('writer'));
  await waitFor('a publication by the standby', async () => (await observer.query(`SELECT safe_seq FROM tidemark.watermark`)).rows[0].safe_seq === seq.toString());
  const taken = (await observer.query<{ owner: string }>(`SELECT lease_owner AS owner FROM tidemark.watermark`)).rows[0]!;
  assert.equal(taken.owner, 'standby');
  assert.equal(active.isLeader, false);
  proxy.heal();
  stop.abort();
  standbyStop.abort();
  await Promise.all([running, standbyRunning]);
  await standby.close();
  await active.close().catch(() => undefined); // its lease is gone already
});

test('with no news from the server, the belief in the lease (isLeader, the leader metric) ends by the lease clock, before any retry', async (t) => {
  const db = await testDb(t);
  const target = new URL(db.url);
  const proxy = await startProxy({ target: { host: target.hostname, port: Number(target.port || 5432) } });
  db.defer(() => proxy.close());
  const pool = db.pool({ connectionString: proxy.url(db.url), connectionTimeoutMillis: 1000 });
  const metrics = createMetrics({ pool: db.pool(), processMetrics: false });
  const events = new Recorder<WatermarkerEvent>();
  // A response bound far beyond the lease: only the lease clock can end the belief in time.
  const active = new Watermarker(pool, {
    leaseTtlMs: 2000,
    leaseRenewMs: 600,
    summaryIntervalMs: 300,
    responseTimeoutMs: 60_000,
    observer: (e) => {
      events.push(e);
      metrics.watermarkObserver(e);
    },
  });
  const stop = new AbortController();
  const running = active.run(stop.signal);
  db.defer(() => (stop.abort(), proxy.heal(), running));
  await events.next((e) => e.type === 'run' && e.summary.leader);
  const leaderMetric = async () => /^tidemark_watermarker_leader 1$/m.test(await metrics.registry.metrics());
  assert.equal(await leaderMetric(), true);

  proxy.blackhole();
  const lastRun = events.items.filter((e) => e.type === 'run').at(-1);
  assert.ok(lastRun?.type === 'run' && lastRun.summary.leaseExpiresAt !== null);
  // At the expiry of the last lease it heard of, the belief is over (it ends a little earlier).
  const expiry = lastRun.summary.leaseExpiresAt.getTime();
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, expiry - Date.now())));
  while (Date.now() < expiry) await new Promise((resolve) => setImmediate(resolve));
  assert.equal(active.isLeader, false, 'no belief past the lease it knew of');
  assert.equal(events.items.some((e) => e.type === 'retry'), false, 'no retry yet: the lease clock ended it');
  assert.equal(await leaderMetric(), false, 'the leader gauge follows');

  proxy.heal();
  stop.abort();
  await running;
  await active.close().catch(() => undefined);
});
