/**
 * `tidemark append --ndjson`: input is written batch by batch (each batch
 * checked in full, then committed), and a stop, by a bad line, an event
 * PostgreSQL refuses or a signal, says exactly what was committed.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { fenceKey } from '../../src/index.js';
import type { ChildProcess } from 'node:child_process';
import { closeAdmin, testDb, waitForBlockedStatement, type Session, type TestDb } from '../support/db.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';

after(closeAdmin);

const event = (key: string, extra = '') => `{"stream":"s","kind":"k","key":"${key}"${extra}}`;
const seqList = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `${from + i}\n`).join('');

async function eventCount(db: Awaited<ReturnType<typeof testDb>>): Promise<number> {
  return (await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n;
}

/**
 * `append --ndjson --batch 2` with its first batch held at the fence (the
 * exclusive side, held by a session of the test, stops its INSERT at the
 * statement trigger): resolves once that INSERT waits there.
 */
async function appendHeldAtFence(db: TestDb, input: string): Promise<{ child: ChildProcess; stderr: ReturnType<typeof watchStderr>; fence: Session }> {
  const fence = await db.session('fence');
  await fence.query('BEGIN');
  await fence.query('SELECT pg_advisory_xact_lock($1)', [fenceKey('tidemark').toString()]);
  const child = startCli(['append', '--ndjson', '--batch', '2'], { env: { DATABASE_URL: db.url } });
  db.defer(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  child.stdin!.write(input);
  await waitForBlockedStatement(db.observer, 'INSERT INTO "tidemark".events');
  return { child, stderr, fence };
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
  const { child, stderr, fence } = await appendHeldAtFence(db, `${event('a')}\n${event('b')}\n`);
  let stdout = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
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

test('a closed stdout stops the input after the batch whose seqs it could not take, and stderr records that batch as committed', async (t) => {
  const db = await testDb(t);
  const child = startCli(['append', '--ndjson', '--batch', '2'], { env: { DATABASE_URL: db.url } });
  db.defer(() => child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  child.stdout!.destroy(); // the reader of the seqs is gone
  child.stdin!.end(`${event('a')}\n${event('b')}\n${event('c')}\n`);
  assert.equal(await exited(child), 1);
  assert.match(stderr.text(), /^tidemark: committed lines 1-2 as seqs 1-2; stdout failed, so not every seq was printed; nothing after line 2 was written\n/);
  assert.equal(await eventCount(db), 2);
});

test('append --ndjson refuses a line that is not UTF-8, naming the line and the byte, instead of writing U+FFFD', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const good = Buffer.from(`${event('a')}\r\n${event('é')}\n`);
  // A lone continuation byte inside the key of line 3 (after "key":"b).
  const bad = Buffer.concat([Buffer.from(`{"stream":"s","kind":"k","key":"b`), Buffer.from([0x80]), Buffer.from(`"}\n${event('c')}\n`)]);
  const r = await cli(['append', '--ndjson', '--batch', '2'], { env, input: Buffer.concat([good, bad]) });
  assert.equal(r.code, 2, r.stderr);
  assert.equal(r.stdout, seqList(1, 2));
  assert.equal(r.stderr, 'tidemark: committed lines 1-2 as seqs 1-2; line 3: not valid UTF-8 (byte 34 of the line, 0x80); nothing after line 2 was written\n');
  assert.deepEqual((await db.observer.query(`SELECT key FROM tidemark.events ORDER BY seq`)).rows, [{ key: 'a' }, { key: 'é' }]);
  // A last line without a line break is read too, strictly.
  const last = await cli(['append', '--ndjson'], { env, input: Buffer.concat([Buffer.from(`${event('d')}\n{"stream":"s","kind":"k","key":"`), Buffer.from([0xc3, 0x28]), Buffer.from('"}')]) });
  assert.equal(last.code, 2);
  assert.equal(last.stderr, 'tidemark: line 2: not valid UTF-8 (byte 33 of the line, 0xc3); nothing was written\n');
  assert.equal(await eventCount(db), 2);
});

test('a second signal while a batch is being committed exits at once with the whole line, naming the batch that may be half-done', async (t) => {
  const db = await testDb(t);
  const { child, stderr, fence } = await appendHeldAtFence(db, `${event('a')}\n${event('b')}\n${event('c')}\n${event('d')}\n`);
  child.kill('SIGINT');
  await stderr.next(/SIGINT: stopping once lines 1-2, being committed now, are\n/);
  child.kill('SIGINT');
  assert.equal(await exited(child), 130);
  // The last line, whole: stderr is a pipe here, as under a supervisor.
  assert.match(stderr.text(), /\ntidemark: SIGINT again: exiting now; lines 1-2 were being committed and may or may not have been; nothing was written\n$/);
  await fence.query('ROLLBACK');
});
