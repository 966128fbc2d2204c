/**
 * append, then tail: the events come out in order and once, the durable
 * cursor moves past them, follow mode ends on SIGTERM or --limit, and a
 * reader that stops early (| head) ends it with exit 0. (Split from
 * commands.test.ts so each file stays within the runner's per-file budget.)
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';

after(closeAdmin);

test('append then tail --once --json returns exactly the events, in order, once', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const one = await cli(['append', '--stream', 'orders', '--kind', 'order.placed', '--key', 'o-1', '--payload', '{"total":42}', '--headers', '{"trace":"t"}'], { env });
  assert.equal(one.code, 0, one.stderr);
  assert.equal(one.stdout, '1\n');
  const ndjson = ['{"stream":"orders","kind":"k","key":"a"}', '', '{"stream":"other","kind":"k","key":"b"}', '{"stream":"orders","kind":"k","key":"c","payload":{"x":1}}'].join('\n');
  const many = await cli(['append', '--ndjson', '--batch', '2'], { env, input: ndjson });
  assert.equal(many.code, 0, many.stderr);
  assert.equal(many.stdout, '2\n3\n4\n');
  assert.equal((await cli(['watermark', '--once'], { env })).code, 0);

  const tail = await cli(['tail', '--consumer', 'audit', '--stream', 'orders', '--once', '--json'], { env });
  assert.equal(tail.code, 0, tail.stderr);
  const events = tail.stdout.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(
    events.map((e) => [e.seq, e.kind, e.key, e.payload, e.headers]),
    [
      ['1', 'order.placed', 'o-1', { total: 42 }, { trace: 't' }],
      ['2', 'k', 'a', {}, {}],
      ['4', 'k', 'c', { x: 1 }, {}],
    ],
  );
  const again = await cli(['tail', '--consumer', 'audit', '--stream', 'orders', '--once', '--json'], { env });
  assert.equal(again.stdout, '', 'the durable cursor moved past them');

  const limited = await cli(['tail', '--consumer', 'other-reader', '--stream', 'orders', '--once', '--limit', '2'], { env });
  assert.equal(limited.stdout, '1\torder.placed\to-1\t{"total": 42}\n2\tk\ta\t{}\n');

  // A bad line in --ndjson stops before its batch; nothing of it is written.
  const bad = await cli(['append', '--ndjson'], { env, input: '{"stream":"orders","kind":"k"}\n' });
  assert.equal(bad.code, 2, 'an invalid event is bad input: exit 2');
  assert.match(bad.stderr, /line 1: key: /);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n, 4);
});

test('tail follows the stream until SIGTERM (exit 0), or until --limit events', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const follower = startCli(['tail', '--consumer', 'live', '--stream', 's', '--json', '--poll', '50ms'], { env });
  t.after(() => follower.kill('SIGKILL'));
  let out = '';
  follower.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const stderr = watchStderr(follower);

  await cli(['append', '--ndjson'], { env, input: '{"stream":"s","kind":"k","key":"1"}\n{"stream":"s","kind":"k","key":"2"}\n' });
  await cli(['watermark', '--once'], { env });
  await waitFor('two events on stdout', async () => out.split('\n').filter(Boolean).length === 2);
  await cli(['append', '--stream', 's', '--kind', 'k', '--key', '3'], { env });
  await cli(['watermark', '--once'], { env });
  await waitFor('the third event', async () => out.split('\n').filter(Boolean).length === 3);
  assert.deepEqual(out.trim().split('\n').map((l) => JSON.parse(l).key), ['1', '2', '3']);

  follower.kill('SIGTERM');
  assert.equal(await exited(follower), 0, stderr.text());
  const cursor = await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = 'live'`);
  assert.equal(cursor.rows[0].seq, '3');

  const limited = await cli(['tail', '--consumer', 'two', '--stream', 's', '--limit', '2', '--poll', '50ms'], { env });
  assert.equal(limited.code, 0, limited.stderr);
  assert.equal(limited.stdout.trim().split('\n').length, 2);
  const two = await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = 'two'`);
  assert.equal(two.rows[0].seq, '2', 'the cursor stops at the last event written out');
});

test('tail piped into a reader that stops early (| head) exits 0, committing only what it handled', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const events = Array.from({ length: 2000 }, (_, i) => `{"stream":"s","kind":"k","key":"${i}","payload":{"pad":"${'x'.repeat(200)}"}}`).join('\n');
  await cli(['append', '--ndjson'], { env, input: events });
  await cli(['watermark', '--once'], { env });
  const reader = startCli(['tail', '--consumer', 'head', '--stream', 's', '--batch', '100'], { env });
  t.after(() => reader.kill('SIGKILL'));
  const stderr = watchStderr(reader);
  // Read the first line, then close the pipe, as `head -n 1` does.
  await new Promise<void>((resolve) => reader.stdout!.once('data', () => resolve()));
  reader.stdout!.destroy();
  assert.equal(await exited(reader), 0, stderr.text());
  assert.doesNotMatch(stderr.text(), /EPIPE|Error/);
  const cursor = Number((await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = 'head'`)).rows[0].seq);
  assert.ok(cursor >= 1 && cursor < 2000, `the cursor stopped early (${cursor})`);
});
