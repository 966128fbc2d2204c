/**
 * The `prefetch` option: the next page's events are read ahead on another
 * connection while a full page's beforeCommit and COMMIT run, and used only
 * when they are exactly what the page would read itself (PROTOCOL §6.2).
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Pruner, ResyncRequiredError, StreamClient, Watermarker, type StreamEvent } from '../../src/index.js';
import { CursorHold } from '../../src/consumer/cursor-hold.js';
import { pageSql, runPage, type EventRow } from '../../src/consumer/page.js';
import { closeAdmin, insertEvent, testDb, waitFor, type TestDb } from '../support/db.js';

after(closeAdmin);

async function write(db: TestDb, n: number): Promise<bigint[]> {
  const writer = await db.session('writer');
  const seqs: bigint[] = [];
  for (let i = 0; i < n; i += 1) seqs.push(await insertEvent(writer));
  await writer.client.end();
  assert.equal((await new Watermarker(db.pool(), { owner: 'test' }).step()).outcome, 'advanced');
  return seqs;
}

/** Waits until a read-ahead statement ran to its end on some backend (pg_stat_activity keeps an idle backend's last query). */
async function readAheadDone(db: TestDb, reads: number): Promise<void> {
  await waitFor(`${reads} read-ahead(s) to finish`, async () => {
    const r = await db.observer.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' AND query LIKE '%ev.seq <= (SELECT w.safe_seq FROM%'`,
    );
    return r.rows[0]!.n >= 1 ? true : undefined;
  });
  void reads;
}

test('with prefetch, a drain delivers every event once, in order, over many full pages', async (t) => {
  const db = await testDb(t);
  const written = await write(db, 47);
  const client = new StreamClient(db.pool(), { listen: false, batchSize: 5, prefetch: true });
  db.defer(() => client.close());
  const got: bigint[] = [];
  const result = await client.drain('c', 's', (e) => void got.push(e.seq));
  assert.deepEqual(got, written);
  assert.equal(result.cursor, written.at(-1));
});

test('a read-ahead that found fewer than a page is not used: events published meanwhile are delivered in the same drain', async (t) => {
  const db = await testDb(t);
  const first = await write(db, 8); // page 1: 1..5; its read-ahead finds 6..8 only
  const client = new StreamClient(db.pool(), { listen: false, batchSize: 5, prefetch: true });
  db.defer(() => client.close());
  const got: bigint[] = [];
  let more: bigint[] = [];
  let page = 0;
  const result = await client.drain('c', 's', (e) => void got.push(e.seq), {
    beforeCommit: async () => {
      page += 1;
      if (page !== 1) return;
      await readAheadDone(db, 1);
      more = await write(db, 12); // safe_seq moves past what the read-ahead saw
    },
  });
  assert.deepEqual(got, [...first, ...more], 'a short read-ahead would have ended the drain at seq 8');
  assert.equal(result.cursor, more.at(-1));
});

test('events pruned above the cursor after they were read ahead give RESYNC_REQUIRED, not a delivery of the read-ahead', async (t) => {
  const db = await testDb(t);
  const written = await write(db, 20);
  const client = new StreamClient(db.pool(), { listen: false, batchSize: 5, prefetch: true });
  db.defer(() => client.close());
  const got: bigint[] = [];
  let page = 0;
  await assert.rejects(
    client.drain('c', 's', (e) => void got.push(e.seq), {
      beforeCommit: async () => {
        page += 1;
        if (page !== 1) return;
        await readAheadDone(db, 1); // 6..10 are read ahead
        const pruned = await new Pruner(db.pool(), { retentionMs: 0, allowShortRetention: true }).prune();
        assert.equal(pruned.deleted, 20);
      },
    }),
    ResyncRequiredError,
  );
  assert.deepEqual(got, written.slice(0, 5), 'only the first page, read before the prune');
});

test('a page uses events read ahead only when the locked cursor is where the read started', async (t) => {
  const db = await testDb(t);
  const written = await write(db, 3);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's')`);
  const pool = db.pool();
  // Rows told apart by kind; their seqs are the first two of the stream, as
  // a read ahead from 0 would return them (lock_page refuses a read ahead
  // whose rows are not all of the stream's events in their range).
  const fake: EventRow[] = written.slice(0, 2).map((seq) => ({ seq: String(seq), kind: 'fake', key: 'fake', payload: '{}', headers: '{}', occurred_at: new Date() }));
  const run = async (after: bigint) => {
    const hold = await CursorHold.open(pool, 'tidemark', 'c', 's', undefined, 10_000);
    const got: StreamEvent[] = [];
    try {
      await runPage(hold, pageSql('tidemark'), 2, 5000, (e) => void got.push(e), new AbortController().signal, () => {
        throw new Error('roll the page back'); // leave the cursor at 0 for the next run
      }, { use: { after, rows: Promise.resolve(fake) }, waitMs: 1000 }).catch(() => undefined);
    } finally {
      await hold.release();
    }
    return got.map((e) => `${e.seq} ${e.kind}`);
  };
  assert.deepEqual(await run(7n), written.slice(0, 2).map((seq) => `${seq} k`), 'the cursor is at 0, not 7: the page reads for itself');
  assert.deepEqual(await run(0n), written.slice(0, 2).map((seq) => `${seq} fake`), 'at 0 the read-ahead is the page (which is why the cursor check gates it)');
});
