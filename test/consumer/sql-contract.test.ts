/**
 * The consumer contract in SQL (migration 0006): read_page and
 * advance_cursor, what they deliver and every misuse they refuse, by
 * SQLSTATE, with nothing written.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { CursorContentionError, ResyncRequiredError, StreamClient, Watermarker, type ConsumerEvent } from '../../src/index.js';
import { closeAdmin, failsWith, insertEvent, testDb, testRole, waitFor, type Session, type TestDb } from '../support/db.js';

after(closeAdmin);

const RR = 'BEGIN ISOLATION LEVEL REPEATABLE READ';

/** Appends `n` events to `stream`, commits them and publishes them; returns their seqs. */
async function publish(db: TestDb, n: number, stream = 's'): Promise<bigint[]> {
  const writer = await db.session('writer');
  const seqs: bigint[] = [];
  for (let i = 0; i < n; i += 1) seqs.push(await insertEvent(writer, stream));
  const watermarker = new Watermarker(db.pool({ max: 1 }), { owner: 'test' });
  await watermarker.step();
  await watermarker.close();
  return seqs;
}

async function readPage(session: Session, consumer: string, stream: string, max: number): Promise<bigint[]> {
  const r = await session.query<{ seq: string }>('SELECT seq FROM tidemark.read_page($1, $2, $3)', [consumer, stream, max]);
  return r.rows.map((row) => BigInt(row.seq));
}

/** advance_cursor, returning the cursor it reports. */
async function advanceCursor(session: Session, consumer: string, stream: string, seq: bigint | undefined): Promise<bigint> {
  const r = await session.query<{ cursor: string }>('SELECT tidemark.advance_cursor($1, $2, $3) AS cursor', [consumer, stream, seq]);
  return BigInt(r.rows[0]!.cursor);
}

async function cursorRow(db: TestDb, consumer = 'c', stream = 's'): Promise<{ seq: bigint; resyncCount: number } | undefined> {
  const r = await db.observer.query(`SELECT seq, resync_count FROM tidemark.cursors WHERE consumer = $1 AND stream = $2`, [consumer, stream]);
  return r.rows[0] ? { seq: BigInt(r.rows[0].seq), resyncCount: r.rows[0].resync_count } : undefined;
}


test('a page in SQL: read_page creates the cursor and returns the events below safe_seq in order; advance_cursor commits with the effects', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 5);
  const other = await publish(db, 2, 'other'); // another stream's events interleave in seq
  const writer = await db.session('late writer');
  const unpublished = await insertEvent(writer); // committed, but above safe_seq: not this page's
  await writer.query('BEGIN');
  await insertEvent(writer); // in flight: above safe_seq too
  const c = await db.session('consumer');
  await c.query('CREATE TABLE effects (seq bigint PRIMARY KEY)');

  await c.query(RR);
  const r = await c.query('SELECT seq, kind, key, payload, headers, occurred_at FROM tidemark.read_page($1, $2, $3)', ['c', 's', 3]);
  assert.deepEqual(r.rows.map((row) => BigInt(row.seq)), seqs.slice(0, 3));
  assert.deepEqual(Object.keys(r.rows[0]), ['seq', 'kind', 'key', 'payload', 'headers', 'occurred_at']);
  assert.ok(r.rows[0].occurred_at instanceof Date);
  const info = (await c.query('SELECT cursor::text, through::text, advanced_to::text, safe_seq::text FROM tidemark.page_info($1, $2)', ['c', 's'])).rows[0];
  assert.deepEqual(info, { cursor: '0', through: String(seqs[2]), advanced_to: '0', safe_seq: String(other.at(-1)) });
  await c.query('INSERT INTO effects SELECT unnest($1::bigint[])', [r.rows.map((row) => row.seq)]);
  assert.equal(await advanceCursor(c, 'c', 's', seqs[2]), seqs[2]);
  assert.equal(await cursorRow(db), undefined, 'nothing is visible before COMMIT');
  await c.query('COMMIT');
  assert.equal((await cursorRow(db))?.seq, seqs[2]);

  // The next page: the rest of the stream up to safe_seq, a short page.
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 100), seqs.slice(3));
  await advanceCursor(c, 'c', 's', seqs[4]);
  await c.query('COMMIT');
  // An empty page: NULL (no event applied) leaves the cursor where it is.
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 100), [], `seq ${unpublished} is committed but not below safe_seq`);
  assert.equal(await advanceCursor(c, 'c', 's', undefined), seqs[4], 'NULL');
  await c.query('COMMIT');
  assert.equal((await cursorRow(db))?.seq, seqs[4]);
  assert.equal((await db.observer.query('SELECT count(*)::int AS n FROM effects')).rows[0].n, 3);
  await writer.query('ROLLBACK');
});

