/**
 * The shared embedded server (./.tidemark/pg, used with no database URL)
 * belongs to no one command: it outlives the command that started it,
 * whether that one exits on SIGINT or is killed, and the last command to
 * leave stops it. Each test has a working directory of its own, so its
 * .tidemark/ and its server are private; the commands are real processes.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { test, type TestContext } from 'node:test';
import pg from 'pg';
import { attachOrStartEmbeddedPostgres } from '../../src/db/embedded.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';
import { dataDir, postmaster, privateDir, probePort, processAlive, startCliGroup, track, until, type Postmaster } from '../support/embedded-dir.js';

/** A connection of the test's own; it counts as a client, so it is ended before a stop is expected. */
async function observe(t: TestContext, port: number): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: `postgres://postgres:tidemark@127.0.0.1:${port}/postgres`, application_name: 'embedded-shared-test' });
  client.on('error', () => undefined);
  await client.connect();
  t.after(() => client.end().catch(() => undefined));
  return client;
}

/** Client backends with this application_name: 'tidemark-cli' (commands' pools) or 'tidemark-embedded-member' (one per process using the server). */
async function backends(observer: pg.Client, application: string): Promise<number> {
  const r = await observer.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name = $1`,
    [application],
  );
  return r.rows[0]!.n;
}

/** `tidemark migrate`, which starts the server and, being its only user, stops it on exit. */
async function migrated(cwd: string): Promise<void> {
  const r = await cli(['migrate'], { cwd });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(postmaster(cwd), undefined, 'migrate, the only user, stopped the server it started');
}

/**
 * `tidemark tail` in follow mode, in a process group of its own as a
 * terminal runs it, starts the server; resolves once it is connected (its
 * signal handlers are set by then).
 */
async function startTail(t: TestContext, cwd: string): Promise<{ tail: ChildProcess; server: Postmaster; observer: pg.Client }> {
  const tail = track(t, startCliGroup(['tail', '--consumer', 'c', '--stream', 's'], cwd));
  const server = await until('tail to start the server', async () => {
    const p = postmaster(cwd);
    return p?.status === 'ready' && p;
  });
  const observer = await observe(t, server.port);
  await until('tail to connect', async () => (await backends(observer, 'tidemark-cli')) > 0);
  return { tail, server, observer };
}

/** `tidemark serve` with a watermarker; resolves with its HTTP address once it leads. */
async function startServe(t: TestContext, cwd: string): Promise<{ serve: ChildProcess; address: string; stderr: () => string }> {
  const serve = track(t, startCli(['serve', '--roles', 'watermarker', '--http', '127.0.0.1:0'], { cwd }));
  const stderr = watchStderr(serve);
  const [, address] = await stderr.next(/http on (\S+) /);
  await stderr.next(/lease acquired: active/);
  return { serve, address: address!, stderr: stderr.text };
}

/** serve keeps working: an event appended by a third command is published, as /healthz and `status --json` show. */
async function assertServeDelivers(cwd: string, address: string): Promise<void> {
  assert.equal((await fetch(`http://${address}/healthz`)).status, 200);
  const appended = await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'x'], { cwd });
  assert.equal(appended.code, 0, appended.stderr);
  const seq = BigInt(appended.stdout.trim());
  await until(`serve to publish seq ${seq}`, async () => {
    const r = await fetch(`http://${address}/healthz`);
    const body = (await r.json()) as { watermarker: { safeSeq: string } };
    return r.status === 200 && BigInt(body.watermarker.safeSeq) >= seq;
  });
  const status = await cli(['status', '--json'], { cwd });
  assert.equal(status.code, 0, status.stderr);
  assert.ok(BigInt(String((JSON.parse(status.stdout) as { safeSeq: unknown }).safeSeq)) >= seq, status.stdout);
}

