import assert from 'node:assert/strict';
import pg from 'pg';
import { after, test } from 'node:test';
import { Watermarker, type WatermarkerEvent, type WatermarkProgress } from '../../src/index.js';
import { closeAdmin, fenceLocks, insertEvent, lockWaiters, safeSeq, testDb, testRole, waitFor, waitForBlockedStatement, type Session, type TestDb } from '../support/db.js';

after(closeAdmin);

const outcome = (p: WatermarkProgress) => [p.outcome, p.safeSeq];

test('a lower seq held open while higher writers commit: they never wait, safe_seq stays below it, and the first step after its commit passes it', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool());

  // Neither an unrelated writer (an xid on another table) nor a long
  // REPEATABLE READ report over the events table is an outbox writer.
  const unrelated = await db.session('unrelated');
  await unrelated.query('BEGIN');
  await unrelated.query('CREATE TABLE side (x int)');
  await unrelated.query('INSERT INTO side VALUES (1)');
  const report = await db.session('report');
  await report.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await report.query('SELECT count(*) FROM tidemark.events');
  await insertEvent(await db.session('w0'));
  assert.deepEqual(outcome(await wm.step()), ['advanced', 1n]);

  // The slow writer draws seq 2 and stays open.
  const slow = await db.session('slow');
  await slow.query('BEGIN');
  assert.equal(await insertEvent(slow), 2n);
  // Higher writers commit around steps, and none of them waits on a lock.
  const fast = await db.session('fast');
  for (const seq of [3n, 4n, 5n]) {
    assert.equal(await insertEvent(fast), seq);
    const p = await wm.step();
    assert.deepEqual(outcome(p), ['pending', 1n], 'safe_seq stays below the open seq 2');
    assert.equal(p.holders, 1);
    assert.equal(p.holderPath, 'pg_locks');
    assert.deepEqual(await lockWaiters(observer), [], 'no backend waits on a lock');
  }
  assert.deepEqual(
    (await fenceLocks(observer)).map((l) => [l.pid, l.mode, l.granted]),
    [[slow.pid, 'ShareLock', true]],
    'the steps took no lock on the fence: only the slow writer holds it',
  );

  // It commits: the first step after it publishes past it.
  await slow.query('COMMIT');
  const p = await wm.step();
  assert.deepEqual(outcome(p), ['advanced', 5n]);
  assert.equal(p.pending, 0);
  await unrelated.query('ROLLBACK');
  await report.query('COMMIT');
  await wm.close();
});

test('under writers that overlap without pause, every step publishes what the writers of the step before it could hold', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool());
  // Writers hand over: each begins (drawing a seq) before the previous one
  // commits, so some writer holds the fence at every step.
  const sessions: Session[] = [];
  for (let i = 0; i < 3; i += 1) sessions.push(await db.session(`w${i}`));
  let open = sessions[0]!;
  await open.query('BEGIN');
  assert.equal(await insertEvent(open), 1n);
  assert.equal((await wm.step()).outcome, 'pending');
  for (let seq = 2n; seq <= 8n; seq += 1n) {
    const next = sessions[Number(seq) % sessions.length]!;
    await next.query('BEGIN');
    assert.equal(await insertEvent(next), seq);
    await open.query('COMMIT');
    open = next;
    assert.ok((await fenceLocks(observer)).length > 0, 'a writer holds the fence at every step');
    const p = await wm.step();
    // The observation taken one step earlier (through seq - 1) waited only
    // for the writer that has just committed.
    assert.deepEqual(outcome(p), ['advanced', seq - 1n]);
    assert.equal(p.pending, 1);
  }
  await open.query('COMMIT');
  assert.deepEqual(outcome(await wm.step()), ['advanced', 8n]);
  await wm.close();
});