test('a rolled-back page leaves the cursor and the effects as they were, and is read again', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 3);
  const c = await db.session('consumer');
  await c.query('CREATE TABLE effects (seq bigint PRIMARY KEY)');
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 10), seqs);
  await c.query('INSERT INTO effects SELECT unnest($1::bigint[])', [seqs]);
  await advanceCursor(c, 'c', 's', seqs[2]);
  await c.query('ROLLBACK');
  assert.equal(await cursorRow(db), undefined, 'the cursor row created by the page went with it');
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 10), seqs, 'the same events again');
  await c.query('ROLLBACK');
});

test('misuse is refused by SQLSTATE, and nothing is written', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 6);
  const c = await db.session('consumer');

  // Not REPEATABLE READ: TM003, and no cursor row is created.
  await c.query('BEGIN');
  assert.equal(await failsWith(readPage(c, 'c', 's', 10)), 'TM003');
  await c.query('ROLLBACK');
  assert.equal(await failsWith(readPage(c, 'c', 's', 10)), 'TM003', 'nor in autocommit under READ COMMITTED');
  assert.equal(await cursorRow(db), undefined);

  // Bad arguments: 22023, naming the argument.
  await c.query(RR);
  for (const [args, name] of [
    [[null, 's', 10], /consumer/],
    [['', 's', 10], /consumer/],
    [['c', 'x'.repeat(201), 10], /stream/],
    [['c', 's', 0], /max_events/],
    [['c', 's', 100_001], /max_events/],
    [['c', 's', null], /max_events/],
  ] as const) {
    await c.query('SAVEPOINT a');
    await assert.rejects(c.query('SELECT * FROM tidemark.read_page($1, $2, $3)', [...args]), { code: '22023', message: name });
    await c.query('ROLLBACK TO SAVEPOINT a');
  }
  // An advance without a read in this transaction: TM004.
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', seqs[0])), 'TM004');
  await c.query('ROLLBACK');

  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 3), seqs.slice(0, 3));
  await c.query('SAVEPOINT a');
  // Past the last event the page returned (seqs[3] exists, unread): TM005.
  await assert.rejects(advanceCursor(c, 'c', 's', seqs[3]), { code: 'TM005', message: /skips events/ });
  await c.query('ROLLBACK TO SAVEPOINT a');
  await advanceCursor(c, 'c', 's', seqs[1]); // a prefix
  // Backwards from where this transaction moved it: TM005.
  await assert.rejects(advanceCursor(c, 'c', 's', seqs[0]), { code: 'TM005', message: /backwards/ });
  await c.query('ROLLBACK');
  // Another cursor than the one read: TM004.
  await c.query(RR);
  await readPage(c, 'c', 's', 3);
  assert.equal(await failsWith(advanceCursor(c, 'c2', 's', seqs[0])), 'TM004');
  await c.query('ROLLBACK');
  // A read undone by ROLLBACK TO SAVEPOINT takes its page with it: TM004.
  await c.query(RR);
  await c.query('SAVEPOINT before_read');
  await readPage(c, 'c', 's', 3);
  await c.query('ROLLBACK TO SAVEPOINT before_read');
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', seqs[0])), 'TM004');
  await c.query('ROLLBACK');
  // A short page may reach safe_seq, not past it.
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 100), seqs);
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', seqs[5]! + 1n)), 'TM005');
  await c.query('ROLLBACK');

  assert.equal(await cursorRow(db), undefined, 'none of it left a cursor row');
});

