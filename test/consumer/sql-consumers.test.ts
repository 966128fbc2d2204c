/**
 * Consumers that are not TypeScript, through the SQL contract: one written
 * only in SQL and run by psql, one in Python (examples/consumer.py, with
 * psycopg2). Each consumes a stream while writers commit and roll back
 * beside it: every committed event exactly once, in order, the effects and
 * the cursor committed together; a page rolled back (or killed) is read
 * again; a second session on the cursor is refused with TM001.
 */
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import type pg from 'pg';
import { Watermarker } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, waitFor, waitUntilWaiting, type TestDb } from '../support/db.js';
import { exited, watchStderr } from '../support/cli.js';

after(closeAdmin);

const root = new URL('../../', import.meta.url).pathname;

/** The first of `candidates` that runs `args` successfully, or undefined. */
function firstWorking(candidates: string[], args: string[]): string | undefined {
  for (const c of candidates) {
    try {
      execFileSync(c, args, { stdio: 'ignore' });
      return c;
    } catch {
      // not this one
    }
  }
  return undefined;
}

// psql is PostgreSQL's client (Debian: postgresql-client); psycopg2 is
// Debian's python3-psycopg2, which .ci/run installs when it is missing.
const psql = firstWorking(['psql', '/usr/bin/psql'], ['--version']);
const python = firstWorking(['/usr/bin/python3', 'python3'], ['-c', 'import psycopg2']);

/**
 * Writers on stream `s`: `writers` sessions, each `transactions` transactions
 * of 1-3 events, every fourth rolled back. Resolves to the committed seqs.
 */
async function write(db: TestDb, writers: number, transactions: number): Promise<bigint[]> {
  const committed: bigint[] = [];
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const session = await db.session(`writer ${w}`);
      for (let i = 0; i < transactions; i += 1) {
        await session.query('BEGIN');
        const seqs: bigint[] = [];
        for (let k = 0; k <= (i + w) % 3; k += 1) seqs.push(await insertEvent(session));
        if ((i + w) % 4 === 3) await session.query('ROLLBACK');
        else {
          await session.query('COMMIT');
          committed.push(...seqs);
        }
      }
    }),
  );
  return committed.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/**
 * Waits until the consumer's cursor reaches `last`, checking at every look,
 * in one snapshot, that the cursor and the effects agree: the cursor is the
 * seq of the last event applied (they commit together).
 */
async function caughtUp(db: TestDb, consumer: string, effects: string, last: bigint, alive: () => void): Promise<void> {
  await waitFor(`${consumer} to reach seq ${last}`, async () => {
    alive();
    const r = await db.observer.query<{ cursor: string | null; applied: string | null }>(
      `SELECT (SELECT seq::text FROM tidemark.cursors WHERE consumer = $1 AND stream = 's') AS cursor,
              (SELECT max(seq)::text FROM ${effects}) AS applied`,
      [consumer],
    );
    const { cursor, applied } = r.rows[0]!;
    assert.equal(cursor ?? '0', applied ?? '0', 'the cursor is the last event applied, in every snapshot');
    return cursor !== null && BigInt(cursor) >= last;
  }, 60_000);
}

/** The seqs applied, in the order they were applied. */
async function appliedSeqs(db: TestDb, effects: string): Promise<bigint[]> {
  const r = await db.observer.query<{ seq: string }>(`SELECT seq FROM ${effects} ORDER BY position`);
  return r.rows.map((row) => BigInt(row.seq));
}

/** Holds the cursor (consumer, 's') in an open SQL page on a session of its own; returns the session. */
async function holdCursor(db: TestDb, consumer: string): Promise<pg.Client> {
  const holder = await db.session('holder');
  await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await holder.query(`SELECT * FROM tidemark.read_page($1, 's', 1)`, [consumer]);
  return holder.client;
}

