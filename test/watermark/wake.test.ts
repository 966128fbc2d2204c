/**
 * The idle loop sleeps until a writer wakes it (docs/PROTOCOL.md §3.13):
 * the arming turn, the deciding turn (try-lock, then one more look), the
 * writer's NOTIFY after it holds the fence, the resumed run, and the
 * fallback when no wake-up comes. Turns are driven one at a time, with the
 * writers between them held at lock gates and observed in pg_locks.
 */
import assert from 'node:assert/strict';
import { after, test, type TestContext } from 'node:test';
import type pg from 'pg';
import { Watermarker, type WatermarkerEvent } from '../../src/index.js';
import { fenceKey } from '../../src/db/queryable.js';
import { closeAdmin, insertEvent, safeSeq, testDb, testRole, waitFor, waitForBlockedStatement, type Session, type TestDb } from '../support/db.js';

after(closeAdmin);

/** The loop sleeps only where no transaction can be prepared (PREPARE refuses one that has notified). */
async function sleeps(db: TestDb): Promise<boolean> {
  const r = await db.observer.query<{ n: string }>('SELECT current_setting($1) AS n', ['max_prepared_transactions']);
  return Number(r.rows[0]!.n) === 0;
}

async function skipUnlessSleeps(t: TestContext, db: TestDb): Promise<boolean> {
  if (await sleeps(db)) return false;
  t.skip('max_prepared_transactions > 0 here: the loop never sleeps (the other test server runs this)');
  return true;
}

/** A connection that LISTENs on the wake channel and counts what it got, up to a round trip. */
async function wakeListener(db: TestDb): Promise<{ count(): Promise<number> }> {
  const l = await db.session('wake listener');
  let n = 0;
  l.client.on('notification', (m) => {
    if (m.channel === 'tidemark_wake') n += 1;
  });
  await l.query('LISTEN tidemark_wake');
  return {
    // A notification sent at a commit that has returned is delivered before this query's answer.
    async count() {
      await l.query('SELECT 1');
      return n;
    },
  };
}

async function wakeValue(db: TestDb): Promise<bigint> {
  const r = await db.observer.query<{ v: string }>(`SELECT pg_sequence_last_value('tidemark.wake') AS v`);
  return BigInt(r.rows[0]!.v);
}

interface Turn {
  reason: string | null;
  done: boolean;
  arming: boolean;
  leader: boolean;
  steps: number;
  safe_seq: number;
}

/**
 * The loop's state in a temporary table of `c`'s session, and one turn at a
 * time as the procedure's shell runs it (the tick, then COMMIT), without
 * the sleeps it plans: the test decides when the next turn runs.
 */
async function loop(c: Session, options: { resume?: boolean; graceMs?: number } = {}) {
  await c.query('DROP TABLE IF EXISTS st');
  await c.query(
    `CREATE TEMP TABLE st AS SELECT tidemark.watermarker_start('x', 10000, 60000, NULL, 1, 100, ${options.graceMs ?? 0}, false, true, 100, true, ${options.resume ?? false}) AS r`,
  );
  return async (): Promise<Turn> => {
    await c.query(`DO $$ DECLARE v tidemark.watermarker_loop; BEGIN
      v := (SELECT s.r FROM st s); v.sleep_s := NULL;
      v := tidemark.watermarker_tick(v);
      UPDATE st SET r = v;
    END $$`);
    const r = await c.query(
      `SELECT (r).reason, (r).done, coalesce((r).arming, false) AS arming, (r).leader, (r).steps::int, (r).safe_seq::int FROM st`,
    );
    return r.rows[0] as Turn;
  };
}

/** A BEFORE STATEMENT trigger after the fence's (names fire in order) that waits at gate 4242 in sessions that ask for it. */
async function installGate(db: TestDb): Promise<void> {
  await db.observer.query(`CREATE FUNCTION public.test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF current_setting('test.gate', true) = 'on' THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF;
      RETURN NULL;
    END $$`);
  await db.observer.query('CREATE TRIGGER events_gate BEFORE INSERT ON tidemark.events FOR EACH STATEMENT EXECUTE FUNCTION public.test_gate()');
}