test('a second session on the same cursor is refused at once with TM001, whether SQL or TypeScript holds it', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 3);
  const a = await db.session('a');
  const b = await db.session('b');
  await a.query(RR);
  assert.deepEqual(await readPage(a, 'c', 's', 10), seqs);
  // b does not wait for a's page: TM001 at once, not 55P03 after the row
  // lock's timeout (bounded here only so that a broken check fails, not hangs).
  await b.query(`SET lock_timeout = '5s'`);
  await b.query(RR);
  await assert.rejects(readPage(b, 'c', 's', 10), { code: 'TM001', message: /held by another session/ });
  await b.query('ROLLBACK');
  // A TypeScript tailer is refused by the SQL page...
  const client = new StreamClient(db.pool(), { listen: false });
  db.defer(() => client.close());
  await assert.rejects(client.drain('c', 's', () => undefined), CursorContentionError);
  // ...and, once the SQL page commits, holds the cursor against SQL pages for its whole life.
  await advanceCursor(a, 'c', 's', seqs[0]);
  await a.query('COMMIT');
  let refused: unknown;
  const delivered: bigint[] = [];
  await client.drain('c', 's', async (e) => {
    delivered.push(e.seq);
    await b.query(RR);
    refused = await failsWith(readPage(b, 'c', 's', 10));
    await b.query('ROLLBACK');
  });
  assert.deepEqual(delivered, seqs.slice(1));
  assert.equal(refused, 'TM001');
  // Between pages too: a tailer waiting for events still holds its cursor.
  const stop = new AbortController();
  const pages: ConsumerEvent[] = [];
  const observed = new StreamClient(db.pool(), { listen: false, pollIntervalMs: 600_000, observer: (e) => void pages.push(e) });
  db.defer(() => observed.close());
  const idle = observed.tail('c3', 's', () => undefined, { signal: stop.signal });
  idle.catch(() => undefined);
  await waitFor('the idle tailer to finish its first page', async () => pages.some((e) => e.type === 'page' && e.cursor === seqs[2]));
  await b.query(RR);
  assert.equal(await failsWith(readPage(b, 'c3', 's', 10)), 'TM001', 'a tailer between pages holds its cursor');
  await b.query('ROLLBACK');
  stop.abort();
  // Other cursors are not held.
  await b.query(RR);
  assert.deepEqual(await readPage(b, 'c2', 's', 10), seqs);
  await b.query('ROLLBACK');
});