test('a savepoint rolled back or a failed statement never leaves a hole; a seq drawn in a released savepoint waits for its transaction', async (t) => {
  const db = await testDb(t);
  const wm = new Watermarker(db.pool());
  const [w1, w2] = [await db.session('w1'), await db.session('w2')];
  await w1.query('BEGIN');
  await w1.query('SAVEPOINT a');
  assert.equal(await insertEvent(w1), 1n);
  await w1.query('ROLLBACK TO SAVEPOINT a'); // seq 1 will never exist; its lock is gone with it
  assert.deepEqual(await fenceLocks(db.observer), [], 'the shared lock taken in the savepoint was released with it');
  assert.equal(await insertEvent(w2), 2n);
  assert.deepEqual(outcome(await wm.step()), ['advanced', 2n], 'seq 1 can never appear: nothing waits for it');

  await w1.query('SAVEPOINT b');
  assert.equal(await insertEvent(w1), 3n);
  await w1.query('RELEASE SAVEPOINT b'); // the lock passes to the transaction
  assert.equal(await insertEvent(w2), 4n);
  assert.deepEqual(outcome(await wm.step()), ['pending', 2n]);
  // A statement that draws seq 5 and fails aborts w1 there and then: its
  // locks go at the error, before its ROLLBACK, and seqs 3 and 5 with them.
  await assert.rejects(w1.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', 'x', '[]')`), /check constraint/);
  // The server sends the error before it aborts the transaction (and node-pg
  // rejects at the error, not at ReadyForQuery): the next statement on w1 is
  // read only once that abort is done, and is refused because w1 is aborted.
  await assert.rejects(w1.query('SELECT 1'), /current transaction is aborted/);
  assert.deepEqual(await fenceLocks(db.observer), []);
  assert.deepEqual(outcome(await wm.step()), ['advanced', 5n]);
  await w1.query('ROLLBACK');
  const all = await db.observer.query('SELECT array_agg(seq::int ORDER BY seq) AS seqs FROM tidemark.events');
  assert.deepEqual(all.rows[0].seqs, [2, 4]);
  await wm.close();
});

test('a prepared transaction holding an event keeps safe_seq below it until COMMIT PREPARED, and status names it', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const max = Number((await observer.query('SHOW max_prepared_transactions')).rows[0].max_prepared_transactions);
  if (max === 0) {
    t.skip('the server has max_prepared_transactions = 0 (the embedded test server enables it)');
    return;
  }
  const wm = new Watermarker(db.pool());
  const gid = `tidemark-test-${db.name}`;
  db.defer(() => observer.query(`ROLLBACK PREPARED '${gid}'`).catch(() => undefined));
  const p = await db.session('preparer');
  await p.query('BEGIN');
  assert.equal(await insertEvent(p), 1n);
  assert.equal(await insertEvent(await db.session('w2')), 2n);
  // Observed before PREPARE, under the writer's backend...
  assert.deepEqual(outcome(await wm.step()), ['pending', 0n]);
  const before = (await fenceLocks(observer)).map((l) => l.pid);
  await p.query(`PREPARE TRANSACTION '${gid}'`);
  // ...then held by the prepared transaction, which has no backend.
  assert.deepEqual((await fenceLocks(observer)).map((l) => l.pid), [null]);
  assert.deepEqual(before, [p.pid]);
  assert.equal(await insertEvent(await db.session('w3')), 3n);
  for (let i = 0; i < 3; i += 1) assert.deepEqual(outcome(await wm.step()), ['pending', 0n], 'the prepared seq 1 holds safe_seq back');

  const blocking = (await observer.query('SELECT pid, prepared_gid, state FROM tidemark.blocking_writers()')).rows;
  assert.deepEqual(blocking, [{ pid: null, prepared_gid: gid, state: 'prepared' }]);

  await observer.query(`COMMIT PREPARED '${gid}'`);
  assert.deepEqual(outcome(await wm.step()), ['advanced', 3n]);
  assert.deepEqual((await observer.query('SELECT * FROM tidemark.blocking_writers()')).rows, []);
  await wm.close();
});