test('idle, the loop arms wake, then ends asleep; a writer then notifies at its commit, and a resumed run disarms and publishes without writing the lease', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const c = await db.session('loop');
  const listener = await wakeListener(db);
  const turn = await loop(c);

  assert.equal((await turn()).leader, true, 'the first turn takes the lease');
  const before = BigInt(Date.now());
  const arming = await turn();
  assert.deepEqual([arming.arming, arming.done], [true, false], 'idle past the grace (0): this turn arms');
  assert.ok((await wakeValue(db)) > before, 'wake holds an instant to come');
  assert.deepEqual([(await turn()).reason, (await c.query('SELECT (r).done FROM st')).rows[0].done], ['asleep', true]);
  assert.equal(await listener.count(), 0, 'nobody wrote: no wake-up');

  const w = await db.session('writer');
  assert.equal(await insertEvent(w), 1n);
  assert.equal(await listener.count(), 1, "the writer's commit sent one wake-up");

  const lease = async () => (await db.observer.query('SELECT lease_expires_at FROM tidemark.watermark')).rows[0].lease_expires_at as Date;
  const expiry = await lease();
  const resumed = await loop(c, { resume: true });
  assert.equal((await resumed()).leader, true, 'the resumed run keeps its lease');
  assert.equal(await wakeValue(db), 0n, 'and disarms wake');
  assert.deepEqual(await lease(), expiry, 'a lease not yet due for renewal is not written');
  assert.deepEqual([(await resumed()).steps, await safeSeq(db.observer)], [1, 1n], 'the next turn publishes');

  assert.equal(await insertEvent(w), 2n);
  assert.equal(await listener.count(), 1, 'awake, writers do not notify');
});

test('the deciding turn: a writer holding the fence before drawing keeps the loop awake (the try-lock), and so does a number drawn after the arming (the last look)', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  await installGate(db);
  const c = await db.session('loop');
  const listener = await wakeListener(db);
  const gate = await db.session('gate');
  await gate.query('SELECT pg_advisory_lock(4242)');
  const w = await db.session('writer');
  await w.query(`SET test.gate = 'on'`);
  // W holds the fence and has read wake (0: the loop is awake) but drawn no number.
  const inserted = insertEvent(w);
  await waitForBlockedStatement(db.observer, 'INSERT INTO');

  const turn = await loop(c);
  await turn();
  assert.equal((await turn()).arming, true, 'no number drawn: the loop arms');
  const held = await turn();
  assert.deepEqual([held.reason, held.done], [null, false], 'the fence is held: the loop stays awake');
  assert.equal(await wakeValue(db), 0n, 'and disarms');
  assert.equal((await turn()).arming, true, 'idle still: it arms again');

  // W draws and commits after the arming, having read wake before it: no wake-up.
  await gate.query('SELECT pg_advisory_unlock(4242)');
  assert.equal(await inserted, 1n);
  assert.equal(await listener.count(), 0);
  const drawn = await turn();
  assert.deepEqual([drawn.reason, drawn.done], [null, false], 'the last look finds the number: awake');
  assert.equal(await wakeValue(db), 0n);
  assert.deepEqual([(await turn()).steps, await safeSeq(db.observer)], [1, 1n], 'and publishes it at once');
});

test('a writer that waited for the fence while the loop armed reads wake after it gets the fence, and notifies', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const c = await db.session('loop');
  const listener = await wakeListener(db);
  const turn = await loop(c);
  await turn();
  // Another session holds the exclusive side: the writer waits in its trigger, before reading wake.
  const x = await db.session('exclusive');
  await x.query('SELECT pg_advisory_lock($1::bigint)', [fenceKey('tidemark').toString()]);
  const w = await db.session('writer');
  const inserted = insertEvent(w);
  await waitForBlockedStatement(db.observer, 'INSERT INTO');
  assert.equal((await turn()).arming, true);
  await x.query('SELECT pg_advisory_unlock($1::bigint)', [fenceKey('tidemark').toString()]);
  assert.equal(await inserted, 1n);
  assert.equal(await listener.count(), 1, 'it read wake armed');
  const decided = await turn();
  assert.equal(decided.done, false, 'and the loop, seeing the number, stays awake');
});

