import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { cliBin } from '../support/cli.js';
import { closeAdmin, insertEvent, safeSeq, testDb } from '../support/db.js';

after(closeAdmin);

const run = promisify(execFile);

async function tidemark(args: string[], env: NodeJS.ProcessEnv = {}, cwd?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const { DATABASE_URL: _ignored, ...base } = process.env;
  try {
    const { stdout, stderr } = await run(process.execPath, [cliBin, ...args], { env: { ...base, ...env }, cwd });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

test('tidemark migrate is idempotent and watermark --once --json publishes', async (t) => {
  const db = await testDb(t);
  const first = await tidemark(['migrate', '--schema', 'cli_tm', '--database-url', db.url]);
  assert.equal(first.code, 0, first.stderr);
  assert.match(first.stdout, /^applied 0001_init\.sql\napplied 0002_roles\.sql$/m);
  const second = await tidemark(['migrate', '--schema', 'cli_tm'], { DATABASE_URL: db.url });
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stdout, /schema cli_tm is up to date/);

  await insertEvent(db.observer, 's', 'cli_tm');
  const step = await tidemark(['watermark', '--once', '--json', '--schema', 'cli_tm'], { DATABASE_URL: db.url });
  assert.equal(step.code, 0, step.stderr);
  const progress = JSON.parse(step.stdout);
  assert.equal(progress.outcome, 'advanced');
  assert.equal(progress.safeSeq, '1');
  assert.match(step.stdout, /"stepMs":\d+(\.\d{1,3})?[,}]/, 'stepMs to the microsecond, without float noise');
  assert.equal(await safeSeq(db.observer, 'cli_tm'), 1n);
  const lease = await db.observer.query('SELECT lease_owner FROM cli_tm.watermark');
  assert.equal(lease.rows[0].lease_owner, null, 'the one-shot step released its lease');
});

test('bad configuration exits 2 with one clear line and writes nothing', async (t) => {
  const db = await testDb(t);
  const cases: [string[], RegExp][] = [
    [['migrate', '--schema', 'Bad-Schema', '--database-url', db.url], /--schema: expected a lower-case SQL identifier/],
    [['migrate', '--database-url', 'mysql://x'], /--database-url: expected a postgres/],
    [['frobnicate', '--database-url', db.url], /unknown command 'frobnicate'/],
    [['watermark', '--database-url', db.url], /pass --once/],
    [['migrate', '--bogus'], /unknown option '--bogus'/],
    [['serve', '--roles', 'watermarker,janitor', '--database-url', db.url], /--roles: unknown role "janitor"/],
    [['serve', '--lease-ttl', '10 parsecs', '--database-url', db.url], /--lease-ttl: expected a duration/],
    [['serve', '--lease-ttl', '10s', '--lease-renew', '5s', '--database-url', db.url], /--lease-renew: must be below half/],
    [['serve', '--http', 'nowhere', '--database-url', db.url], /--http: expected HOST:PORT/],
    [['prune', '--once', '--retention', '5m', '--database-url', db.url], /--retention: .*below the floor/],
    [['tail', '--consumer', 'c', '--database-url', db.url], /required option '--stream/],
    [['append', '--stream', 's', '--database-url', db.url], /--kind is required/],
    [['append', '--stream', 's', '--kind', 'k', '--key', 'x', '--payload', '[1]', '--database-url', db.url], /--payload: expected a JSON object/],
  ];
  for (const [args, message] of cases) {
    const r = await tidemark(args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, message);
    assert.equal(r.stderr.trim().split('\n').length, 1);
  }
  const schemas = await db.observer.query(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname ILIKE 'bad%'`);
  assert.equal(schemas.rows[0].n, 0);
  const events = await db.observer.query(`SELECT count(*)::int AS n FROM tidemark.events`);
  assert.equal(events.rows[0].n, 0, 'nothing was written');
});

test('without a database URL the CLI starts an embedded PostgreSQL under ./.tidemark and reuses it', async (t) => {
  const cwd = await mkdtemp(join(tmpdir(), 'tidemark-cli-'));
  await chmod(cwd, 0o755); // reachable by the server's user, so the data dir stays inside cwd
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const first = await tidemark(['migrate'], {}, cwd);
  assert.equal(first.code, 0, first.stderr);
  assert.match(first.stdout, /applied 0001_init\.sql/);
  const second = await tidemark(['migrate'], {}, cwd);
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stdout, /up to date/, 'the data directory was kept and reused');
  assert.ok(existsSync(join(cwd, '.tidemark', 'pg', 'PG_VERSION')));
});