test('a sequence altered to CACHE 20 makes the step fail with a clear error and publish nothing; back at CACHE 1 it starts afresh', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const errors: unknown[] = [];
  const wm = new Watermarker(db.pool(), { onError: (e) => errors.push(e) });
  await insertEvent(await db.session('w1'));
  assert.deepEqual(outcome(await wm.step()), ['advanced', 1n]);

  await observer.query('ALTER SEQUENCE tidemark.events_seq_seq CACHE 20');
  const cached = await db.session('cached');
  assert.equal(await insertEvent(cached), 2n); // this session now holds 3..21 in its cache
  await assert.rejects(wm.step(), (err: Error & { code?: string; hint?: string }) => {
    assert.equal(err.code, '55000');
    assert.match(err.message, /events_seq_seq must be CACHE 1, INCREMENT > 0, NO CYCLE \(it is CACHE 20, INCREMENT 1, NO CYCLE\)/);
    assert.match(err.hint ?? '', /ALTER SEQUENCE "tidemark"\.events_seq_seq CACHE 1/);
    return true;
  });
  assert.equal(await safeSeq(observer), 1n, 'nothing was published');
  const row = (await observer.query('SELECT cardinality(candidates) AS n FROM tidemark.watermark')).rows[0];
  assert.equal(row.n, 0, 'nothing was remembered either');

  // Back to CACHE 1: the sequence got a new file, so the first step drops
  // what it knew and publishes nothing; the one after may.
  await observer.query('ALTER SEQUENCE tidemark.events_seq_seq CACHE 1');
  assert.deepEqual(outcome(await wm.step()), ['pending', 1n]);
  assert.deepEqual(outcome(await wm.step()), ['advanced', 21n], 'the numbers cached under CACHE 20 are gone for good');
  assert.equal(await insertEvent(cached), 22n, 'the session cache was dropped with the old file');

  // The catalog edited by hand (a superuser), no new file: still refused.
  await observer.query(`UPDATE pg_sequence SET seqcache = 20 WHERE seqrelid = 'tidemark.events_seq_seq'::regclass`);
  db.defer(() => observer.query(`UPDATE pg_sequence SET seqcache = 1 WHERE seqrelid = 'tidemark.events_seq_seq'::regclass`));
  await insertEvent(cached);
  await assert.rejects(wm.step(), { code: '55000' });
  await wm.close();
});

test('the step bounds only its wait for the watermark row: the caller\'s lock_timeout is in force again for the commit', async (t) => {
  const db = await testDb(t);
  const s = db.observer;
  await s.query(`UPDATE tidemark.watermark SET lease_owner = 'x', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  await insertEvent(await db.session('writer'));
  await s.query('BEGIN');
  await s.query(`SET LOCAL lock_timeout = '7s'`);
  assert.equal((await s.query(`SELECT outcome FROM tidemark.watermark_step('x')`)).rows[0].outcome, 'advanced');
  // A 200 ms bound left in force would also bound the COMMIT's wait for the
  // cluster-wide notify lock, and a timeout there would lose the publication.
  assert.equal((await s.query('SHOW lock_timeout')).rows[0].lock_timeout, '7s');
  await s.query('COMMIT');
  assert.equal(await safeSeq(s), 1n);
});

test('a sequence set back below safe_seq: the step drops what it remembered, then fails with a clear error and publishes nothing', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool());
  for (let i = 0; i < 3; i += 1) await insertEvent(await db.session(`w${i}`));
  assert.deepEqual(outcome(await wm.step()), ['advanced', 3n]);
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 1)`);
  assert.deepEqual(outcome(await wm.step()), ['rewound', 3n]);
  await assert.rejects(wm.step(), (err: Error & { code?: string; hint?: string }) => {
    assert.equal(err.code, '55000');
    assert.match(err.message, /identity sequence "tidemark"\.events_seq_seq is at 1, below safe_seq 3/);
    assert.match(err.hint ?? '', /Set it to at least safe_seq with setval/);
    return true;
  });
  assert.equal(await safeSeq(observer), 3n);
  await wm.close();
});

