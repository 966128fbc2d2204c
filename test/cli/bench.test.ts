import assert from 'node:assert/strict';
import { test } from 'node:test';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cli } from '../support/cli.js';
import type { BenchReport } from '../../src/bench/report.js';

const adminUrl = process.env.TIDEMARK_TEST_ADMIN_URL!;

test('bench --quick: every scenario runs every contender, and tidemark shows no defect under gap torture', { timeout: 600_000 }, async (t) => {
  const out = await mkdtemp(join(tmpdir(), 'tidemark-bench-'));
  t.after(() => rm(out, { recursive: true, force: true }));
  const r = await cli(['bench', '--quick', '--out', out, '--no-progress'], { env: { DATABASE_URL: adminUrl } });
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
    ['gap-torture', 'stall', 'append-cost', 'writer-latency', 'e2e-latency', 'drain', 'relay'],
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
  // The naive baseline is there to lose events; the checker must be able to see that at all.
  assert.ok(gap.rows.some((row) => (row[col('missing')] as number) > 0 || (row[col('duplicated')] as number) > 0), 'no contender showed any defect');

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
    const r = await cli(['bench', '--quick', '--out', out, ...args], { env: { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' } });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /^tidemark: --(only|contenders): /m);
  }
  assert.deepEqual(await readdir(out), []);
  const r = await cli(['bench', '--quick', '--out', '/dev/null/results'], { env: { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' } });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /^tidemark: --out: cannot write results to "\/dev\/null\/results"/m);
});
