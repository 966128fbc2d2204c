import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { closeAdmin, testDb } from '../support/db.js';
import { setTimeout as delay } from 'node:timers/promises';
import { cli, exited, startCli } from '../support/cli.js';

after(closeAdmin);

test('demo runs writers with gaps and rollbacks, a watermarker and a consumer, and ends with a zero-defect verdict', async (t) => {
  const db = await testDb(t);
  const r = await cli(['demo', '--duration', '3s', '--writers', '4'], { env: { DATABASE_URL: db.url } });
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const figure = (name: string) => Number(new RegExp(`^${name} +(\\d+)`, 'm').exec(r.stdout)?.[1]);
  assert.ok(figure('committed') > 0, r.stdout);
  assert.equal(figure('delivered'), figure('committed'));
  for (const defect of ['duplicates', 'out of order', 'missing', 'unexpected']) assert.equal(figure(defect), 0, defect);
  assert.match(r.stdout, /^verdict: PASS/m);
  // What the demo reports is what the database holds.
  const count = await db.observer.query(`SELECT count(*)::int AS n FROM tidemark_demo.events`);
  assert.equal(count.rows[0].n, figure('committed'));
  const cursor = await db.observer.query(`SELECT seq FROM tidemark_demo.cursors WHERE consumer = 'demo-consumer'`);
  assert.equal(cursor.rows[0].seq, (await db.observer.query(`SELECT max(seq) AS m FROM tidemark_demo.events`)).rows[0].m);
});

test('the quick start: `tidemark demo` in a fresh directory starts its own PostgreSQL and passes', async (t) => {
  const cwd = await mkdtemp(join(tmpdir(), 'tidemark-demo-'));
  await chmod(cwd, 0o755); // reachable by the server's user when run as root
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const r = await cli(['demo', '--duration', '2s'], { cwd });
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /^tidemark demo: embedded PostgreSQL, schema tidemark_demo/m);
  assert.match(r.stdout, /^verdict: PASS/m);
});

test('demo with more writers than the server has connections refuses up front in one line naming max_connections, and exits 2', async (t) => {
  const db = await testDb(t);
  const child = startCli(['demo', '--duration', '30s', '--writers', '1000'], { env: { DATABASE_URL: db.url } });
  db.defer(() => child.kill('SIGKILL'));
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  // Before the check, a demo like this sat at safe_seq 0 until killed.
  const code = await Promise.race([exited(child), delay(60_000, 'still running after 60 s', { ref: false })]);
  assert.equal(code, 2, stdout + stderr);
  assert.equal(stdout, '');
  assert.match(
    stderr,
    /^tidemark: --writers 1000: the demo needs 1006 connections \(one per writer and 6 more\), but the server has \d+ free \(max_connections \d+, \d+ reserved, \d+ in use\); use --writers \d+ or fewer, or raise max_connections\n$/,
  );
  const schema = await db.observer.query(`SELECT 1 FROM pg_namespace WHERE nspname = 'tidemark_demo'`);
  assert.equal(schema.rowCount, 0, 'nothing was created');
});
