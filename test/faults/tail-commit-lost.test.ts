/**
 * `tidemark tail` in follow mode writes a page's lines, and only then
 * commits the page (a line counts as delivered once stdout accepted it).
 * If the connection is lost between the two, the page rolls back and the
 * tail retries it: the lines stdout already has must not be printed again.
 *
 * The moment is scripted: the test does not read the child's stdout, so
 * the first page (2 MB, far more than the pipe holds) cannot be written
 * and its transaction waits, idle after its read statement, holding the
 * cursor row (pg_stat_activity, pg_locks); the test ends that session,
 * then reads stdout. The write completes, the COMMIT meets the dead
 * connection, and the page comes again.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker } from '../../src/index.js';
import { startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { alive, checkDeliveries, collectNdjson, committedSeqs, EXACTLY_ONCE, stopChild } from '../support/faults.js';

after(closeAdmin);

test('tail (follow mode) whose page commit is lost after its lines were written prints each event once', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  // 1200 events of about 4 KiB a line: a 500-event page is 2 MiB, more
  // than the pipe to the test holds, so its write waits for the reader.
  await observer.query(
    `INSERT INTO tidemark.events (stream, kind, key, payload)
     SELECT 's', 'k', 'x' || i, jsonb_build_object('pad', repeat('x', 4000)) FROM generate_series(1, 1200) i`,
  );
  // The cursor row exists, so the first page is a page of events.
  await observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's')`);
  const committed = await committedSeqs(observer);
  const wm = new Watermarker(db.pool({ max: 1 }));
  assert.equal((await wm.step()).safeSeq, committed.at(-1));
  await wm.close();

  const child = startCli(['tail', '--consumer', 'c', '--stream', 's', '--json', '--database-url', db.url]);
  db.defer(() => stopChild(child));
  const log = watchStderr(child);
  // Nobody reads stdout yet: the page's write cannot complete.
  const pid = await waitFor(
    "the tail's first page to wait, idle in its transaction, on its output",
    async () => {
      if (!alive(child)) throw new Error(`tail exited (${child.exitCode ?? child.signalCode}):\n${log.text()}`);
      // Idle after the page's read, holding the cursor row (its table's
      // RowShareLock), and for 200 ms at least: the handlers are done (they
      // do not touch the database) and the page waits in its write.
      const r = await observer.query<{ pid: number }>(
        `SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
          WHERE a.datname = current_database() AND a.application_name = 'tidemark-cli'
            AND a.state = 'idle in transaction' AND a.query LIKE '%.read_page(%'
            AND a.state_change < pg_catalog.clock_timestamp() - interval '200 ms'
            AND l.relation = 'tidemark.cursors'::regclass AND l.mode = 'RowShareLock' AND l.granted`,
      );
      return r.rows[0]?.pid;
    },
    30_000,
  );
  await observer.query('SELECT pg_terminate_backend($1, 5000)', [pid]);

  const out = collectNdjson(child); // reading now: the write completes, the COMMIT fails
  await waitFor(
    `tail to print all ${committed.length} events`,
    async () => {
      if (!alive(child)) throw new Error(`tail exited (${child.exitCode ?? child.signalCode}):\n${log.text()}`);
      const cursor = await observer.query<{ seq: string }>(`SELECT seq FROM tidemark.cursors WHERE consumer = 'c' AND stream = 's'`);
      return new Set(out.seqs).size >= committed.length && cursor.rows[0]?.seq === committed.at(-1)!.toString();
    },
    30_000,
  );
  t.diagnostic(`${out.seqs.length} lines for ${committed.length} events; tail's stderr:\n${log.text().trimEnd()}`);
  assert.deepEqual(checkDeliveries(out.seqs, committed), EXACTLY_ONCE, 'each event printed once, in seq order');
  assert.ok(alive(child), 'tail is still running');
});