test('the idle grace runs from the last publication, whichever run made it: a run that begins in a pause of a flow does not arm at its first idle look', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const c = await db.session('loop');
  let turn = await loop(c, { graceMs: 60_000 });
  await turn();
  await insertEvent(await db.session('writer'));
  assert.equal((await turn()).steps, 1, 'published');
  // A new run, as after a run's end: its first idle look is within the grace of that publication.
  turn = await loop(c, { graceMs: 60_000 });
  await turn();
  const look = await turn();
  assert.deepEqual([look.arming, look.done], [false, false], 'within the grace: awake');
  // The same run start long after the last publication arms at once.
  await db.observer.query(`UPDATE tidemark.watermark SET updated_at = now() - interval '2 minutes'`);
  turn = await loop(c, { graceMs: 60_000 });
  await turn();
  assert.equal((await turn()).arming, true, 'past the grace: it arms');
});

test('a resumed run whose lease was released meanwhile ends "released" and does not take it again', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const c = await db.session('loop');
  const turn = await loop(c);
  await turn();
  await turn();
  assert.equal((await turn()).reason, 'asleep');
  await db.observer.query(`SELECT tidemark.release_lease('x')`);
  const run = (await c.query(`CALL tidemark.run_watermarker('x', p_run_ms => 1000, p_sleep => true, p_resume => true)`)).rows[0];
  assert.deepEqual([run.reason, run.leader, run.lease_owner], ['released', false, null]);
  assert.equal((await db.observer.query('SELECT lease_owner FROM tidemark.watermark')).rows[0].lease_owner, null);
});

/** Runs `wm` until the test ends, then stops it and releases its lease. */
function runUntilTheEnd(db: TestDb, wm: Watermarker): void {
  const ac = new AbortController();
  const running = wm.run(ac.signal);
  db.defer(async () => {
    ac.abort();
    await running;
    await wm.close();
  });
}

/**
 * Puts `intercept` between each connection `pool` opens and its queries:
 * it gets the connection, the statement's text and how to send it (the
 * original arguments, or others).
 */
function interceptQueries(pool: pg.Pool, intercept: (client: pg.PoolClient, text: string, send: (...args: unknown[]) => unknown, args: unknown[]) => unknown): void {
  pool.on('connect', (client) => {
    const send = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as { query: unknown }).query = (...args: unknown[]) =>
      intercept(client, (typeof args[0] === 'string' ? args[0] : (args[0] as { text?: string }).text) ?? '', send, args);
  });
}

test('run(): asleep, a commit wakes the loop; with the wake-up lost it runs again within summaryIntervalMs, and never publishes a writer still in flight', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const events: WatermarkerEvent[] = [];
  const wm = new Watermarker(db.pool(), { owner: 'wm', idleGraceMs: 0, summaryIntervalMs: 1500, observer: (e) => void events.push(e) });
  runUntilTheEnd(db, wm);
  const asleepAfter = (i: number) => waitFor('the loop asleep', async () => events.slice(i).some((e) => e.type === 'run' && e.summary.reason === 'asleep'));
  const wakeAfter = (i: number) => waitFor('a wake', async () => events.slice(i).find((e) => e.type === 'wake'));

  await asleepAfter(0);
  let mark = events.length;
  const w = await db.session('writer');
  assert.equal(await insertEvent(w), 1n);
  const woken = await wakeAfter(mark);
  assert.equal(woken.type === 'wake' && woken.cause, 'notified', "the writer's commit woke the loop");
  await waitFor('1 published', async () => (await safeSeq(db.observer)) === 1n);

  // The wake-up lost: wake cleared under the sleeping loop, so the next writer does not notify.
  mark = events.length;
  await asleepAfter(mark);
  await db.observer.query(`SELECT setval('tidemark.wake', 0, true)`);
  mark = events.length;
  await w.query('BEGIN');
  assert.equal(await insertEvent(w), 2n);
  const wake = await wakeAfter(mark);
  assert.equal(wake.type === 'wake' && wake.cause, 'timeout', 'no wake-up came: the loop ran again by itself');
  // The run after it finds the writer in flight and holds its number back.
  await waitFor('a step that found the writer in flight', async () =>
    events.slice(mark).some((e) => e.type === 'run' && e.summary.pending > 0),
  );
  assert.equal(await safeSeq(db.observer), 1n, 'not published while its writer is in flight');
  await w.query('COMMIT');
  await waitFor('2 published once committed', async () => (await safeSeq(db.observer)) === 2n);
});

