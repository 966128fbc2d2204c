/**
 * Every failure a person can act on is one line on stderr, naming the
 * problem and what to do, with the documented exit code and no stack
 * (docs/ERRORS.md, "Command line"). The commands are real processes,
 * pointed at a port where nothing listens, a host that does not resolve, a
 * database that does not exist, a schema never migrated, a wrong password.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { freePort } from '../../src/db/embedded.js';
import { cli, type CliResult } from '../support/cli.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

/** Exit codes of docs/ERRORS.md. */
const USAGE = 2;
const DATABASE = 4;

function withUrl(url: string, change: (u: URL) => void): string {
  const u = new URL(url);
  change(u);
  return u.toString();
}

/** One line on stderr, matching `pattern`, no stack frame, and `code`. */
function assertOneLine(r: CliResult, code: number, pattern: RegExp, what: string): void {
  const lines = r.stderr.trimEnd().split('\n');
  assert.equal(lines.length, 1, `${what}: exactly one line on stderr, got:\n${r.stderr}`);
  assert.match(lines[0]!, /^tidemark: /, what);
  assert.match(lines[0]!, pattern, what);
  assert.doesNotMatch(r.stderr, / {4}at /, `${what}: no stack trace`);
  assert.equal(r.code, code, `${what}: exit code (stderr: ${r.stderr})`);
}

/** Every command that connects once and ends: each must say the same one line. */
const COMMANDS: string[][] = [
  ['status'],
  ['migrate'],
  ['watermark', '--once'],
  ['prune', '--once'],
  ['tail', '--consumer', 'c', '--stream', 's', '--once'],
  ['append', '--stream', 's', '--kind', 'k', '--key', 'x'],
];

test('a refused port: one line from every command, exit 4, no stack', async () => {
  const port = await freePort(); // free a moment ago: nothing listens on it
  const url = `postgres://postgres:secret-password@127.0.0.1:${port}/app`;
  const results = await Promise.all(COMMANDS.map((args) => cli([...args, '--database-url', url])));
  results.forEach((r, i) => {
    const what = COMMANDS[i]!.join(' ');
    assertOneLine(r, DATABASE, new RegExp(`cannot connect to 127\\.0\\.0\\.1:${port}: connection refused; is PostgreSQL running`), what);
    assert.doesNotMatch(r.stderr, /secret-password/, `${what}: the password is never printed`);
  });
});

test('a refused port on localhost (both addresses tried) is the same one line', async () => {
  const port = await freePort();
  const r = await cli(['status', '--database-url', `postgres://postgres@localhost:${port}/app`]);
  assertOneLine(r, DATABASE, new RegExp(`cannot connect to localhost:${port}: connection refused`), 'localhost');
});

test('a host name that does not resolve: one line, exit 4', async () => {
  const r = await cli(['status', '--database-url', 'postgres://postgres@nosuchhost.invalid:5432/app']);
  assertOneLine(r, DATABASE, /cannot resolve the database host "nosuchhost\.invalid": no such host; check the host name in --database-url/, 'ENOTFOUND');
});

test('a missing database, a wrong password and an unmigrated schema: one line each', async (t) => {
  const db = await testDb(t);
  const missing = await cli(['status', '--database-url', withUrl(db.url, (u) => (u.pathname = '/no_such_database_here'))]);
  assertOneLine(missing, DATABASE, /database "no_such_database_here" does not exist on .*; create it/, 'missing database');

  const unmigrated = await cli(['status', '--schema', 'some_unmigrated_schema', '--database-url', db.url]);
  assertOneLine(unmigrated, USAGE, /schema "some_unmigrated_schema" in .* is not migrated .*run `tidemark migrate --schema some_unmigrated_schema`/, 'unmigrated');
  const tail = await cli(['tail', '--consumer', 'c', '--stream', 's', '--once', '--schema', 'some_unmigrated_schema', '--database-url', db.url]);
  assertOneLine(tail, USAGE, /is not migrated/, 'unmigrated tail');

  const wrong = withUrl(db.url, (u) => (u.password = 'not-the-password'));
  const probe = new pg.Client({ connectionString: wrong });
  const accepted = await probe.connect().then(
    () => true,
    () => false,
  );
  await probe.end().catch(() => undefined);
  if (accepted) {
    t.skip('this server accepts any password (trust authentication): a wrong password cannot be tested here');
    return;
  }
  const denied = await cli(['status', '--database-url', wrong]);
  assertOneLine(denied, DATABASE, /password authentication failed for user "\w+" at .*; check the password/, 'wrong password');
  assert.doesNotMatch(denied.stderr, /not-the-password/);
});

test('--verbose prints the stack after the one line', async () => {
  const port = await freePort();
  const r = await cli(['status', '--verbose', '--database-url', `postgres://postgres@127.0.0.1:${port}/app`]);
  assert.equal(r.code, DATABASE);
  const [first, ...rest] = r.stderr.trimEnd().split('\n');
  assert.match(first!, /^tidemark: cannot connect to .*connection refused/);
  assert.match(rest.join('\n'), /ECONNREFUSED/);
  assert.match(rest.join('\n'), / {4}at /);
});

test('an invalid event exits 2 with one line, from flags or from NDJSON', async (t) => {
  const db = await testDb(t);
  const fromFlags = await cli(['append', '--stream', 's', '--kind', 'k', '--key', '', '--database-url', db.url]);
  assertOneLine(fromFlags, USAGE, /--key: must be a non-empty string/, 'invalid event from flags');
  const fromNdjson = await cli(['append', '--ndjson', '--database-url', db.url], { input: '{"stream":"s","kind":"k"}\n' });
  assertOneLine(fromNdjson, USAGE, /line 1: key: must be a non-empty string/, 'invalid event from NDJSON');
});

test('serve --http on an address that cannot be bound: one line, exit 2', async (t) => {
  const db = await testDb(t);
  const r = await cli(['serve', '--roles', 'pruner', '--http', '1.2.3.4:9464', '--database-url', db.url]);
  assertOneLine(r, USAGE, /--http: cannot listen on 1\.2\.3\.4:9464: /, 'unbindable --http');
});