test('a sequence set back while an observation waits: the observation is dropped, so a writer drawing a number again is waited for', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool());
  const w = await db.session('w');
  for (let i = 0; i < 5; i += 1) await insertEvent(w);
  assert.deepEqual(outcome(await wm.step()), ['advanced', 5n]);
  // A draws 6..10 and stays open; a step remembers (10, {A}).
  const a = await db.session('a');
  await a.query('BEGIN');
  for (let i = 0; i < 5; i += 1) await insertEvent(a);
  assert.deepEqual(outcome(await wm.step()), ['pending', 5n]);
  // A rolls back; an operator "fixes" the sequence to max(seq); B draws 6 again.
  await a.query('ROLLBACK');
  await observer.query(`SELECT setval('tidemark.events_seq_seq', (SELECT max(seq) FROM tidemark.events))`);
  const b = await db.session('b');
  await b.query('BEGIN');
  assert.equal(await insertEvent(b), 6n);
  // Without the check, (10, {A}) would be published now, over B's open 6.
  assert.deepEqual(outcome(await wm.step()), ['rewound', 5n]);
  assert.deepEqual(outcome(await wm.step()), ['pending', 5n], 'B is waited for');
  await b.query('COMMIT');
  assert.deepEqual(outcome(await wm.step()), ['advanced', 6n]);
  await wm.close();
});

/** A session stepping by hand as owner 'x' (the lease set directly), with the step's WARNINGs collected. */
async function stepper(db: TestDb): Promise<{ step: () => Promise<{ outcome: string; safe_seq: string; last_seq: string | null }>; warnings: string[] }> {
  await db.observer.query(`UPDATE tidemark.watermark SET lease_owner = 'x', lease_expires_at = clock_timestamp() + interval '10 minutes'`);
  const s = await db.session('stepper');
  const warnings: string[] = [];
  s.client.on('notice', (n) => void warnings.push(n.message ?? ''));
  return { step: async () => (await s.query(`SELECT outcome, safe_seq, last_seq FROM tidemark.watermark_step('x')`)).rows[0], warnings };
}

/** A stepper, and a writer whose first `n` events a step has published. */
async function published(db: TestDb, n: number) {
  const stepping = await stepper(db);
  const w = await db.session('w');
  for (let i = 0; i < n; i += 1) await insertEvent(w);
  assert.deepEqual(await stepping.step(), { outcome: 'advanced', safe_seq: String(n), last_seq: String(n) });
  return { ...stepping, w };
}

const seqHigh = async (db: TestDb) => (await db.observer.query('SELECT seq_high::int AS n FROM tidemark.watermark')).rows[0].n as number;