/**
 * Runs a Watermarker on `db` until it sleeps with its next claim sent, then
 * commits an event and waits for its publication. Returns what the loop's
 * connection (the one that CALLs the loop) sent, in order, with the loop's
 * runs and wake-ups between: 'claim', 'call resume=true|false', 'other',
 * 'run <reason>', 'wake <cause>'. `stallOnWakeMs` blocks the process that
 * long as it wakes (a process descheduled, or a slow observer);
 * `clockJumpOnWakeMs` moves the wall clock (Date.now) that far ahead as it
 * wakes, as a host suspended during the sleep would.
 */
async function wokenRun(db: TestDb, { stallOnWakeMs = 0, clockJumpOnWakeMs = 0 } = {}): Promise<string[]> {
  const seen: { client?: unknown; what: string }[] = [];
  const pool = db.pool();
  interceptQueries(pool, (client, text, send, args) => {
    const what = /claim_owner/.test(text) ? 'claim' : /run_watermarker/.test(text) ? `call resume=${/p_resume => true/.test(text)}` : 'other';
    seen.push({ client, what });
    Date.now = realNow; // the jump lasts until the woken run's decision is sent
    return send(...args);
  });
  const realNow = Date.now;
  db.defer(() => (Date.now = realNow));
  const log = () => {
    const loop = seen.find((x) => x.what.startsWith('call'))?.client;
    return seen.filter((x) => x.client === undefined || x.client === loop).map((x) => x.what);
  };
  const wm = new Watermarker(pool, {
    owner: 'wm',
    idleGraceMs: 0,
    summaryIntervalMs: 1500,
    observer: (e) => {
      if (e.type === 'run') seen.push({ what: `run ${e.summary.reason}` });
      if (e.type !== 'wake') return;
      seen.push({ what: `wake ${e.cause}` });
      const until = performance.now() + stallOnWakeMs;
      while (performance.now() < until);
      if (clockJumpOnWakeMs !== 0 && Date.now === realNow) Date.now = () => realNow() + clockJumpOnWakeMs;
    },
  });
  runUntilTheEnd(db, wm);
  await waitFor('the loop asleep, its next claim sent', async () => log().includes('run asleep') && log().lastIndexOf('claim') > log().indexOf('run asleep'));
  assert.equal(await insertEvent(await db.session('writer')), 1n);
  await waitFor('1 published', async () => (await safeSeq(db.observer)) === 1n);
  const lines = log();
  assert.ok(lines.indexOf('wake notified') > 0, `the commit woke the loop: ${lines.join(', ')}`);
  return lines;
}

test('run(): the run a writer wakes starts with its CALL: the owner was claimed as the sleep began, not after the wake-up', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const lines = await wokenRun(db);
  const woken = lines.indexOf('wake notified');
  assert.equal(lines[woken + 1], 'call resume=true', `after the wake-up, the CALL comes first: ${lines.join(', ')}`);
  assert.deepEqual(lines.slice(lines.lastIndexOf('run asleep', woken), woken), ['run asleep', 'claim'], 'the sleep began with the claim');
});

test('run(): a claim made ahead that is older than one run when the loop runs (the process stalled) is made again first', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  // summaryIntervalMs is 1500: the claim made as the sleep began is older than that once the wake-up stalls 1600 ms.
  const lines = await wokenRun(db, { stallOnWakeMs: 1600 });
  const woken = lines.indexOf('wake notified');
  assert.deepEqual(lines.slice(woken + 1, woken + 3), ['claim', 'call resume=true'], lines.join(', '));
});

test('run(): a claim made ahead is made again when either clock says it is older than one run: the wall clock ahead (a host suspended during the sleep), or set back during a stall', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  for (const jump of [{ clockJumpOnWakeMs: 60_000 }, { stallOnWakeMs: 1600, clockJumpOnWakeMs: -60_000 }]) {
    const lines = await wokenRun(await testDb(t), jump);
    const woken = lines.indexOf('wake notified');
    assert.deepEqual(lines.slice(woken + 1, woken + 3), ['claim', 'call resume=true'], `${JSON.stringify(jump)}: ${lines.join(', ')}`);
  }
});

