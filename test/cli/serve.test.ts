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
  const child = startCli(['serve', '--roles', 'watermarker,pruner', '--http', '127.0.0.1:0', '--owner', 'node-a', '--lease-ttl', '60s', '--max-steps-per-second', '250'], { env });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const [, address] = await stderr.next(/http on (\S+) /);
  await stderr.next(/lease acquired: active/);
  // The step budget reaches the loop in PostgreSQL.
  const call = await waitFor('the loop running', async () =>
    (await db.observer.query<{ query: string }>(`SELECT query FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'tidemark-watermarker' AND query LIKE 'CALL %'`)).rows[0]?.query);
  assert.match(call, /p_max_steps_per_second => 250\b/);

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

  // Step counts arrive with the loop's summaries (one a second).
  const metrics = await waitFor('the loop summary in /metrics', async () => {
    const text = await (await fetch(`http://${address}/metrics`)).text();
    return /^tidemark_watermark_steps_total\{outcome="advanced"\} [1-9]\d*$/m.test(text) ? text : undefined;
  });
  for (const line of [
    /^tidemark_safe_seq 1$/m,
    /^tidemark_max_seq 1$/m,
    /^tidemark_watermark_lag_events 0$/m,
    /^tidemark_watermark_lag_seconds 0$/m,
    /^tidemark_lease_live 1$/m,
    /^tidemark_watermarker_leader 1$/m,
    /^tidemark_watermark_step_seconds_bucket\{le="[^"]+"\} \d+$/m,
    /^tidemark_watermark_step_seconds_count [1-9]\d*$/m,
    /^tidemark_watermark_holder_reads_total\{path="(try_lock|pg_locks)"\} [1-9]\d*$/m,
    /^tidemark_watermark_blocking_writers 0$/m,
    /^tidemark_watermark_oldest_blocker_seconds 0$/m,
    /^tidemark_watermark_step_errors_total 0$/m,
    /^# TYPE tidemark_watermarker_retries_total counter$/m,
    /^tidemark_pruned_events_total 0$/m,
    /^tidemark_consumer_cursor_seq\{consumer="audit",stream="orders"\} 1$/m,
    /^tidemark_consumer_lag_events\{consumer="audit",stream="orders"\} 0$/m,
    /^tidemark_database_up 1$/m,
    /^tidemark_status_visible\{part="streams"\} 1$/m,
    /^tidemark_status_visible\{part="consumers"\} 1$/m,
    /^tidemark_status_visible\{part="blocking_writers"\} 1$/m,
    /^process_cpu_seconds_total /m,
  ]) {
    assert.match(metrics, line);
  }
  assert.doesNotMatch(metrics, /tidemark_fence_/, 'the fence-wait metrics are gone');
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

test('an outage: /healthz 503, metrics keep the last safe_seq and drop the leader by the lease clock; recovery within seconds; SIGTERM while down exits 0', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  // A pruner interval of an hour: after the outage it must not wait for it.
  const child = startCli(['serve', '--roles', 'watermarker,pruner', '--http', '127.0.0.1:0', '--lease-ttl', '3s', '--prune-interval', '1h'], { env });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const [, address] = await stderr.next(/http on (\S+) /);
  await stderr.next(/lease acquired: active/);
  await cli(['append', '--stream', 'orders', '--kind', 'k', '--key', 'x'], { env });
  await waitFor('safe_seq to advance', async () => (await safeSeq(db.observer)) === 1n);
  const metric = async (name: string) => {
    const text = await (await fetch(`http://${address}/metrics`)).text();
    return new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1];
  };
  await waitFor('the leader metric', async () => (await metric('tidemark_watermarker_leader')) === '1');
  assert.equal((await fetch(`http://${address}/healthz`)).status, 200);

  // No new connections, and the serve process's existing ones are ended.
  const admin = new pg.Client({ connectionString: process.env.TIDEMARK_TEST_ADMIN_URL });
  await admin.connect();
  t.after(() => admin.end());
  const outage = async () => {
    await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS false`);
    await db.observer.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'tidemark-%'`);
  };
  await outage();
  const down = await waitFor('healthz to report the database down', async () => {
    const r = await fetch(`http://${address}/healthz`);
    return r.status === 503 ? ((await r.json()) as { status: string; database: { ok: boolean; error: string } }) : undefined;
  });
  assert.equal(down.status, 'unhealthy');
  assert.equal(down.database.ok, false);
  assert.doesNotMatch(down.database.error, /\n/, 'one line');
  // The lease (3 s) cannot be renewed: the leader gauge and /healthz drop it by themselves.
  await waitFor('the leader metric to drop', async () => (await metric('tidemark_watermarker_leader')) === '0', 10_000);
  const body = (await (await fetch(`http://${address}/healthz`)).json()) as { watermarker: { leader: boolean } };
  assert.equal(body.watermarker.leader, false);
  assert.equal(await metric('tidemark_database_up'), '0');
  assert.equal(await metric('tidemark_safe_seq'), '1', 'the last safe_seq read, not 0');
  await waitFor('a retry counted', async () => Number(await metric('tidemark_watermarker_retries_total')) > 0);
  assert.match(stderr.text(), /watermarker: .*; retrying in \d+ ms/);

  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS true`);
  // Within seconds, though the pruner's next pass is an hour away.
  await waitFor('healthz to recover', async () => (await fetch(`http://${address}/healthz`)).status === 200, 30_000);
  await waitFor('the leader metric back', async () => (await metric('tidemark_watermarker_leader')) === '1');

  // SIGTERM while the database is down: one line about the lease, exit 0, no stack.
  await outage();
  await waitFor('healthz to report the database down', async () => (await fetch(`http://${address}/healthz`)).status === 503);
  child.kill('SIGTERM');
  assert.equal(await exited(child), 0, stderr.text());
  assert.doesNotMatch(stderr.text(), /^\s+at /m, 'no stack trace');
  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS true`);
});

test('serve started while the database is unreachable becomes healthy within seconds of its return, not at the next prune interval', async (t) => {
  const db = await testDb(t);
  const admin = new pg.Client({ connectionString: process.env.TIDEMARK_TEST_ADMIN_URL });
  await admin.connect();
  t.after(() => admin.end());
  db.defer(() => admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS true`)); // before the database is dropped
  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS false`);
  const child = startCli(['serve', '--roles', 'watermarker,pruner', '--http', '127.0.0.1:0', '--prune-interval', '1h'], { env: { DATABASE_URL: db.url } });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const [, address] = await stderr.next(/http on (\S+) /);
  const down = await waitFor('the pruner to report its failed pass', async () => {
    const r = (await (await fetch(`http://${address}/healthz`)).json()) as { pruner: { lastError: string | null } };
    return r.pruner.lastError ?? undefined;
  });
  assert.doesNotMatch(down, /\n/, 'one line');
  assert.match(stderr.text(), /pruner: .*; retrying/);
  await admin.query(`ALTER DATABASE "${db.name}" ALLOW_CONNECTIONS true`);
  await waitFor('healthz to turn 200', async () => (await fetch(`http://${address}/healthz`)).status === 200, 30_000);
  child.kill('SIGTERM');
  assert.equal(await exited(child), 0, stderr.text());
});