test('a sequence restarted forward, or set forward with setval(..., false), stands at the number before the next it hands out: no false rewind, and what was drawn before is published', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const { step, warnings, w } = await published(db, 3);

  // pg_sequence_last_value is NULL until the restarted sequence hands out a
  // number. That is not a sequence at 0 (version 4 took it for a rewind,
  // then failed every step "below safe_seq" until a writer drew): no
  // number below 1000 is handed out from now on, so S is 999.
  await observer.query('ALTER SEQUENCE tidemark.events_seq_seq RESTART WITH 1000');
  assert.equal((await observer.query(`SELECT pg_sequence_last_value('tidemark.events_seq_seq') AS v`)).rows[0].v, null);
  // The restart gave the sequence a new file: the step that sees it starts
  // afresh (publishing nothing), and the next one publishes.
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '3', last_seq: '999' });
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '999', last_seq: '999' });
  assert.deepEqual(await step(), { outcome: 'idle', safe_seq: '999', last_seq: '999' });
  assert.equal(await insertEvent(w), 1000n);
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '1000', last_seq: '1000' });

  // setval(..., false) keeps the file: published at once.
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 2000, false)`);
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '1999', last_seq: '1999' });
  assert.equal(await insertEvent(w), 2000n);
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '2000', last_seq: '2000' });
  // Set to the number after the last drawn: nothing changes.
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 2001, false)`);
  assert.deepEqual(await step(), { outcome: 'idle', safe_seq: '2000', last_seq: '2000' });

  // Events committed after the last step and before the sequence is set
  // forward are published without another number drawn, by the loop too.
  for (let i = 0; i < 2; i += 1) await insertEvent(w);
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 3000, false)`);
  const run = (await observer.query(`CALL tidemark.run_watermarker('x', p_run_ms => 300)`)).rows[0];
  assert.deepEqual([run.reason, run.safe_seq], ['timeout', '2999']);
  assert.equal(run.steps, '1', 'one step, then looks: the sequence stands at safe_seq');
  assert.deepEqual(warnings, []);
  assert.equal(await seqHigh(db), 2999);
});

test('a writer in flight when the sequence is set forward with setval(..., false) is waited for, and published once it commits, with nothing more drawn', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const { step } = await stepper(db);
  const open = await db.session('open');
  await open.query('BEGIN');
  assert.equal(await insertEvent(open), 1n);
  assert.equal(await insertEvent(await db.session('w2')), 2n);
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '0', last_seq: '2' });

  await observer.query(`SELECT setval('tidemark.events_seq_seq', 100, false)`);
  // Nothing drawn since: S is 99, and the writer of 1 still holds it back.
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '0', last_seq: '99' });
  await open.query('COMMIT');
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '99', last_seq: '99' });

  // The loop does the same, though the sequence has handed out nothing
  // since it was set, and publishes once the writer is gone.
  const late = await db.session('late');
  await late.query('BEGIN');
  assert.equal(await insertEvent(late), 100n);
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '99', last_seq: '100' });
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 200, false)`);
  await late.query('COMMIT');
  const run = (await observer.query(`CALL tidemark.run_watermarker('x', p_run_ms => 300)`)).rows[0];
  assert.deepEqual([run.reason, run.safe_seq], ['timeout', '199']);
  assert.equal(await safeSeq(observer), 199n);
});