test('a horizon above the cursor raises TM002 and delivers nothing; note_resync records it; the client reports RESYNC_REQUIRED', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 4);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('c', 's', $1)`, [seqs[0]]);
  await db.observer.query(`INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('s', $1)`, [seqs[2]]);
  const c = await db.session('consumer');
  await c.query(RR);
  await assert.rejects(readPage(c, 'c', 's', 10), { code: 'TM002', detail: `cursor=${seqs[0]} pruned_through=${seqs[2]}` });
  await c.query('ROLLBACK');
  assert.equal((await cursorRow(db))?.resyncCount, 0, 'the error rolled back with its page');
  const noted = await c.query('SELECT cursor::text, pruned_through::text FROM tidemark.note_resync($1, $2)', ['c', 's']);
  assert.deepEqual(noted.rows, [{ cursor: String(seqs[0]), pruned_through: String(seqs[2]) }]);
  assert.deepEqual(await cursorRow(db), { seq: seqs[0], resyncCount: 1 });

  const client = new StreamClient(db.pool(), { listen: false });
  db.defer(() => client.close());
  await assert.rejects(client.drain('c', 's', () => assert.fail('nothing is delivered')), (err) => {
    assert.ok(err instanceof ResyncRequiredError);
    assert.equal(err.cursor, seqs[0]);
    assert.equal(err.prunedThrough, seqs[2]);
    return true;
  });
  assert.deepEqual(await cursorRow(db), { seq: seqs[0], resyncCount: 2 });
  // A cursor at or above the horizon is not behind it: nothing to note.
  await db.observer.query(`UPDATE tidemark.cursors SET seq = $1`, [seqs[2]]);
  assert.equal((await c.query('SELECT * FROM tidemark.note_resync($1, $2)', ['c', 's'])).rowCount, 0);
  assert.equal((await cursorRow(db))?.resyncCount, 2);
});

test('a consumer role pages its own consumers only: row-level security decides', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 2);
  const role = testRole(t, 'sqlconsumer');
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['billing'])`, [role]);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('audit', 's')`);
  const c = await db.session('consumer');
  await c.query(`SET ROLE "${role}"`);
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'billing', 's', 10), seqs);
  await advanceCursor(c, 'billing', 's', seqs[1]);
  await c.query('COMMIT');
  assert.equal((await cursorRow(db, 'billing'))?.seq, seqs[1]);
  for (const consumer of ['audit', 'someone-else']) {
    await c.query(RR);
    assert.equal(await failsWith(readPage(c, consumer, 's', 10)), '42501', `${consumer}: refused`);
    await c.query('ROLLBACK');
  }
  assert.equal((await cursorRow(db, 'audit'))?.seq, 0n);
  assert.equal(await cursorRow(db, 'someone-else'), undefined);
});

test('pages of several cursors in one transaction are kept apart', async (t) => {
  const db = await testDb(t);
  const s = await publish(db, 2, 's');
  const u = await publish(db, 2, 'u');
  const c = await db.session('consumer');
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 1), s.slice(0, 1));
  assert.deepEqual(await readPage(c, 'c', 'u', 10), u);
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', s[1])), 'TM005');
  await c.query('ROLLBACK');
  await c.query(RR);
  await readPage(c, 'c', 's', 1);
  await readPage(c, 'c', 'u', 10);
  await advanceCursor(c, 'c', 's', s[0]);
  await advanceCursor(c, 'c', 'u', u[1]);
  await c.query('COMMIT');
  assert.equal((await cursorRow(db, 'c', 's'))?.seq, s[0]);
  assert.equal((await cursorRow(db, 'c', 'u'))?.seq, u[1]);
});

test("names with quotes, backslashes and other characters reach the functions intact, whatever standard_conforming_strings is", async (t) => {
  const db = await testDb(t);
  const consumer = `o'brien\\x\\' ; SELECT 1; --`;
  const stream = `s\\'" ü 😀`;
  const seqs = await publish(db, 2, stream);
  for (const conforming of ['on', 'off']) {
    const pool = db.pool({ options: `-c standard_conforming_strings=${conforming}` });
    const client = new StreamClient(pool, { listen: false });
    db.defer(() => client.close());
    const got: bigint[] = [];
    const r = await client.drain(`${consumer}${conforming}`, stream, (e) => void got.push(e.seq));
    assert.deepEqual(got, seqs, `standard_conforming_strings=${conforming}`);
    assert.equal(r.cursor, seqs[1]);
    assert.equal((await cursorRow(db, `${consumer}${conforming}`, stream))?.seq, seqs[1]);
  }
});