test('serve: a terminated loop backend is reconnected by itself, and a removed flag is refused in one line', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const removed = await cli(['serve', '--roles', 'watermarker', '--lock-timeout', '5ms'], { env });
  assert.equal(removed.code, 2);
  assert.equal(removed.stderr, 'tidemark: --lock-timeout was removed: the watermark step no longer waits for the fence; it observes the writers in flight instead (docs/PROTOCOL.md §3)\n');
  for (const flag of ['--lock-timeout-max', '--fence-try-limit']) {
    const r = await cli(['serve', flag, '1'], { env });
    assert.equal(r.code, 2);
    assert.match(r.stderr, new RegExp(`^tidemark: ${flag} was removed: `));
    assert.equal(r.stderr.split('\n').length, 2, 'one line');
  }

  const child = startCli(['serve', '--roles', 'watermarker', '--lease-ttl', '60s'], { env });
  t.after(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  await stderr.next(/lease acquired: active/);
  const loopPid = async () =>
    (await db.observer.query(`SELECT pid FROM pg_stat_activity WHERE application_name = 'tidemark-watermarker' AND datname = current_database()`)).rows[0]
      ?.pid as number | undefined;
  const first = await waitFor('the loop backend', loopPid);
  await db.observer.query('SELECT pg_terminate_backend($1)', [first]);
  // Terminated in the middle of a run (57P01) or between two runs (the
  // client then reports a connection error): either way, one line and a retry.
  await stderr.next(/watermarker: .*; retrying in \d+ ms/);
  await waitFor('a new loop backend', async () => {
    const pid = await loopPid();
    return pid !== undefined && pid !== first;
  });
  await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'x'], { env });
  await waitFor('the resumed loop to publish', async () => (await safeSeq(db.observer)) === 1n);
  child.kill('SIGTERM');
  assert.equal(await exited(child), 0, stderr.text());
  assert.equal((await lease(db)).owner, null);
});

test('a second serve with a live serve\'s --owner exits 2 in one line and leaves the first one\'s lease; once the first is gone the owner runs again', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const first = startCli(['serve', '--roles', 'watermarker', '--owner', 'same', '--lease-ttl', '3s'], { env });
  t.after(() => first.kill('SIGKILL'));
  await watchStderr(first).next(/running watermarker as same/);
  await waitFor('the first to hold the lease', async () => (await lease(db)).owner === 'same');

  const second = await cli(['serve', '--roles', 'watermarker', '--owner', 'same', '--lease-ttl', '3s'], { env });
  assert.equal(second.code, 2, second.stderr);
  const lines = second.stderr.split('\n').filter(Boolean);
  assert.match(lines.at(-1)!, /^tidemark: --owner: owner "same" is in use by another live watermarker \(instance [^ ]+:\d+:[0-9a-f]{8}, claimed since \S+\); give each process its own owner, or stop the other$/);
  assert.equal((await lease(db)).owner, 'same', 'the first one keeps its lease: the refused one did not release it');
  assert.equal(first.exitCode, null, 'the first one runs on');

  first.kill('SIGTERM');
  assert.equal(await exited(first), 0);
  const again = startCli(['serve', '--roles', 'watermarker', '--owner', 'same', '--lease-ttl', '3s'], { env });
  t.after(() => again.kill('SIGKILL'));
  await waitFor('the owner to lead again', async () => (await lease(db)).owner === 'same');
  again.kill('SIGTERM');
  assert.equal(await exited(again), 0);
});
