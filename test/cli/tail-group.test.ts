/**
 * `tidemark tail --partitions N`: processes started with the same consumer
 * and count share the stream as a group, each key in order; a member with
 * another count, and flags that belong to a consumer's own cursor, are
 * refused with one line.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';

after(closeAdmin);

test('two tail --partitions members share a stream: every event on exactly one stdout, each key in order; SIGTERM leaves the group', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const input = Array.from({ length: 200 }, (_, i) => JSON.stringify({ stream: 's', kind: 'k', key: `key-${i % 20}`, payload: { i } })).join('\n');

  const members = ['one', 'two'].map((name) => {
    const child = startCli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '4', '--member', name, '--lease', '2s', '--json', '--poll', '50ms', '--batch', '7'], { env });
    t.after(() => child.kill('SIGKILL'));
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    return { name, child, out: () => out, stderr: watchStderr(child) };
  });
  await members[0]!.stderr.next(/member one holds partitions/);
  await members[1]!.stderr.next(/member two holds partitions \d/);
  // The events once the split is done (two took what one gave up), so both deliver.
  assert.equal((await cli(['append', '--ndjson'], { env, input })).code, 0);
  assert.equal((await cli(['watermark', '--once'], { env })).code, 0);
  const lines = () => members.flatMap((m) => m.out().split('\n').filter(Boolean).map((l) => ({ member: m.name, event: JSON.parse(l) as { seq: string; key: string; payload: { i: number } } })));
  await waitFor('every event on stdout', async () => lines().length >= 200);
  // A page's lines are written before it commits: wait for the last commits.
  await waitFor('every partition committed', async () => (await db.observer.query(`SELECT 1 FROM tidemark.group_partitions() HAVING bool_and(lag = 0)`)).rowCount === 1);
  // status shows each partition's holder, cursor and lag.
  const status = await cli(['status', '--json'], { env });
  assert.equal(status.code, 0, status.stderr);
  const groups = (JSON.parse(status.stdout) as { groups: { consumer: string; partition: number; partitions: number; holder: string; holderLive: boolean; lagEvents: string; seq: string }[] }).groups;
  assert.deepEqual(groups.map((g) => [g.consumer, g.partition, g.partitions, g.holderLive, g.lagEvents]), [0, 1, 2, 3].map((p) => ['mailer', p, 4, true, '0']));
  assert.deepEqual(new Set(groups.map((g) => g.holder)), new Set(['one', 'two']));
  assert.equal(typeof groups[0]!.seq, 'string');
  const text = await cli(['status'], { env });
  assert.match(text.stdout, /^group\s+stream\s+partition\s+holder\s+cursor\s+lag\s+moves\s+updated$/m);
  assert.match(text.stdout, /^mailer\s+s\s+0\/4\s+(one|two)\s+\d+\s+0\s/m);

  const all = lines();
  assert.deepEqual(all.map((l) => Number(l.event.seq)).sort((a, b) => a - b), Array.from({ length: 200 }, (_, i) => i + 1), 'each event on exactly one stdout');
  for (const m of members) {
    const last = new Map<string, number>();
    for (const l of all.filter((x) => x.member === m.name)) {
      assert.ok((last.get(l.event.key) ?? 0) < Number(l.event.seq), `key ${l.event.key} in order`);
      last.set(l.event.key, Number(l.event.seq));
    }
  }
  assert.ok(members.every((m) => all.some((l) => l.member === m.name)), 'both members delivered');

  for (const m of members) m.child.kill('SIGTERM');
  assert.deepEqual(await Promise.all(members.map((m) => exited(m.child))), [0, 0]);
  assert.equal((await db.observer.query(`SELECT 1 FROM tidemark.group_members`)).rowCount, 0, 'both left the group');
  const cursors = await db.observer.query<{ partition: number; holder: string | null }>('SELECT partition, holder FROM tidemark.partition_cursors ORDER BY partition');
  assert.deepEqual(cursors.rows.map((r) => r.holder), [null, null, null, null]);
});

test('tail --partitions refuses another partition count, and flags of a consumer\'s own cursor, with one line', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const first = startCli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '4', '--member', 'one'], { env });
  t.after(() => first.kill('SIGKILL'));
  await watchStderr(first).next(/member one holds/);
  const other = await cli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '8'], { env });
  assert.notEqual(other.code, 0);
  assert.equal(other.stderr.trim().split('\n').length, 1, other.stderr);
  assert.match(other.stderr, /has 4 partitions, not 8/);
  assert.equal(other.code, 2, 'a group refused is a usage error');
  // --bootstrap of a group is refused while a member runs (exit 1: try again once it stopped).
  const busy = await cli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '4', '--bootstrap'], { env });
  assert.equal(busy.code, 1, busy.stderr);
  assert.equal(busy.stderr.trim().split('\n').length, 1, busy.stderr);
  for (const [args, message] of [
    [['--partitions', '4', '--once'], /--partitions: .*--once/],
    [['--partitions', '0'], /--partitions/],
    [['--partitions', '2000'], /--partitions: expected at most 1024/],
    [['--member', 'x'], /--member: only with --partitions/],
    [['--no-partition-index'], /--no-partition-index: only with --partitions/],
  ] as const) {
    const r = await cli(['tail', '--consumer', 'mailer', '--stream', 's', ...args], { env });
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, message);
  }
  first.kill('SIGTERM');
  assert.equal(await exited(first), 0);

  // Stopped: --bootstrap moves every partition's cursor to the present, then the member runs.
  assert.equal((await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'a'], { env })).code, 0);
  assert.equal((await cli(['watermark', '--once'], { env })).code, 0);
  const boot = startCli(['tail', '--consumer', 'mailer', '--stream', 's', '--partitions', '4', '--member', 'one', '--bootstrap', '--json'], { env });
  t.after(() => boot.kill('SIGKILL'));
  const said = watchStderr(boot);
  await said.next(/^tidemark: bootstrapped mailer on s: every partition's cursor -> 1$/m);
  await said.next(/member one holds partitions 0,1,2,3 of 4/);
  boot.kill('SIGTERM');
  assert.equal(await exited(boot), 0);
  const cursors = await db.observer.query<{ seq: string }>('SELECT DISTINCT seq::text FROM tidemark.partition_cursors');
  assert.deepEqual(cursors.rows, [{ seq: '1' }]);
});