test('a sequence set back with setval(..., false) is a rewind at the next step, before any number is drawn again: then the clear error, nothing published', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const { step, warnings } = await published(db, 5);
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 2, false)`);
  // It hands out 2 next: S is 1.
  assert.deepEqual(await step(), { outcome: 'rewound', safe_seq: '5', last_seq: '1' });
  assert.match(warnings.join('\n'), /went back from 5 to 1/);
  await assert.rejects(step(), (err: Error & { code?: string }) => {
    assert.equal(err.code, '55000');
    assert.match(err.message, /is at 1, below safe_seq 5/);
    return true;
  });
  // The loop ends with the error too, and publishes nothing.
  await assert.rejects(observer.query(`CALL tidemark.run_watermarker('x', p_run_ms => 300)`), /is at 1, below safe_seq 5/);
  assert.equal(await safeSeq(observer), 5n);
});

test('a number given back with setval(..., false) after its writer rolled back is a rewind: the writer drawing it again is waited for, not skipped', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const { step, warnings } = await published(db, 5);
  // A draws 6 and stays open; a step sees it.
  const a = await db.session('a');
  await a.query('BEGIN');
  assert.equal(await insertEvent(a), 6n);
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '5', last_seq: '6' });
  // A rolls back, and an operator gives the number back. The step must not
  // take "nothing drawn since" for S = 6 with no writer in flight: B is
  // about to draw 6.
  await a.query('ROLLBACK');
  await observer.query(`SELECT setval('tidemark.events_seq_seq', 6, false)`);
  assert.deepEqual(await step(), { outcome: 'rewound', safe_seq: '5', last_seq: '5' });
  assert.match(warnings.join('\n'), /went back from 6 to 5/);
  const b = await db.session('b');
  await b.query('BEGIN');
  assert.equal(await insertEvent(b), 6n);
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '5', last_seq: '6' });
  await b.query('COMMIT');
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '6', last_seq: '6' });
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM tidemark.events WHERE seq <= 6')).rows[0].n, 6);
});

test('TRUNCATE ... RESTART IDENTITY is a rewind at the next step, then the clear error', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const { step } = await published(db, 3);
  await observer.query('TRUNCATE tidemark.events RESTART IDENTITY');
  assert.deepEqual(await step(), { outcome: 'rewound', safe_seq: '3', last_seq: '0' });
  await assert.rejects(step(), /is at 0, below safe_seq 3/);
  assert.equal(await safeSeq(observer), 3n);
});

test('observations from another server lifetime are dropped, not published', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool());
  const open = await db.session('open');
  await open.query('BEGIN');
  assert.equal(await insertEvent(open), 1n);
  assert.equal(await insertEvent(await db.session('w2')), 2n);
  assert.deepEqual(outcome(await wm.step()), ['pending', 0n]);
  // Stand in for a restart: the stored observation names a writer that no
  // longer exists (as after a restart), and carries another epoch. Were it
  // trusted, seq 2 would be published while seq 1 is still open.
  await observer.query(
    `UPDATE tidemark.watermark SET candidates = ARRAY[ROW(2, ARRAY['999/999'], now())::tidemark.watermark_candidate],
            candidates_epoch = pg_postmaster_start_time() - interval '1 day'`,
  );
  const p = await wm.step();
  assert.deepEqual(outcome(p), ['pending', 0n]);
  assert.equal(p.pending, 1, 'only the fresh observation is kept');
  await open.query('COMMIT');
  assert.deepEqual(outcome(await wm.step()), ['advanced', 2n]);
  await wm.close();
});

test('a long writer: the remembered observations stay bounded and spread out, so a second long writer does not hold back what the first one did not', async (t) => {
  const db = await testDb(t);
  const wm = new Watermarker(db.pool());
  const l1 = await db.session('l1');
  await l1.query('BEGIN');
  assert.equal(await insertEvent(l1), 1n);
  const w = await db.session('w');
  let last = 1n;
  for (let i = 0; i < 40; i += 1) {
    last = await insertEvent(w);
    const p = await wm.step();
    assert.equal(p.outcome, 'pending');
    assert.ok(p.pending <= 32, `at most 32 observations, got ${p.pending}`);
  }
  const stored = (await db.observer.query('SELECT cardinality(candidates) AS n, (candidates[cardinality(candidates)]).seq AS newest FROM tidemark.watermark')).rows[0];
  assert.deepEqual(stored, { n: 32, newest: last.toString() });
  // A second long writer begins, a step sees both, then the first commits.
  const l2 = await db.session('l2');
  await l2.query('BEGIN');
  assert.equal(await insertEvent(l2), last + 1n);
  assert.equal((await wm.step()).outcome, 'pending');
  await l1.query('COMMIT');
  assert.deepEqual(outcome(await wm.step()), ['advanced', last], 'everything before the second writer is published');
  await l2.query('COMMIT');
  assert.deepEqual(outcome(await wm.step()), ['advanced', last + 1n]);
  await wm.close();
});

test('a role that may not read the identity sequence gets a clear permission error, not an idle step', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const role = testRole(t, 'stepper');
  await observer.query(`CREATE ROLE ${role}`);
  await observer.query(`GRANT USAGE ON SCHEMA tidemark TO ${role}`);
  await observer.query(`GRANT SELECT, UPDATE ON tidemark.watermark TO ${role}`);
  await observer.query(`GRANT EXECUTE ON FUNCTION tidemark.watermark_step(text, boolean, boolean) TO ${role}`);
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = 'x', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  await insertEvent(await db.session('writer'));
  const s = await db.session('stepper');
  await s.query(`SET ROLE ${role}`);
  await assert.rejects(s.query(`SELECT * FROM tidemark.watermark_step('x')`), { code: '42501' });
  assert.equal(await safeSeq(observer), 0n);
});

test('the try-lock path proves no writer is in flight without reading pg_locks, and never leaves the fence held', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const fast = new Watermarker(db.pool(), { owner: 'fast' });
  await insertEvent(await db.session('w1'));
  const p = await fast.step();
  assert.deepEqual([p.outcome, p.holderPath, p.holders], ['advanced', 'try_lock', 0]);
  assert.deepEqual(await fenceLocks(observer), [], 'released in the same expression');
  await fast.close();

  const slow = new Watermarker(db.pool(), { owner: 'slow', tryLockFirst: false });
  await insertEvent(await db.session('w2'));
  const q = await slow.step();
  assert.deepEqual([q.outcome, q.holderPath, q.holders], ['advanced', 'pg_locks', 0]);
  await slow.close();
});

test('idle steps read no locks and write nothing', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const wm = new Watermarker(db.pool(), { leaseTtlMs: 600_000, heartbeatIntervalMs: 600_000 });
  await insertEvent(await db.session('writer'));
  assert.equal((await wm.step()).outcome, 'advanced');
  const version = async () => (await observer.query(`SELECT xmin::text AS v FROM tidemark.watermark`)).rows[0].v;
  const before = await version();
  for (let i = 0; i < 20; i += 1) {
    const p = await wm.step();
    assert.deepEqual([p.outcome, p.holderPath, p.holders, p.heartbeat], ['idle', null, null, 'throttled']);
  }
  assert.equal(await version(), before, 'no idle step rewrote the watermark row');
  await wm.close();
});

test('each publication sends one NOTIFY carrying safe_seq, delivered with its commit', async (t) => {
  const db = await testDb(t);
  const wm = new Watermarker(db.pool());
  const listener = new pg.Client({ connectionString: db.url });
  listener.on('error', () => undefined);
  await listener.connect();
  db.defer(() => listener.end());
  const received: string[] = [];
  listener.on('notification', (n) => received.push(n.payload ?? ''));
  await listener.query('LISTEN tidemark_watermark');

  await insertEvent(await db.session('writer 1'));
  assert.equal((await wm.step()).outcome, 'advanced');
  assert.equal((await wm.step()).outcome, 'idle');
  await waitFor('the notification', async () => received.length > 0);
  assert.equal((await listener.query(`SELECT safe_seq FROM tidemark.watermark`)).rows[0].safe_seq, '1', 'visible when it arrives');
  const open = await db.session('open');
  await open.query('BEGIN');
  await insertEvent(open);
  await insertEvent(await db.session('writer 3'));
  assert.equal((await wm.step()).outcome, 'pending');
  await open.query('COMMIT');
  assert.equal((await wm.step()).outcome, 'advanced');
  await waitFor('the second notification', async () => received.length > 1);
  assert.deepEqual(received, ['1', '3'], 'one per advancement; none for the idle or pending step');
  await wm.close();
});

test('an operator holding the watermark row makes a step fail after its short bound: nothing written, no writer waits', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const seen: WatermarkerEvent[] = [];
  const wm = new Watermarker(db.pool(), { observer: (e) => seen.push(e) });
  await insertEvent(await db.session('writer'));
  assert.equal((await wm.step()).outcome, 'advanced');
  await insertEvent(await db.session('writer 2'));
  const operator = await db.session('operator');
  await operator.query('BEGIN');
  await operator.query('SELECT * FROM tidemark.watermark FOR UPDATE');
  // The step waits for the row at most its lock_timeout (200 ms), then fails
  // while the row is still held; a writer meanwhile commits without waiting.
  const held = wm.step().then(() => assert.fail('should fail'), (err: { code?: string }) => err);
  await waitForBlockedStatement(observer, 'watermark_step');
  assert.equal(await insertEvent(await db.session('writer 3')), 3n);
  assert.equal((await held).code, '55P03');
  assert.equal(await safeSeq(observer), 1n, 'nothing written');
  await operator.query('ROLLBACK');
  assert.deepEqual(outcome(await wm.step()), ['advanced', 3n]);
  assert.deepEqual(
    seen.map((e) => (e.type === 'step' ? e.progress.outcome : e.type)),
    ['advanced', 'advanced'],
  );
  await wm.close();
});

test('a step on a pooled connection left inside a transaction rolls that transaction back instead of committing it', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query('CREATE TABLE app_work (id int)');
  const pool = db.pool({ max: 1 });
  const wm = new Watermarker(pool);
  await insertEvent(await db.session('writer'));
  const leaker = await pool.connect();
  await leaker.query('BEGIN');
  await leaker.query('INSERT INTO app_work VALUES (1)');
  leaker.release(); // a bug in some other user of the pool: back inside its transaction

  await assert.rejects(wm.step(), { code: '25001' });
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM app_work')).rows[0].n, 0, 'the leaked work was not committed');
  // The lease taken inside the leaked transaction was rolled back with it:
  // the next step learns it is not the leader, the one after takes the lease.
  assert.equal((await wm.step()).outcome, 'not_leader');
  assert.deepEqual(outcome(await wm.step()), ['advanced', 1n]);
  await wm.close();
});

test('a writer cannot skip the fence by shadowing the lock function on its search_path', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query('CREATE SCHEMA evil');
  await observer.query(`CREATE FUNCTION evil.pg_advisory_xact_lock_shared(bigint) RETURNS void LANGUAGE sql AS ''`);
  const writer = await db.session('writer');
  await writer.query('SET search_path = evil, pg_catalog');
  await writer.query('BEGIN');
  await insertEvent(writer);
  assert.ok((await fenceLocks(observer)).some((l) => l.pid === writer.pid && l.mode === 'ShareLock' && l.granted));
  await writer.query('ROLLBACK');
});

test('writer pools end abandoned transactions, releasing the shared fence', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const writers = db.pool({ idleInTransactionTimeoutMs: 100 });
  const setting = await writers.query('SHOW idle_in_transaction_session_timeout');
  assert.equal(setting.rows[0].idle_in_transaction_session_timeout, '100ms');
  const defaults = await db.pool().query('SHOW idle_in_transaction_session_timeout');
  assert.equal(defaults.rows[0].idle_in_transaction_session_timeout, '1min');

  const client = await writers.connect();
  client.on('error', () => undefined);
  await client.query('BEGIN');
  await insertEvent(client);
  assert.equal((await fenceLocks(observer)).length, 1);
  await waitFor('the abandoned writer to be ended', async () => (await fenceLocks(observer)).length === 0);
  client.release(true);
});

test('a watermarker of an earlier version keeps stepping through the old signatures, and no longer waits for the fence', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await insertEvent(await db.session('writer'));
  await observer.query(`UPDATE tidemark.watermark SET lease_owner = 'old', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  const row = (await observer.query(`SELECT * FROM tidemark.watermark_step('old', true, 50, false)`)).rows[0];
  assert.deepEqual([row.outcome, row.safe_seq], ['advanced', '1']);
  const open = await db.session('open');
  await open.query('BEGIN');
  await insertEvent(open);
  await insertEvent(await db.session('writer 3'));
  // It asks to block for ten minutes; it returns at once, 'busy', taking no lock.
  const busy = (await observer.query(`SELECT * FROM tidemark.watermark_step('old', true, 600000, false, 50)`)).rows[0];
  assert.deepEqual([busy.outcome, busy.safe_seq], ['busy', '1']);
  assert.deepEqual((await fenceLocks(observer)).map((l) => l.pid), [open.pid]);
  await open.query('COMMIT');
  const done = (await observer.query(`SELECT * FROM tidemark.watermark_step('old', false, 5, false, 5)`)).rows[0];
  assert.deepEqual([done.outcome, done.safe_seq], ['advanced', '3']);
});
