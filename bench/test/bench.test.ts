import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { closeAdmin, testDb } from '../../test/support/db.js';
import { check, installChecker } from '../src/checker.js';
import type { BenchReport } from '../src/report.js';

const adminUrl = process.env.TIDEMARK_TEST_ADMIN_URL!;
const root = new URL('../../', import.meta.url).pathname;

/**
 * Runs the bench as `npm run bench -- ...args` does once it has built the
 * library (test/support/run.ts built it before any test started).
 */
function bench(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'bench/src/cli.ts', ...args], { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

after(closeAdmin);

test('the gap checker counts each kind of defect, and nothing in a clean delivery', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  await installChecker(pool);
  // Committed: 1..6; entity a wrote 1, 3, 5 and entity b 2, 4, 6, in that order.
  await pool.query(`INSERT INTO bench_committed SELECT i, CASE WHEN i % 2 = 1 THEN 'a' ELSE 'b' END FROM generate_series(1, 6) i`);
  // Clean: every event once, each entity's in order (entities interleave freely).
  await pool.query(`INSERT INTO bench_deliveries (consumer, event_id, key) VALUES ('clean', 2, 'b'), ('clean', 1, 'a'), ('clean', 3, 'a'), ('clean', 4, 'b'), ('clean', 6, 'b'), ('clean', 5, 'a')`);
  assert.deepEqual(await check(pool, 'clean'), { committed: 6, delivered: 6, missing: 0, duplicated: 0, outOfOrder: 0, unexpected: 0 });
  // Faulty: 4 never arrives, 1 arrives twice, a's 3 after its 5, and 9 never committed.
  await pool.query(`INSERT INTO bench_deliveries (consumer, event_id, key) VALUES ('faulty', 1, 'a'), ('faulty', 2, 'b'), ('faulty', 5, 'a'), ('faulty', 3, 'a'), ('faulty', 1, 'a'), ('faulty', 6, 'b'), ('faulty', 9, 'a')`);
  assert.deepEqual(await check(pool, 'faulty'), { committed: 6, delivered: 6, missing: 1, duplicated: 1, outOfOrder: 1, unexpected: 1 });
});

test('npm run bench -- --quick: every scenario runs every contender, and tidemark shows no defect under gap torture', { timeout: 600_000 }, async (t) => {
  const out = await mkdtemp(join(tmpdir(), 'tidemark-bench-'));
  t.after(() => rm(out, { recursive: true, force: true }));
  const r = await bench(['--quick', '--out', out, '--no-progress'], { DATABASE_URL: adminUrl });
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const files = (await readdir(out)).sort();
  assert.equal(files.length, 2, files.join(', '));
  assert.match(files[0]!, /^\d{4}-\d{2}-\d{2}-quick\.json$/);
  const report = JSON.parse(await readFile(join(out, files[0]!), 'utf8')) as BenchReport;
  const markdown = await readFile(join(out, files[1]!), 'utf8');

  // Every contender installed and ran: a broken adapter says so in the report, and fails here.
  assert.deepEqual(
    report.contenders.filter((c) => c.unavailable).map((c) => `${c.id}: ${c.unavailable}`),
    [],
  );
  assert.equal(report.contenders.length, 8);
  assert.deepEqual(
    report.scenarios.map((s) => s.id),
    ['gap-torture', 'stall', 'append-cost', 'writer-latency', 'e2e-latency', 'drain', 'relay', 'groups', 'redis-relay', 'webhook-relay'],
  );
  for (const s of report.scenarios) assert.ok(s.rows.length > 0, s.id);

  // Gap torture: one row per contender; tidemark's defect columns are all zero.
  const gap = report.scenarios[0]!;
  assert.equal(gap.rows.length, 8);
  const col = (name: string) => gap.columns.indexOf(name);
  const tidemark = gap.rows.find((row) => row[0] === 'tidemark')!;
  assert.ok((tidemark[col('committed')] as number) > 0);
  assert.equal(tidemark[col('delivered')], tidemark[col('committed')]);
  for (const defect of ['missing', 'duplicated', 'out of order', 'unexpected']) assert.equal(tidemark[col(defect)], 0, defect);
  assert.equal(tidemark[col('drained')], 'yes');
  // Whether a faulty baseline lost an event in this short run is a race; that
  // the checker sees each kind of defect is tested below, deterministically.

  // End to end: tidemark's closed-loop row with its commit→safe_seq goal, and the
  // physical-limit row, logical decoding on a server of its own, every event streamed.
  const e2e = report.scenarios.find((s) => s.id === 'e2e-latency')!;
  assert.ok(e2e.rows.some((row) => row[0] === 'tidemark' && row[1] === 'closed loop, 8 writers'));
  assert.ok(e2e.goals.some((g) => g.goal.includes('commit→safe_seq') && /ms/.test(g.measured)));
  const logical = e2e.rows.filter((row) => String(row[0]).startsWith('physical limit: logical decoding'));
  assert.equal(logical.length, 1, JSON.stringify(e2e.notes));
  assert.ok((logical[0]![e2e.columns.indexOf('achieved events/s')] as number) > 0);
  assert.equal(logical[0]![e2e.columns.indexOf('undelivered')], 0);
  // Delivery CPU for every contender's rate rows (this machine has /proc), and the watermarker's own share.
  const cpu = e2e.columns.indexOf('delivery CPU %');
  for (const row of e2e.rows.filter((x) => !String(x[0]).startsWith('physical limit'))) {
    assert.ok(typeof row[cpu] === 'number' && row[cpu] > 0, JSON.stringify(row));
  }
  assert.ok(e2e.notes.some((n) => /watermarker backends .*% at 1,000 events\/s/.test(n)), JSON.stringify(e2e.notes));

  // Stall: the steady phase starts after every contender delivered its warm-up event.
  const stall = report.scenarios.find((s) => s.id === 'stall')!;
  assert.match(stall.method, /warm-up event/);
  assert.deepEqual(stall.notes.filter((n) => n.startsWith('Not warmed up')), []);

  // Goals are listed with a figure each, in the JSON, the markdown and the printed summary.
  const goals = report.scenarios.flatMap((s) => s.goals);
  assert.ok(goals.length >= 10, String(goals.length));
  for (const g of goals) assert.ok(g.measured.length > 0, g.goal);
  assert.match(markdown, /^## Goals$/m);
  assert.match(r.stdout, /^## Goals$/m);
  assert.match(r.stdout, /Results: .*quick\.json/);
});

test('bench refuses an unknown scenario or contender, or an unwritable --out, before it connects, and writes nothing', async (t) => {
  const out = await mkdtemp(join(tmpdir(), 'tidemark-bench-'));
  t.after(() => rm(out, { recursive: true, force: true }));
  for (const args of [['--only', 'gap-torture,nope'], ['--contenders', 'tidemark,kafka'], ['--only', '']]) {
    const r = await bench(['--quick', '--out', out, ...args], { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /^bench: --(only|contenders): /m);
  }
  assert.deepEqual(await readdir(out), []);
  const r = await bench(['--quick', '--out', '/dev/null/results'], { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /^bench: --out: cannot write results to "\/dev\/null\/results"/m);
});
