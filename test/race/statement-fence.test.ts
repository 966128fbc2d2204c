import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, test } from 'node:test';
import { from as copyFrom } from 'pg-copy-streams';
import { fenceKey } from '../../src/index.js';
import { closeAdmin, fenceLocks, lastAllocatedSeq, testDb, waitUntilWaiting } from '../support/db.js';

after(closeAdmin);

test('blocked INSERT, INSERT ... SELECT, CTE insert and COPY draw no seq while the exclusive fence is held', async (t) => {
  const db = await testDb(t);
  const { observer } = db;

  // 1. Hold the exclusive side, as a watermarker does for an instant.
  const fence = await db.session('fence');
  await fence.query('BEGIN');
  await fence.query('SELECT pg_advisory_xact_lock($1)', [fenceKey('tidemark').toString()]);

  // 2. Start one writer of each kind; each must block in the statement
  //    trigger, before the identity default is evaluated.
  const statements: [string, (s: Awaited<ReturnType<typeof db.session>>) => Promise<unknown>][] = [
    ['INSERT', (s) => s.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'insert', 'a')`)],
    ['INSERT ... SELECT', (s) => s.query(`INSERT INTO tidemark.events (stream, kind, key) SELECT 's', 'select', 'k' || g FROM generate_series(1, 3) g`)],
    ['CTE insert', (s) => s.query(`WITH ins AS (INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'cte', 'c') RETURNING seq) SELECT seq FROM ins`)],
    ['COPY', async (s) => {
      const stream = s.client.query(copyFrom('COPY tidemark.events (stream, kind, key) FROM STDIN'));
      stream.end('s\tcopy\tx\ns\tcopy\ty\n');
      await once(stream, 'finish');
    }],
    ['INSERT under session_replication_role = replica', async (s) => {
      await s.query('SET session_replication_role = replica');
      await s.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'replica', 'r')`);
    }],
  ];
  const running: Promise<unknown>[] = [];
  for (const [name, run] of statements) {
    const writer = await db.session(name);
    running.push(run(writer));
    await waitUntilWaiting(observer, writer.pid, `${name} to block on the fence`);
    // 3. While it waits, no number has been drawn from the identity.
    assert.equal(await lastAllocatedSeq(observer), null, `${name} drew a seq before holding the fence`);
    assert.ok((await fenceLocks(observer)).some((l) => l.pid === writer.pid && l.mode === 'ShareLock' && !l.granted));
  }

  // 4. Release the exclusive side: every writer proceeds and draws its numbers.
  await fence.query('COMMIT');
  await Promise.all(running);
  const kinds = await observer.query('SELECT kind, count(*)::int AS n FROM tidemark.events GROUP BY kind ORDER BY kind');
  assert.deepEqual(kinds.rows, [
    { kind: 'copy', n: 2 },
    { kind: 'cte', n: 1 },
    { kind: 'insert', n: 1 },
    { kind: 'replica', n: 1 },
    { kind: 'select', n: 3 },
  ]);
  assert.equal(await lastAllocatedSeq(observer), 8n);
});