/** The server is gone: no postmaster.pid, no process, the port refused. */
async function assertStopped(cwd: string, server: Postmaster): Promise<void> {
  assert.equal(postmaster(cwd), undefined, 'postmaster.pid removed');
  assert.equal(processAlive(server.pid), false, 'the postmaster exited');
  assert.equal(await probePort(server.port), 'ECONNREFUSED');
}

test('the embedded server outlives the command that started it (SIGINT) and stops when the last command leaves', async (t) => {
  const cwd = await privateDir(t);
  await migrated(cwd);
  const { tail, server, observer } = await startTail(t, cwd);
  const serve = await startServe(t, cwd);
  assert.equal(postmaster(cwd)?.pid, server.pid, 'serve attached to the server tail started');

  // The starter leaves first, on Ctrl-C (SIGINT to its whole process
  // group); serve still uses the server, so it stays up.
  process.kill(-tail.pid!, 'SIGINT');
  assert.equal(await exited(tail), 0);
  assert.ok(processAlive(server.pid), 'the server outlived the command that started it');
  await assertServeDelivers(cwd, serve.address);

  // serve is the last user: on SIGINT it stops the server before it exits.
  await observer.end();
  serve.serve.kill('SIGINT');
  assert.equal(await exited(serve.serve), 0, serve.stderr());
  await assertStopped(cwd, server);
});

test('a starter killed with SIGKILL leaves the server to the commands that attach to it', async (t) => {
  const cwd = await privateDir(t);
  await migrated(cwd);
  const { tail, server, observer } = await startTail(t, cwd);
  const serve = await startServe(t, cwd);

  tail.kill('SIGKILL');
  assert.equal(await exited(tail), 'SIGKILL');
  assert.ok(processAlive(server.pid), 'the server outlived the killed command that started it');
  await assertServeDelivers(cwd, serve.address);

  // Nobody left to stop it: the server keeps running for the next command.
  serve.serve.kill('SIGKILL');
  await exited(serve.serve);
  await until('the killed commands’ connections to end', async () => (await backends(observer, 'tidemark-cli')) + (await backends(observer, 'tidemark-embedded-member')) === 0);
  assert.ok(processAlive(server.pid), 'the server outlived every command');
  await observer.end();

  // The next command attaches to it and, being its only user, stops it.
  const status = await cli(['status'], { cwd });
  assert.equal(status.code, 0, status.stderr);
  await assertStopped(cwd, server);
});

test('a member or another client keeps the server up; a process joining while the last member stops it attaches or starts it again', async (t) => {
  const cwd = await privateDir(t);
  const options = { dataDir: dataDir(cwd) };
  // Two members in one process behave as two processes: each has its own membership connection.
  const first = await attachOrStartEmbeddedPostgres(options);
  const second = await attachOrStartEmbeddedPostgres(options);
  assert.deepEqual([first.attached, second.attached], [false, true]);
  const server = postmaster(cwd)!;
  await first.stop();
  assert.ok(processAlive(server.pid), 'a member still uses it: the starter leaving does not stop it');
  // Another client (psql, say) keeps it up too, though no member is left.
  const other = await observe(t, server.port);
  await second.stop();
  assert.ok(processAlive(server.pid), 'a client is connected: the last member leaving does not stop it');
  await other.end();
  const third = await attachOrStartEmbeddedPostgres(options);
  assert.equal(third.attached, true);
  await third.stop();
  await assertStopped(cwd, server);

  // Leave and join at once, a few times: whichever way the race goes, the
  // joiner ends up with a server that answers, never with an error.
  for (let round = 0; round < 3; round++) {
    const leaver = await attachOrStartEmbeddedPostgres(options);
    const [, joiner] = await Promise.all([leaver.stop(), attachOrStartEmbeddedPostgres(options)]);
    const client = new pg.Client({ connectionString: joiner.url });
    await client.connect();
    const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await client.end();
    const running = postmaster(cwd)!;
    await joiner.stop({ ownBackends: [pid] });
    await assertStopped(cwd, running);
  }
});