test("lock_page takes events read ahead only when they are all of the stream's events in their range, and only at the cursor they were read from", async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 6);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('c', 's', $1)`, [seqs[1]]);
  const c = await db.session('consumer');
  const lockPage = (after: bigint, through: bigint, events: number) =>
    c.query<{ cursor: string; safe_seq: string }>('SELECT cursor::text, safe_seq::text FROM tidemark.lock_page($1, $2, $3, $4, $5)', ['c', 's', after, through, events]);

  // Two events claimed for a range holding four: refused, nothing skipped.
  await c.query(RR);
  await assert.rejects(lockPage(seqs[1]!, seqs[5]!, 2), { code: '22023', message: /holds 4 events in .*, not 2/ });
  await c.query('ROLLBACK');
  // Beyond safe_seq: refused.
  await c.query(RR);
  await assert.rejects(lockPage(seqs[1]!, seqs[5]! + 1n, 5), { code: '22023', message: /at most safe_seq/ });
  await c.query('ROLLBACK');
  // Read from another cursor position: the page opens, but may not advance until read_page.
  await c.query(RR);
  assert.deepEqual((await lockPage(seqs[0]!, seqs[3]!, 3)).rows, [{ cursor: String(seqs[1]), safe_seq: String(seqs[5]) }]);
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', seqs[2])), 'TM005');
  await c.query('ROLLBACK');
  await c.query(RR);
  await lockPage(seqs[0]!, seqs[3]!, 3);
  assert.deepEqual(await readPage(c, 'c', 's', 2), seqs.slice(2, 4), 'read_page after it reads from the cursor');
  await advanceCursor(c, 'c', 's', seqs[3]);
  await c.query('ROLLBACK');
  // The right claim: the page may advance through it.
  await c.query(RR);
  await lockPage(seqs[1]!, seqs[5]!, 4);
  await advanceCursor(c, 'c', 's', seqs[5]);
  await c.query('COMMIT');
  assert.equal((await cursorRow(db))?.seq, seqs[5]);
});

test('read_page again in one transaction: refused (TM006) until the events it returned are advanced past', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 4);
  const c = await db.session('consumer');
  await c.query(RR);
  assert.deepEqual(await readPage(c, 'c', 's', 2), seqs.slice(0, 2));
  await assert.rejects(readPage(c, 'c', 's', 2), { code: 'TM006', message: /read events .* up to seq \d+ and advanced only to seq 0/ });
  await c.query('ROLLBACK');
  await c.query(RR);
  assert.deepEqual((await c.query(`SELECT seq FROM tidemark.read_page('c', 's', 2) UNION ALL SELECT seq FROM tidemark.read_page('c', 's', 2)`).catch((err: { code: string }) => err.code)), 'TM006', 'nor twice in one statement');
  await c.query('ROLLBACK');
  await c.query(RR);
  await readPage(c, 'c', 's', 2);
  await advanceCursor(c, 'c', 's', seqs[1]);
  assert.deepEqual(await readPage(c, 'c', 's', 10), seqs.slice(2), 'advanced past: the next page');
  await advanceCursor(c, 'c', 's', seqs[3]);
  assert.deepEqual(await readPage(c, 'c', 's', 10), [], 'and an empty page after it');
  assert.deepEqual(await readPage(c, 'c', 's', 10), [], 'which may be read again');
  await c.query('COMMIT');
  assert.equal((await cursorRow(db))?.seq, seqs[3]);
});

test('a page state set by hand does not open a page: not for the session, and not for a cursor that moved', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, 3);
  const c = await db.session('consumer');
  await c.query(RR);
  await readPage(c, 'c', 's', 10);
  const genuine = (await c.query(`SELECT current_setting('tidemark.pages') AS v`)).rows[0].v as string;
  await c.query('COMMIT');
  // The same value for the whole session, as SET (or ALTER ROLE ... SET) would leave it.
  await c.query(`SELECT set_config('tidemark.pages', $1, false)`, [genuine]);
  await c.query(RR);
  assert.equal(await failsWith(advanceCursor(c, 'c', 's', seqs[2])), 'TM004', 'another transaction\'s page');
  await c.query('ROLLBACK');
  await c.query(`RESET tidemark.pages`);
  // Within a page, a forged position: the cursor is not where the entry says.
  await c.query(RR);
  await readPage(c, 'c', 's', 10);
  await c.query(`SELECT set_config('tidemark.pages', jsonb_set(current_setting('tidemark.pages')::jsonb, ARRAY[tidemark.cursor_lock_key('c', 's')::text, '2'], $1::jsonb)::text, true)`, [String(seqs[0])]);
  await assert.rejects(advanceCursor(c, 'c', 's', seqs[2]), { code: '55000', message: /is not at seq \d+, where this transaction's page left it/ });
  await c.query('ROLLBACK');
  assert.equal((await cursorRow(db))?.seq, 0n);
});

test('sqlText: any name reads back unchanged under any standard_conforming_strings and backslash_quote', async (t) => {
  const db = await testDb(t);
  const c = await db.session('reader');
  const { sqlText } = await import('../../src/db/queryable.js');
  const fc = (await import('fast-check')).default;
  for (const settings of ["SET standard_conforming_strings = on; SET backslash_quote = safe_encoding", "SET standard_conforming_strings = off; SET backslash_quote = on"]) {
    await c.query(settings);
    await fc.assert(
      fc.asyncProperty(fc.string({ unit: 'binary', maxLength: 40 }).filter((x) => !x.includes('\u0000')), async (name) => {
        const r = await c.query(`SELECT ${sqlText(name)} AS v`);
        assert.equal(r.rows[0].v, name);
      }),
      { numRuns: 200 },
    );
  }
  assert.equal(sqlText('order-totals'), `'order-totals'`, 'a plain name stays readable');
});