/** Runs a psql script once. Its lock waits are bounded, so a page that waits where it should be refused fails (55P03) instead of hanging. */
function psqlRun(db: TestDb, script: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env, PGOPTIONS: '-c lock_timeout=5s' };
  return promisify(execFile)(psql!, ['-X', '-v', 'ON_ERROR_STOP=1', '-d', db.url, '-f', script], { timeout: 30_000, env }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

test('a consumer written only in SQL, run by psql, applies every committed event once, in order, while writers commit and roll back', { skip: psql ? false : 'psql (postgresql-client) is not installed' }, async (t) => {
  const db = await testDb(t);
  await db.observer.query(`CREATE TABLE applied (position bigint GENERATED ALWAYS AS IDENTITY, seq bigint NOT NULL)`);
  const dir = tmpdir();
  const page = (end: 'COMMIT' | 'ROLLBACK') =>
    [
      '\\set VERBOSITY verbose',
      'BEGIN ISOLATION LEVEL REPEATABLE READ;',
      `WITH page AS (SELECT * FROM tidemark.read_page('psql', 's', 50)),`,
      '     applied AS (INSERT INTO applied (seq) SELECT seq FROM page ORDER BY seq)',
      `SELECT count(*) AS events, tidemark.advance_cursor('psql', 's', max(seq)) AS cursor FROM page;`,
      `${end};`,
    ].join('\n');
  const once = join(dir, `tidemark-page-${db.name}.sql`);
  const undone = join(dir, `tidemark-page-rollback-${db.name}.sql`);
  await writeFile(once, page('COMMIT'));
  await writeFile(undone, page('ROLLBACK'));

  const first = await write(db, 2, 4);
  const wm = new Watermarker(db.pool({ max: 2 }), { owner: 'test' });
  db.defer(() => wm.close());
  await wm.step();

  // A second session on the cursor: refused at once with TM001, nothing applied.
  const holder = await holdCursor(db, 'psql');
  const refused = await psqlRun(db, once);
  assert.equal(refused.code, 3, 'psql stops on the error (ON_ERROR_STOP)');
  assert.match(refused.stderr, /ERROR:\s+TM001: tidemark: the cursor of consumer 'psql' on stream 's' is held by another session/);
  await holder.query('ROLLBACK');

  // A page rolled back leaves neither effects nor cursor: the next page reads the same events.
  const rolledBack = await psqlRun(db, undone);
  assert.equal(rolledBack.code, 0, rolledBack.stderr);
  assert.match(rolledBack.stdout, new RegExp(`\\s${first.length} \\|\\s+${first.at(-1)}\\n`), 'the page read them all...');
  assert.deepEqual(await appliedSeqs(db, 'applied'), [], '...and rolled back');
  const committed = await psqlRun(db, once);
  assert.equal(committed.code, 0, committed.stderr);
  assert.deepEqual(await appliedSeqs(db, 'applied'), first, 'read again, applied once');

  // Now follow the stream while writers write: one statement per page, in
  // autocommit, each its own REPEATABLE READ transaction, repeated by \watch.
  const follow = join(dir, `tidemark-follow-${db.name}.sql`);
  await writeFile(
    follow,
    [
      "SET default_transaction_isolation = 'repeatable read';",
      `WITH page AS (SELECT * FROM tidemark.read_page('psql', 's', 50)),`,
      '     applied AS (INSERT INTO applied (seq) SELECT seq FROM page ORDER BY seq)',
      `SELECT tidemark.advance_cursor('psql', 's', max(seq)) FROM page`,
      '\\watch 0.02',
    ].join('\n'),
  );
  const stopWatermarker = new AbortController();
  const watermarking = wm.run(stopWatermarker.signal);
  const child = spawn(psql!, ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', db.url, '-f', follow], { stdio: ['ignore', 'ignore', 'pipe'] });
  db.defer(() => child.exitCode === null && child.kill('SIGKILL'));
  const stderr = watchStderr(child);
  const alive = () => assert.equal(child.exitCode, null, `psql exited: ${stderr.text()}`);
  const rest = await write(db, 4, 25);
  await caughtUp(db, 'psql', 'applied', rest.at(-1)!, alive);
  child.kill('SIGINT');
  await exited(child);
  stopWatermarker.abort();
  await watermarking.catch(() => undefined);

  const all = [...first, ...rest].sort((a, b) => (a < b ? -1 : 1));
  assert.deepEqual(await appliedSeqs(db, 'applied'), all, 'every committed event once, in seq order, and nothing else');
});

test('a consumer in Python (examples/consumer.py) applies every committed event once, in order; a page killed halfway is read again; a held cursor is waited out', { skip: psql && python ? false : 'python3 with psycopg2 is not installed (apt-get install python3-psycopg2)' }, async (t) => {
  const db = await testDb(t);
  const wm = new Watermarker(db.pool({ max: 2 }), { owner: 'test' });
  db.defer(() => wm.close());
  const children: ChildProcess[] = [];
  db.defer(() => children.forEach((c) => c.exitCode === null && c.kill('SIGKILL')));
  const start = () => {
    const child = spawn(python!, [join(root, 'examples/consumer.py'), 'py', 's'], { env: { ...process.env, DATABASE_URL: db.url }, stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(child);
    const stderr = watchStderr(child);
    return { child, stderr, alive: () => assert.equal(child.exitCode, null, `consumer.py exited: ${stderr.text()}`) };
  };

  // Another session holds the cursor when the consumer starts: it is told
  // TM001, rolls back and tries again until the holder is gone.
  const holder = await holdCursor(db, 'py');
  let consumer = start();
  await consumer.stderr.next(/page rolled back \(TM001\), retrying: tidemark: the cursor of consumer 'py' on stream 's' is held by another session/, 30_000);
  await holder.query('ROLLBACK');

  // A page killed halfway: a session holds event_log's row for the third
  // event, so the consumer's page applies two events and waits on the third.
  const seqs = await write(db, 1, 3); // transactions of 1, 2 and 3 events
  await waitFor('event_log to exist', async () => (await db.observer.query(`SELECT to_regclass('event_log') AS t`)).rows[0].t);
  const blocker = await db.session('blocker');
  await blocker.query('BEGIN');
  await blocker.query(`INSERT INTO event_log (seq, kind, key, payload, headers) VALUES ($1, 'blocker', 'b', '{}', '{}')`, [seqs[2]]);
  await wm.step();
  const pid = await waitFor('the page to wait on the third event', async () => {
    const r = await db.observer.query<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'tidemark-python' AND wait_event_type = 'Lock'`);
    return r.rows[0]?.pid;
  });
  await waitUntilWaiting(db.observer, pid);
  consumer.child.kill('SIGKILL');
  await exited(consumer.child);
  await blocker.query('ROLLBACK');
  // The old backend ends once it finds its client gone; meanwhile the new
  // consumer may be told TM001 and retries.
  consumer = start();
  await caughtUp(db, 'py', 'event_log', seqs.at(-1)!, consumer.alive);

  // Follow the stream while writers write.
  const stopWatermarker = new AbortController();
  const watermarking = wm.run(stopWatermarker.signal);
  const rest = await write(db, 4, 25);
  await caughtUp(db, 'py', 'event_log', rest.at(-1)!, consumer.alive);
  consumer.child.kill('SIGTERM');
  assert.equal(await exited(consumer.child), 0, `consumer.py stops cleanly on SIGTERM: ${consumer.stderr.text()}`);
  stopWatermarker.abort();
  await watermarking.catch(() => undefined);

  const all = [...seqs, ...rest].sort((a, b) => (a < b ? -1 : 1));
  assert.deepEqual(await appliedSeqs(db, 'event_log'), all, 'every committed event once, in seq order, and nothing else');
  const kinds = await db.observer.query(`SELECT DISTINCT kind FROM event_log`);
  assert.deepEqual(kinds.rows, [{ kind: 'k' }], 'the blocker row rolled back; the events are copied as written');
});
