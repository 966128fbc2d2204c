/**
 * Flag messages speak the user's terms: the flag as typed, the value as
 * given (cut to 80 characters), durations with their units, never a
 * library option name or a count of milliseconds. The rules are checked
 * in-process, case by case; a few spawned commands show the same lines end
 * to end, before anything connects (the URL points where nothing listens).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CliError } from '../../src/cli/cli-error.js';
import { configured, positiveInt } from '../../src/cli/context.js';
import { formatDuration, parseDuration } from '../../src/cli/duration.js';
import { explain } from '../../src/cli/explain.js';
import { checkFlags } from '../../src/cli/flags.js';
import { freePort } from '../../src/db/embedded.js';
import { nameOption, ownerOption } from '../../src/options.js';
import { resolvePrunerOptions } from '../../src/retention/options.js';
import { resolveWatermarkerOptions } from '../../src/watermark/options.js';
import { cli } from '../support/cli.js';

/** The one line `run` fails with, as the CLI prints it (without `tidemark: `). */
function failure(run: () => unknown): string {
  try {
    run();
  } catch (err) {
    assert.ok(err instanceof CliError || (err instanceof Error && 'code' in err), `a CliError or a TidemarkError, got ${String(err)}`);
    return explain(err).message;
  }
  return assert.fail('expected a failure');
}

test('option messages name the flag once: --owner, not ----owner', async () => {
  assert.equal(
    failure(() => configured(() => resolveWatermarkerOptions({ owner: '' }))),
    '--owner: expected a non-empty string of at most 200 characters without NUL, got ""',
  );
  assert.equal(failure(() => configured(() => resolvePrunerOptions({ owner: '' }))), failure(() => configured(() => ownerOption(''))));
  // A name inside the quoted value is the user's, left as typed.
  assert.match(failure(() => configured(() => nameOption('', 'owner'))), /^--owner: /);
  const r = await cli(['serve', '--owner', '', '--database-url', `postgres://postgres@127.0.0.1:${await freePort()}/app`]);
  assert.equal(r.code, 2, r.stderr);
  assert.equal(r.stderr, 'tidemark: --owner: expected a non-empty string of at most 200 characters without NUL, got ""\n');
});

test('duration messages speak the flag and the value as given, not milliseconds', async () => {
  const cases: [Record<string, unknown>, string][] = [
    [{ poll: '0s' }, '--poll: must be at least 1ms, got "0s"'],
    [{ poll: '2h' }, '--poll: must be at most 1h, got "2h"'],
    [{ leaseTtl: '10s', leaseRenew: '5s' }, '--lease-renew: must be below half of --lease-ttl "10s", got "5s"'],
    [{ leaseTtl: '10ms' }, '--lease-ttl: must be at least 20ms, got "10ms"'],
    [{ leaseTtl: '2d' }, '--lease-ttl: must be at most 1d, got "2d"'],
    [{ retention: '5m' }, '--retention: "5m" is below the floor of 1h; pass --allow-short-retention to accept a shorter retention'],
    [{ pruneInterval: '0.4ms' }, '--prune-interval: must be at least 1ms, got "0.4ms"'],
    [{ pruneInterval: '2d' }, '--prune-interval: must be at most 1d, got "2d"'],
    [{ shutdownTimeout: 'soon' }, '--shutdown-timeout: expected a duration, a number and its unit (ms, s, m, h or d): 500ms, 10s, 1.5m, 2h, 7d; got "soon"'],
  ];
  for (const [options, message] of cases) {
    assert.equal(failure(() => checkFlags(options)), message, JSON.stringify(options));
    assert.doesNotMatch(message, /\d{4,}|Ms\b/, 'no milliseconds, no library option names');
  }
  // What the rules accept, the library accepts too.
  checkFlags({ leaseTtl: '10s', leaseRenew: '3s', retention: '30m', allowShortRetention: true, poll: '1ms', pruneInterval: '1d' });
  assert.deepEqual([parseDuration('1.5m', '--poll'), parseDuration('0', '--retention'), parseDuration(' 7d ', '--retention')], [90_000, 0, 604_800_000]);
  assert.deepEqual([1, 1500, 10_000, 3_600_000, 86_400_000, 0].map(formatDuration), ['1ms', '1500ms', '10s', '1h', '1d', '0s']);

  const r = await cli(['tail', '--consumer', 'c', '--stream', 's', '--poll', '0s', '--database-url', `postgres://postgres@127.0.0.1:${await freePort()}/app`]);
  assert.equal(r.code, 2, r.stderr);
  assert.equal(r.stderr, 'tidemark: --poll: must be at least 1ms, got "0s"\n');
});

test('--max-steps-per-second takes a positive integer up to the library bound, refused in the flag\'s terms before connecting', async () => {
  const url = `postgres://postgres@127.0.0.1:${await freePort()}/app`;
  for (const [value, message] of [
    ['0', 'tidemark: --max-steps-per-second: expected a positive integer, got "0"\n'],
    ['1e3', 'tidemark: --max-steps-per-second: expected a positive integer, got "1e3"\n'],
    ['200000', 'tidemark: --max-steps-per-second: expected an integer between 1 and 100000, got 200000\n'],
  ]) {
    const r = await cli(['serve', '--roles', 'watermarker', '--max-steps-per-second', value!, '--database-url', url]);
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stderr, message);
  }
});

test('a bare number is not a duration: it could be milliseconds or seconds', async () => {
  assert.equal(failure(() => parseDuration('5', '--poll')), '--poll: "5" has no unit; write 5ms or 5s (units: ms, s, m, h, d)');
  assert.equal(failure(() => parseDuration('2.5', '--lease-ttl')), '--lease-ttl: "2.5" has no unit; write 2.5ms or 2.5s (units: ms, s, m, h, d)');
  const r = await cli(['serve', '--lease-ttl', '30', '--database-url', `postgres://postgres@127.0.0.1:${await freePort()}/app`]);
  assert.equal(r.code, 2);
  assert.equal(r.stderr, 'tidemark: --lease-ttl: "30" has no unit; write 30ms or 30s (units: ms, s, m, h, d)\n');
});

test('values echoed in messages are cut to 80 characters', async () => {
  const long = 'x'.repeat(20_000);
  const messages = [
    failure(() => parseDuration(long, '--lease-ttl')),
    failure(() => positiveInt(long, '--batch')),
    failure(() => configured(() => nameOption(long, 'consumer'))),
    failure(() => configured(() => resolveWatermarkerOptions({ owner: long }))),
    // Messages of other code (serve's --roles, the schema check) are cut by explain's net.
    failure(() => {
      throw new CliError(`--roles: unknown role ${JSON.stringify(long)}; expected some of watermarker, pruner`);
    }),
  ];
  for (const message of messages) {
    assert.ok(message.length < 250, `${message.slice(0, 40)}: ${message.length} characters`);
    assert.match(message, /"x{80}…"/);
  }
  const url = `postgres://postgres@127.0.0.1:${await freePort()}/app`;
  const spawned = await Promise.all([
    cli(['tail', '--consumer', long, '--stream', 's', '--database-url', url]),
    cli(['migrate', '--schema', long, '--database-url', url]),
  ]);
  for (const r of spawned) {
    assert.equal(r.code, 2, r.stderr.slice(0, 300));
    assert.equal(r.stderr.trim().split('\n').length, 1);
    assert.ok(r.stderr.length < 300, `${r.stderr.length} characters`);
    assert.match(r.stderr, /"x{80}…"/);
  }
});
