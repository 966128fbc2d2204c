/**
 * Every failure a person can act on is one line on stderr, naming the
 * problem and what to do, with the documented exit code and no stack
 * (docs/ERRORS.md, "Command line"). The commands are real processes,
 * pointed at a port where nothing listens and a host that does not
 * resolve; failures-db.test.ts has what a reachable server refuses.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { freePort } from '../../src/db/embedded.js';
import { cli } from '../support/cli.js';
import { assertOneLine, DATABASE } from './one-line.js';

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

test('--verbose prints the stack after the one line', async () => {
  const port = await freePort();
  const r = await cli(['status', '--verbose', '--database-url', `postgres://postgres@127.0.0.1:${port}/app`]);
  assert.equal(r.code, DATABASE);
  const [first, ...rest] = r.stderr.trimEnd().split('\n');
  assert.match(first!, /^tidemark: cannot connect to .*connection refused/);
  assert.match(rest.join('\n'), /ECONNREFUSED/);
  assert.match(rest.join('\n'), / {4}at /);
});
