/**
 * `tidemark append`: NDJSON input is written batch by batch (each batch
 * checked in full, then committed), a stop says exactly what was committed,
 * invalid events exit 2, and JSON text reaches PostgreSQL as written.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { fenceKey } from '../../src/index.js';
import { closeAdmin, testDb, waitForBlockedStatement } from '../support/db.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';

after(closeAdmin);

const event = (key: string, extra = '') => `{"stream":"s","kind":"k","key":"${key}"${extra}}`;
const seqList = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `${from + i}\n`).join('');

async function eventCount(db: Awaited<ReturnType<typeof testDb>>): Promise<number> {
  return (await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n;
}

test('append --ndjson: a bad line 601 after 600 good ones commits lines 1-500, says which seqs, writes nothing after, and exits 2', async (t) => {
  const db = await testDb(t);
  const lines = Array.from({ length: 600 }, (_, i) => event(`k${i + 1}`));
  lines.push('{"stream":"s","kind":"k"}');
  const r = await cli(['append', '--ndjson'], { env: { DATABASE_URL: db.url }, input: `${lines.join('\n')}\n` });
  assert.equal(r.code, 2);
  assert.equal(r.stdout, seqList(1, 500));
  assert.equal(
    r.stderr,
    'tidemark: committed lines 1-500 as seqs 1-500; line 601: key: must be a non-empty string of at most 256 characters; nothing after line 500 was written\n',
  );
  assert.equal(await eventCount(db), 500);
});

test('append --ndjson names the real line of a bad event after blank lines, in the first batch and in a later one', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const first = await cli(['append', '--ndjson'], { env, input: `${event('a')}\n\n\n${event('b')}\n{"stream":"s","key":"x"}\n` });
  assert.equal(first.code, 2);
  assert.equal(first.stdout, '', 'input of up to --batch events is all or nothing');
  assert.equal(first.stderr, 'tidemark: line 5: kind: must be a non-empty string of at most 200 characters; nothing was written\n');

  const later = await cli(['append', '--ndjson', '--batch', '2'], { env, input: `${event('a')}\n\n${event('b')}\n\n   \n[1]\n${event('c')}\n` });
  assert.equal(later.code, 2);
  assert.equal(later.stdout, seqList(1, 2));
  assert.equal(
    later.stderr,
    'tidemark: committed lines 1-3 as seqs 1-2; line 6: must be a JSON object with stream, kind and key; nothing after line 3 was written\n',
  );
  assert.equal(await eventCount(db), 2);
});

test('invalid events exit 2 (INVALID_EVENT), from flags and from NDJSON, before anything is written', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const cases: [string[], string, RegExp][] = [
    [['--stream', 's'.repeat(300), '--kind', 'k', '--key', 'x'], '', /^tidemark: --stream: is 300 characters \(UTF-16 code units\) long, over the limit of 200\n$/],
    [['--stream', 's', '--kind', 'k', '--key', 'k'.repeat(100_000)], '', /^tidemark: --key: is 100000 characters/],
    [['--ndjson'], `${event('k'.repeat(2 * 1024 * 1024))}\n`, /^tidemark: line 1: key: is 2097152 characters .* over the limit of 256; nothing was written\n$/],
    [['--stream', 's', '--kind', 'k', '--key', 'x', '--payload', '{"a":"\\ud800"}'], '', /^tidemark: --payload: \$\.a contains a lone UTF-16 surrogate/],
    [['--stream', 's', '--kind', 'k', '--key', 'x', '--payload', '{"a":'], '', /^tidemark: --payload: is not valid JSON: the text ends/],
    [['--ndjson'], '{"stream":"s","kind":"k","key":"x","payload":{"n":"\\u0000"}}\n', /^tidemark: line 1: payload: \$\.n contains \\u0000/],
    [['--ndjson'], '{"stream":"s","kind":"k","key":"x","payload":{"n":1e200000}}\n', /^tidemark: line 1: payload: \$\.n holds a number PostgreSQL's numeric cannot hold/],
    [['--ndjson'], '{"stream":"s","kind":"k",\n', /^tidemark: line 1: is not valid JSON/],
    [['--ndjson'], `${event('x', ',"headers":[1]')}\n`, /^tidemark: line 1: headers: must be a JSON object; nothing was written\n$/],
  ];
  for (const [args, input, stderr] of cases) {
    const r = await cli(['append', ...args], { env, input });
    assert.equal(r.code, 2, `${args.join(' ').slice(0, 80)}: ${r.stderr}`);
    assert.match(r.stderr, stderr);
    assert.equal(r.stderr.split('\n').length, 2, 'one line');
  }
  assert.equal(await eventCount(db), 0);
});

test('append passes JSON text through: PostgreSQL reads 1e400, 12345678901234567890 and 1.50 itself', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const payload = '{"huge":1e400,"big":12345678901234567890,"price":1.50,"tiny":1e-400}';
  const r1 = await cli(['append', '--ndjson'], { env, input: `${event('line', `,"payload":${payload},"headers":{"id":98765432109876543210}`)}\n` });
  const r2 = await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'flags', '--payload', payload], { env });
  assert.deepEqual([r1.code, r2.code, r1.stderr + r2.stderr], [0, 0, '']);
  const rows = await db.observer.query(
    `SELECT key, payload->>'huge' AS huge, payload->>'big' AS big, payload->>'price' AS price, payload->>'tiny' AS tiny, headers->>'id' AS id
       FROM tidemark.events ORDER BY seq`,
  );
  for (const row of rows.rows) {
    assert.equal(row.huge, `1${'0'.repeat(400)}`);
    assert.equal(row.big, '12345678901234567890');
    assert.equal(row.price, '1.50');
    assert.equal(row.tiny, `0.${'0'.repeat(399)}1`);
  }
  assert.equal(rows.rows[0].id, '98765432109876543210');
});

test('an event PostgreSQL refuses (a site constraint) is named by its line; its batch is not written; exit 2', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  await db.observer.query(`ALTER TABLE tidemark.events ADD CONSTRAINT site_rule CHECK (kind <> 'forbidden')`);
  const input = `${event('a')}\n${event('b')}\n${event('c')}\n\n{"stream":"s","kind":"forbidden","key":"d"}\n${event('e')}\n`;
  const r = await cli(['append', '--ndjson', '--batch', '2'], { env, input });
  assert.equal(r.code, 2);
  assert.equal(r.stdout, seqList(1, 2));
  assert.match(
    r.stderr,
    /^tidemark: committed lines 1-2 as seqs 1-2; line 5: PostgreSQL refused it: new row for relation "events" violates check constraint "site_rule" \(SQLSTATE 23514\); nothing after line 2 was written\n$/,
  );
  const flags = await cli(['append', '--stream', 's', '--kind', 'forbidden', '--key', 'x'], { env });
  assert.equal(flags.code, 2);
  assert.match(flags.stderr, /^tidemark: PostgreSQL refused it: .*site_rule/);
  assert.equal(await eventCount(db), 2);
});

test('SIGTERM while a batch is being committed: the batch finishes, reading stops, stderr records what was committed', async (t) => {
  const db = await testDb(t);
  // The exclusive side of the fence holds the CLI's INSERT at its statement trigger.
  const fence = await db.session('fence');
  await fence.query('BEGIN');
  await fence.query('SELECT pg_advisory_xact_lock($1)', [fenceKey('tidemark').toString()]);
  const child = startCli(['append', '--ndjson', '--batch', '2'], { env: { DATABASE_URL: db.url } });
  db.defer(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  let stdout = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stdin!.write(`${event('a')}\n${event('b')}\n`);
  await waitForBlockedStatement(db.observer, 'INSERT INTO "tidemark".events');
  child.kill('SIGTERM');
  await stderr.next(/SIGTERM: stopping once lines 1-2, being committed now, are\n/);
  await fence.query('COMMIT'); // the INSERT goes on
  assert.equal(await exited(child), 143);
  assert.equal(stdout, seqList(1, 2));
  assert.match(
    stderr.text(),
    /\ntidemark: SIGTERM: stopped reading at line 2; finished committing the batch in flight; committed lines 1-2 as seqs 1-2; nothing after line 2 was written\n$/,
  );
  assert.equal(await eventCount(db), 2);
});

test('SIGINT between batches: nothing half-read is written and stderr records the last committed batch', async (t) => {
  const db = await testDb(t);
  const child = startCli(['append', '--ndjson', '--batch', '2'], { env: { DATABASE_URL: db.url } });
  db.defer(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  let stdout = '';
  const twoSeqs = new Promise<void>((resolve) =>
    child.stdout!.on('data', (d: Buffer) => {
      stdout += d.toString();
      if (stdout === seqList(1, 2)) resolve();
    }),
  );
  child.stdin!.write(`${event('a')}\n${event('b')}\n`);
  await twoSeqs;
  child.stdin!.write(`${event('c')}\n`); // read or not when the signal comes: never written
  child.kill('SIGINT');
  assert.equal(await exited(child), 130);
  assert.match(
    stderr.text(),
    /^tidemark: SIGINT: stopped reading at line [23]; committed lines 1-2 as seqs 1-2; (lines 3-3 were read but not written; )?nothing after line 2 was written\n$/,
  );
  assert.equal(stdout, seqList(1, 2));
  assert.equal(await eventCount(db), 2);
});