test('run(): a claim made ahead that fails ends the sleep: the next run reports the error and the loop runs again on a new connection', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const pool = db.pool();
  let asleep = false;
  let failed = false;
  interceptQueries(pool, (_client, text, send, args) => {
    if (!asleep || failed || !/claim_owner/.test(text)) return send(...args);
    // The first claim made ahead fails (22012), on a connection that lives on.
    failed = true;
    return send('SELECT 1 / 0');
  });
  const events: string[] = [];
  const errors: unknown[] = [];
  const wm = new Watermarker(pool, {
    owner: 'wm',
    idleGraceMs: 0,
    summaryIntervalMs: 1500,
    retryMinMs: 10,
    onError: (err) => void errors.push(err),
    observer: (e) => {
      if (e.type === 'run' && e.summary.reason === 'asleep') asleep = true;
      if (e.type === 'wake') events.push(`wake ${e.cause}`);
      if (e.type === 'retry') events.push('retry');
      if (e.type === 'run') events.push(`run ${e.summary.reason}`);
    },
  });
  runUntilTheEnd(db, wm);
  await waitFor('the failed claim reported', async () => events.includes('retry'));
  const at = events.indexOf('retry');
  assert.equal(events[at - 1], 'wake closed', `the sleep ended with the connection: ${events.join(', ')}`);
  assert.ok(errors.some((err) => (err as { code?: string }).code === '22012'), 'the claim\'s error was reported');
  await waitFor('a run on a new connection', async () => events.slice(at).some((e) => e.startsWith('run ')));
  assert.equal(await insertEvent(await db.session('writer')), 1n);
  await waitFor('1 published', async () => (await safeSeq(db.observer)) === 1n);
});

test('where transactions may be prepared, the loop never sleeps, so writers never notify', async (t) => {
  const db = await testDb(t);
  if (await sleeps(db)) {
    t.skip('max_prepared_transactions = 0 here (the embedded test server enables it and runs this)');
    return;
  }
  const c = await db.session('loop');
  const listener = await wakeListener(db);
  const turn = await loop(c);
  await turn();
  for (let i = 0; i < 5; i += 1) {
    const r = await turn();
    assert.deepEqual([r.arming, r.done], [false, false], `turn ${i}: idle, but awake`);
  }
  assert.equal(await wakeValue(db), 0n);
  await insertEvent(await db.session('writer'));
  assert.equal(await listener.count(), 0);
});

test('a writer needs no privilege on wake: with every sequence of the schema revoked from PUBLIC, a writer role inserts, and wakes the loop', async (t) => {
  const db = await testDb(t);
  if (await skipUnlessSleeps(t, db)) return;
  const role = testRole(t, 'wake_writer');
  await db.observer.query(`CREATE ROLE ${role} LOGIN`);
  await db.observer.query('SELECT tidemark.grant_writer($1)', [role]);
  await db.observer.query('REVOKE ALL ON ALL SEQUENCES IN SCHEMA tidemark FROM PUBLIC');
  const listener = await wakeListener(db);
  const c = await db.session('loop');
  const turn = await loop(c);
  await turn();
  await turn();
  assert.equal((await turn()).reason, 'asleep');
  const w = await db.session('writer');
  await w.query(`SET ROLE ${role}`);
  assert.equal(await insertEvent(w), 1n);
  assert.equal(await listener.count(), 1);
});

test('p_sleep with a run longer than the lease renewal interval is refused: asleep, nothing would renew the lease', async (t) => {
  const db = await testDb(t);
  const c = await db.session('loop');
  await assert.rejects(
    c.query(`CALL tidemark.run_watermarker('x', p_run_ms => 5000, p_lease_ttl_ms => 9000, p_sleep => true)`),
    (err: { code?: string; message: string }) => err.code === '22023' && /p_run_ms \(5000\) must not exceed the lease renewal interval \(3000 ms\)/.test(err.message),
  );
  assert.equal((await db.observer.query('SELECT lease_owner FROM tidemark.watermark')).rows[0].lease_owner, null, 'nothing taken');
});
