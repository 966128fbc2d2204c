import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { freePort } from '../../src/db/embedded.js';
import { closeAdmin, insertEvent, safeSeq, testDb } from '../support/db.js';

after(closeAdmin);

const main = new URL('../../src/cli/main.ts', import.meta.url).pathname;
const run = promisify(execFile);

async function tidemark(args: string[], env: NodeJS.ProcessEnv = {}, cwd?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const { DATABASE_URL: _ignored, ...base } = process.env;
  try {
    const { stdout, stderr } = await run(process.execPath, ['--import', import.meta.resolve('tsx'), main, ...args], { env: { ...base, ...env }, cwd });
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

/** A URL where nothing listens: a check that should fail before connecting cannot pass by connecting. */
async function nowhere(): Promise<string> {
  return `postgres://postgres@127.0.0.1:${await freePort()}/app`;
}

test('option messages name the flag once: --owner, not ----owner', async () => {
  const r = await tidemark(['serve', '--owner', '', '--database-url', await nowhere()]);
  assert.equal(r.code, 2, r.stderr);
  assert.equal(r.stderr, 'tidemark: --owner: expected a non-empty string of at most 200 characters without NUL, got ""\n');
});

test('duration messages speak the flag and the value as given, not milliseconds', async () => {
  const url = await nowhere();
  const cases: [string[], string][] = [
    [['tail', '--consumer', 'c', '--stream', 's', '--poll', '0s'], '--poll: must be at least 1ms, got "0s"'],
    [['tail', '--consumer', 'c', '--stream', 's', '--poll', '2h'], '--poll: must be at most 1h, got "2h"'],
    [['serve', '--lease-ttl', '10s', '--lease-renew', '5s'], '--lease-renew: must be below half of --lease-ttl "10s", got "5s"'],
    [['serve', '--lease-ttl', '10ms'], '--lease-ttl: must be at least 20ms, got "10ms"'],
    [['serve', '--retention', '5m'], '--retention: "5m" is below the floor of 1h; pass --allow-short-retention to accept a shorter retention'],
    [['prune', '--once', '--retention', '30m'], '--retention: "30m" is below the floor of 1h; pass --allow-short-retention to accept a shorter retention'],
    [['serve', '--prune-interval', '2d'], '--prune-interval: must be at most 1d, got "2d"'],
  ];
  const results = await Promise.all(cases.map(([args]) => tidemark([...args, '--database-url', url])));
  for (const [i, [args, message]] of cases.entries()) {
    const r = results[i]!;
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.equal(r.stderr, `tidemark: ${message}\n`);
    assert.doesNotMatch(r.stderr, /\d{4,}|Ms\b/, 'no milliseconds, no library option names');
  }
});

test('a bare number is not a duration: the message and every help with durations say so', async () => {
  const r = await tidemark(['tail', '--consumer', 'c', '--stream', 's', '--poll', '5', '--database-url', await nowhere()]);
  assert.equal(r.code, 2);
  assert.equal(r.stderr, 'tidemark: --poll: "5" has no unit; write 5ms or 5s (units: ms, s, m, h, d)\n');
  const commands = ['serve', 'tail', 'prune', 'demo'];
  const helps = await Promise.all(commands.map((command) => tidemark([command, '--help'])));
  for (const [i, command] of commands.entries()) {
    const help = helps[i]!;
    assert.equal(help.code, 0);
    assert.match(help.stdout, /A <duration> is a number and its unit: 500ms, 10s, 1\.5m, 2h, 7d\. A bare number \(other than 0\) is refused\./, command);
  }
});

test('values echoed in messages are cut to 80 characters', async () => {
  const url = await nowhere();
  const long = 'x'.repeat(20_000);
  const cases: string[][] = [
    ['tail', '--consumer', long, '--stream', 's'],
    ['serve', '--owner', long],
    ['serve', '--lease-ttl', long],
    ['serve', '--roles', long],
    ['tail', '--consumer', 'c', '--stream', 's', '--batch', long],
    ['migrate', '--schema', long],
  ];
  const results = await Promise.all(cases.map((args) => tidemark([...args, '--database-url', url])));
  for (const [i, args] of cases.entries()) {
    const r = results[i]!;
    const what = args.slice(0, 2).join(' ');
    assert.equal(r.code, 2, `${what}: ${r.stderr.slice(0, 300)}`);
    assert.equal(r.stderr.trim().split('\n').length, 1, what);
    assert.ok(r.stderr.length < 300, `${what}: ${r.stderr.length} characters`);
    assert.match(r.stderr, /"x{80}…"/, what);
  }
});

test('--version prints the version of package.json', async () => {
  const { version } = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  for (const r of await Promise.all(['--version', '-V'].map((flag) => tidemark([flag])))) {
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${version}\n`);
  }
});

test('every command\'s --help lists the global options', async () => {
  const commands = ['migrate', 'serve', 'append', 'watermark', 'tail', 'prune', 'status', 'demo', 'bench'];
  const helps = await Promise.all(commands.map((command) => tidemark([command, '--help'])));
  for (const [i, command] of commands.entries()) {
    const r = helps[i]!;
    assert.equal(r.code, 0, r.stderr);
    for (const flag of ['--database-url <url>', '--schema <name>', '--ephemeral', '--verbose']) assert.ok(r.stdout.includes(flag), `${command} --help shows ${flag}`);
  }
});
