import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { closeAdmin, safeSeq, testDb, waitFor, type TestDb } from '../support/db.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';

after(closeAdmin);

async function lease(db: TestDb): Promise<{ owner: string | null; expires: Date | null }> {
  const r = await db.observer.query('SELECT lease_owner AS owner, lease_expires_at AS expires FROM tidemark.watermark');
  return r.rows[0];
}

test('serve answers /healthz and /metrics; SIGTERM exits 0 and releases the lease at once', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const child = startCli(['serve', '--roles', 'watermarker,pruner', '--http', '127.0.0.1:0', '--owner', 'node-a', '--lease-ttl', '60s'], { env });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const [, address] = await stderr.next(/http on (\S+) /);
  await stderr.next(/lease acquired: active/);

  await cli(['append', '--stream', 'orders', '--kind', 'k', '--key', 'x'], { env });
  await waitFor('safe_seq to advance', async () => (await safeSeq(db.observer)) === 1n);
  await cli(['tail', '--consumer', 'audit', '--stream', 'orders', '--once'], { env });

  const health = await fetch(`http://${address}/healthz`);
  assert.equal(health.status, 200);
  const body = (await health.json()) as { status: string; database: unknown; watermarker: { leader: boolean; owner: string }; pruner: { healthy: boolean } };
  assert.equal(body.status, 'ok');
  assert.deepEqual(body.database, { ok: true });
  assert.equal(body.watermarker.leader, true);
  assert.equal(body.watermarker.owner, 'node-a');
  assert.equal(body.pruner.healthy, true);

  const metrics = await (await fetch(`http://${address}/metrics`)).text();
  for (const line of [
    /^tidemark_safe_seq 1$/m,
    /^tidemark_max_seq 1$/m,
    /^tidemark_watermark_lag_events 0$/m,
    /^tidemark_watermark_lag_seconds 0$/m,
    /^tidemark_lease_live 1$/m,
    /^tidemark_watermarker_leader 1$/m,
    /^tidemark_fence_wait_seconds_bucket\{le="[^"]+",role="watermarker"\} \d+$/m,
    /^tidemark_fence_hold_seconds_count\{role="watermarker"\} [1-9]\d*$/m,
    /^tidemark_watermark_steps_total\{outcome="advanced"\} [1-9]\d*$/m,
    /^tidemark_watermark_step_errors_total 0$/m,
    /^tidemark_pruned_events_total 0$/m,
    /^tidemark_consumer_cursor_seq\{consumer="audit",stream="orders"\} 1$/m,
    /^tidemark_consumer_lag_events\{consumer="audit",stream="orders"\} 0$/m,
    /^tidemark_database_up 1$/m,
    /^# TYPE tidemark_fence_timeouts_total counter$/m,
    /^process_cpu_seconds_total /m,
  ]) {
    assert.match(metrics, line);
  }
  assert.equal((await fetch(`http://${address}/nope`)).status, 404);

  child.kill('SIGTERM');
  assert.equal(await exited(child), 0, stderr.text());
  assert.match(stderr.text(), /SIGTERM: stopping[\s\S]*stopped/);
  assert.deepEqual(await lease(db), { owner: null, expires: null }, 'the lease is released on exit, not left to expire');
});

test('two serve processes: one active watermarker; after SIGKILL the standby takes over once the lease expires', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const args = (owner: string) => ['serve', '--roles', 'watermarker', '--lease-ttl', '1s', '--owner', owner];
  const a = startCli(args('node-a'), { env });
  t.after(() => a.kill('SIGKILL'));
  const aErr = watchStderr(a);
  await aErr.next(/lease acquired: active/);
  const b = startCli(args('node-b'), { env });
  t.after(() => b.kill('SIGKILL'));
  const bErr = watchStderr(b);
  await bErr.next(/watermarker standby \(lease held by node-a\)/);
  assert.equal((await lease(db)).owner, 'node-a');

  // The active process dies without releasing its lease.
  a.kill('SIGKILL');
  assert.equal(await exited(a), 'SIGKILL');
  const before = await lease(db);
  await bErr.next(/lease acquired: active/);
  const after = await lease(db);
  assert.equal(after.owner, 'node-b');
  const { acquired } = (await db.observer.query(`SELECT lease_expires_at - interval '1 second' AS acquired FROM tidemark.watermark`)).rows[0];
  assert.ok(before.owner === 'node-a' && acquired >= before.expires!, 'the standby waited for the lease to expire');

  await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'x'], { env });
  await waitFor('the new active watermarker to publish', async () => (await safeSeq(db.observer)) === 1n);
  b.kill('SIGTERM');
  assert.equal(await exited(b), 0);
  assert.equal((await lease(db)).owner, null);
});

test('/healthz answers 503 while the database is unreachable, and 200 again once it is back', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const child = startCli(['serve', '--roles', 'watermarker', '--http', '127.0.0.1:0', '--lease-ttl', '60s'], { env });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const [, address] = await stderr.next(/http on (\S+) /);
  await stderr.next(/lease acquired: active/);
  assert.equal((await fetch(`http://${address}/healthz`)).status, 200);

  // No new connections, and the serve process's existing ones are ended.
  const admin = new pg.Client({ connectionString: process.env.TIDEMARK_TEST_ADMIN_URL });
  await admin.connect();
  t.after(() => admin.end());
  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS false`);
  await db.observer.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'tidemark-cli'`);
  const down = await waitFor('healthz to report the database down', async () => {
    const r = await fetch(`http://${address}/healthz`);
    return r.status === 503 ? ((await r.json()) as { status: string; database: { ok: boolean } }) : undefined;
  });
  assert.equal(down.status, 'unhealthy');
  assert.equal(down.database.ok, false);

  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS true`);
  await waitFor('healthz to recover', async () => (await fetch(`http://${address}/healthz`)).status === 200);
  child.kill('SIGTERM');
  assert.equal(await exited(child), 0, stderr.text());
});
