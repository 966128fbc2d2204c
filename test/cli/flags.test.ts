/**
 * Flag messages speak the user's terms: the flag as typed, the value as
 * given (cut to 80 characters), durations with their units, never a
 * library option name or a count of milliseconds. Each check runs before
 * anything connects (the URL points where nothing listens).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { freePort } from '../../src/db/embedded.js';
import { cli as tidemark } from '../support/cli.js';

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

