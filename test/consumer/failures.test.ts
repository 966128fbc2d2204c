import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createMetrics, HandlerError, InvalidOptionsError, StreamClient, Watermarker, type ConsumerEvent, type Handler, type StreamClientOptions, type StreamEvent } from '../../src/index.js';
import { closeAdmin, testDb, testRole, waitForBlockedStatement, type TestDb } from '../support/db.js';
import { latch, Recorder } from '../support/latch.js';
import { deleteCursor, setCursor } from '../../src/consumer/cursors.js';

after(closeAdmin);

/** Appends `payloads` to stream s (keys k1, k2, ...) and publishes them. */
async function publish(db: TestDb, payloads: string[]): Promise<void> {
  const writer = await db.session('writer');
  for (const [i, p] of payloads.entries()) {
    await writer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', $1, $2)`, [`k${i + 1}`, p]);
  }
  assert.equal((await new Watermarker(db.pool()).step()).outcome, 'advanced');
}

const DEAD_LETTER = { onExhausted: 'dead-letter' } as const;

/**
 * Consumer c of stream s with the dead-letter policy, on a client of its
 * own: `payloads` published and drained, the first of them set aside by
 * `handler` (every call a poison by default), and its replay asked for.
 */
async function replayAsked(
  db: TestDb,
  payloads = ['{"poison": 1}'],
  handler: Handler = async () => { throw new Error('poison'); },
  options: StreamClientOptions = {},
): Promise<StreamClient> {
  await publish(db, payloads);
  const client = new StreamClient(db.pool(), { listen: false, ...options });
  db.defer(() => client.close());
  await client.drain('c', 's', handler, { failures: DEAD_LETTER });
  await askReplay(db);
  return client;
}

async function askReplay(db: TestDb): Promise<void> {
  await db.observer.query('UPDATE tidemark.dead_letters SET replay_requested_at = now()');
}

/** The dead letters left: tries, last error, whether a replay is asked for. */
async function deadLetters(db: TestDb): Promise<{ attempts: number; last_error: string; asked: boolean }[]> {
  return (await db.observer.query('SELECT attempts, last_error, replay_requested_at IS NOT NULL AS asked FROM tidemark.dead_letters ORDER BY seq')).rows;
}

async function cursorOf(db: TestDb, consumer = 'c'): Promise<bigint> {
  const r = await db.observer.query<{ seq: string }>(`SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = 's'`, [consumer]);
  return BigInt(r.rows[0]?.seq ?? 0);
}

/** A handler that records each call and applies the event to `applied` (primary key: a second commit of one event fails). */
function applying(calls: bigint[], fail: (e: StreamEvent, call: number) => boolean) {
  return async (e: StreamEvent, tx: { query: (text: string, values?: unknown[]) => Promise<unknown> }) => {
    calls.push(e.seq);
    await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
    if (fail(e, calls.filter((s) => s === e.seq).length)) throw new Error(`poison ${e.seq}`);
  };
}

test('a handler that fails twice, then succeeds: the events before it commit first, it is tried alone after two back-offs, and every event applies once, in order', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{}', '{}', '{}', '{}', '{}']);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, observer: events.push });
  db.defer(() => client.close());
  const calls: bigint[] = [];
  const result = await client.drain('c', 's', applying(calls, (e, call) => e.seq === 3n && call <= 2), {
    failures: { maxAttempts: 3, backoffMinMs: 20, backoffMaxMs: 1000 },
  });
  assert.equal(result.delivered, 5);
  assert.equal(result.cursor, 5n);
  // 3 fails in the first page (rolled back with 1 and 2); 1 and 2 commit; 3 alone fails, then succeeds; then the rest.
  assert.deepEqual(calls, [1n, 2n, 3n, 1n, 2n, 3n, 3n, 4n, 5n]);
  const applied = await db.observer.query<{ seq: string }>('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => Number(r.seq)), [1, 2, 3, 4, 5]);
  const retries = events.items.filter((e) => e.type === 'handler:retry');
  assert.deepEqual(retries.map((e) => [e.seq, e.attempt]), [[3n, 2], [3n, 3]]);
  // Equal jitter: half to all of the ceiling, which doubles.
  const [first, second] = retries.map((e) => e.delayMs);
  assert.ok(first! >= 10 && first! <= 20, String(first));
  assert.ok(second! >= 20 && second! <= 40, String(second));
  assert.ok(retries.every((e) => e.error instanceof Error && /poison 3/.test(e.error.message)));
  assert.equal(await cursorOf(db), 5n);
});

test("'stop' after the last try: the tail ends with a HandlerError naming seq, key and stream; the events before it committed, nothing after", async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{}', '{}', '{}']);
  const client = new StreamClient(db.pool(), { listen: false, retry: false });
  db.defer(() => client.close());
  const calls: bigint[] = [];
  const failed = await client
    .tail('c', 's', applying(calls, (e) => e.seq === 2n), { failures: { maxAttempts: 2, backoffMinMs: 1, onExhausted: 'stop' } })
    .then(
      () => assert.fail('the tail went on'),
      (err: unknown) => err,
    );
  assert.ok(failed instanceof HandlerError, String(failed));
  assert.equal(failed.seq, 2n);
  assert.equal(failed.stream, 's');
  assert.equal(failed.key, 'k2');
  assert.match(failed.message, /failed on seq 2 \(key "k2"\) of stream "s"/);
  assert.match(String((failed.cause as Error).message), /poison 2/);
  assert.deepEqual(calls, [1n, 2n, 1n, 2n]);
  assert.equal(await cursorOf(db), 1n);
  const dead = await db.observer.query('SELECT 1 FROM tidemark.dead_letters');
  assert.equal(dead.rowCount, 0);
});

test("'dead-letter': the poison event is recorded with its tries and error in the page that moves the cursor past it, and the stream goes on", async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{"n": 1}', '{"poison": true, "n": 12345678901234567890}', '{"n": 3}', '{"n": 4}']);
  const events = new Recorder<ConsumerEvent>();
  const metrics = createMetrics({ pool: db.pool(), processMetrics: false });
  const client = new StreamClient(db.pool(), {
    listen: false,
    observer: (e) => {
      events.push(e);
      metrics.consumerObserver(e);
    },
  });
  db.defer(() => client.close());
  const calls: bigint[] = [];
  const policy = { maxAttempts: 2, backoffMinMs: 1, onExhausted: 'dead-letter' } as const;
  const result = await client.drain('c', 's', applying(calls, (e) => e.payloadText.includes('poison')), { failures: policy });
  assert.equal(result.delivered, 3);
  assert.equal(result.cursor, 4n);
  assert.deepEqual(calls, [1n, 2n, 1n, 2n, 3n, 4n]);
  const applied = await db.observer.query<{ seq: string }>('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => Number(r.seq)), [1, 3, 4]);
  const dead = await db.observer.query(
    `SELECT id, consumer, stream, seq::int, kind, key, payload::text, attempts, last_error, replay_requested_at FROM tidemark.dead_letters`,
  );
  assert.equal(dead.rowCount, 1);
  const row = dead.rows[0];
  assert.deepEqual(
    { consumer: row.consumer, stream: row.stream, seq: row.seq, kind: row.kind, attempts: row.attempts, replay: row.replay_requested_at },
    { consumer: 'c', stream: 's', seq: 2, kind: 'k', attempts: 2, replay: null },
  );
  // The event as stored, big number and all.
  assert.equal(row.payload, '{"n": 12345678901234567890, "poison": true}');
  assert.match(row.last_error, /^Error: poison 2$/);
  const deadEvent = events.items.find((e) => e.type === 'dead-letter');
  assert.ok(deadEvent && deadEvent.type === 'dead-letter');
  assert.equal(deadEvent.seq, 2n);
  assert.equal(deadEvent.attempts, 2);
  assert.equal(deadEvent.id, BigInt(row.id));
  assert.equal(await cursorOf(db), 4n);
  const exposed = await metrics.registry.metrics();
  assert.match(exposed, /^tidemark_consumer_handler_retries_total\{consumer="c",stream="s"\} 1$/m);
  assert.match(exposed, /^tidemark_consumer_dead_letters_total\{consumer="c",stream="s"\} 1$/m);
  assert.match(exposed, /^tidemark_delivered_events_total\{consumer="c",stream="s"\} 3$/m);
});

test('a dead letter asked to be replayed is delivered again to the handler and deleted with its effects; a replay that fails again stays dead, one try more', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{"poison": 1}', '{}', '{"poison": 2}']);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, observer: events.push });
  db.defer(() => client.close());
  const policy = { onExhausted: 'dead-letter' } as const;
  const calls: bigint[] = [];
  await client.drain('c', 's', applying(calls, (e) => e.payloadText.includes('poison')), { failures: policy });
  assert.deepEqual((await db.observer.query('SELECT seq::int FROM tidemark.dead_letters ORDER BY seq')).rows, [{ seq: 1 }, { seq: 3 }]);

  // Both asked for; the handler now takes seq 1 and still refuses seq 3.
  await db.observer.query('UPDATE tidemark.dead_letters SET replay_requested_at = now()');
  const replayed: StreamEvent[] = [];
  const result = await client.drain(
    'c',
    's',
    async (e, tx) => {
      replayed.push(e);
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (e.seq === 3n) throw new Error('still poison');
    },
    { failures: policy },
  );
  assert.equal(result.delivered, 0); // nothing new above the cursor
  assert.deepEqual(replayed.map((e) => [e.seq, e.payloadText]), [[1n, '{"poison": 1}'], [3n, '{"poison": 2}']]);
  const applied = await db.observer.query<{ seq: string }>('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => Number(r.seq)), [1, 2]);
  const left = await db.observer.query('SELECT seq::int, attempts, last_error, replay_requested_at FROM tidemark.dead_letters');
  assert.deepEqual(left.rows, [{ seq: 3, attempts: 2, last_error: 'Error: still poison', replay_requested_at: null }]);
  const outcomes = events.items.filter((e) => e.type === 'dead-letter:replay').map((e) => [e.seq, e.error === undefined]);
  assert.deepEqual(outcomes, [[1n, true], [3n, false]]);
  // Asked for no more: a drain with the policy replays nothing.
  replayed.length = 0;
  await client.drain('c', 's', async (e) => void replayed.push(e), { failures: policy });
  assert.deepEqual(replayed, []);
});

test('a replay asked for again while a failed replay runs is kept: the try is noted in the transaction that holds the row', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  const client = await replayAsked(db, ['{"poison": 1}', '{}'], applying([], (e) => e.payloadText.includes('poison')));

  // The replay's transaction holds the dead letter's row: the operator's new request waits for it.
  const operator = await db.session('operator');
  let asked: Promise<unknown> | undefined;
  const calls: bigint[] = [];
  const handler = async (e: StreamEvent, tx: { query: (text: string, values?: unknown[]) => Promise<unknown> }) => {
    calls.push(e.seq);
    await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
    if (calls.length === 1) {
      asked = operator.query('UPDATE tidemark.dead_letters SET replay_requested_at = now() /* asked again */');
      await waitForBlockedStatement(db.observer, 'asked again');
      throw new Error('still poison');
    }
  };
  await client.drain('c', 's', handler, { failures: DEAD_LETTER });
  await asked;
  // The failed try is noted, and the request made during it is kept (served by this drain when the operator's
  // UPDATE committed before the drain looked again, else still asked for)...
  assert.deepEqual(await deadLetters(db), calls.length === 1 ? [{ attempts: 2, last_error: 'Error: still poison', asked: true }] : []);
  // ...and served: the event is applied once, the dead letter gone.
  await client.drain('c', 's', handler, { failures: DEAD_LETTER });
  assert.deepEqual(calls, [1n, 1n]);
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0);
  assert.deepEqual((await db.observer.query('SELECT seq::int FROM applied ORDER BY seq')).rows, [{ seq: 1 }, { seq: 2 }]);
});

test('a replay whose handler ended the transaction itself, then failed, is a failed try, not a broken tail', async (t) => {
  const db = await testDb(t);
  const client = await replayAsked(db);
  for (const [pass, statement] of [[2, 'ROLLBACK'], [3, 'RELEASE SAVEPOINT tidemark_replay']] as const) {
    if (pass > 2) await askReplay(db);
    await client.drain('c', 's', async (_e, tx) => {
      await tx.query(statement);
      throw new Error(`after ${statement}`);
    }, { failures: DEAD_LETTER });
    assert.deepEqual(await deadLetters(db), [{ attempts: pass, last_error: `Error: after ${statement}`, asked: false }], statement);
  }
});

test('a dead letter is replayed at most once a pass: asked for again at every failure, it does not hold the live pages back', async (t) => {
  const db = await testDb(t);
  const client = await replayAsked(db);
  // An operator (here, a trigger) who asks again at every failed try, in the transaction that notes it.
  await db.observer.query(`CREATE FUNCTION ask_again() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN UPDATE tidemark.dead_letters SET replay_requested_at = now() WHERE id = NEW.id AND replay_requested_at IS NULL; RETURN NULL; END $$`);
  await db.observer.query('CREATE TRIGGER ask_again AFTER UPDATE OF attempts ON tidemark.dead_letters FOR EACH ROW EXECUTE FUNCTION ask_again()');
  const stop = new AbortController();
  let calls = 0;
  const handler = async () => {
    calls += 1;
    if (calls > 3) stop.abort(); // a loop that never returns to live pages: end the test
    throw new Error('still poison');
  };
  for (const pass of [1, 2]) {
    const result = await client.drain('c', 's', handler, { failures: DEAD_LETTER, signal: stop.signal });
    assert.equal(result.cursor, 1n);
    assert.equal(calls, pass, `one replay in pass ${pass}`);
  }
  assert.deepEqual(await deadLetters(db), [{ attempts: 3, last_error: 'Error: still poison', asked: true }]);
});

test('a replay stopped while its handler fails with an error of its own keeps the request, no try counted', async (t) => {
  const db = await testDb(t);
  const client = await replayAsked(db);
  const stop = new AbortController();
  await assert.rejects(
    client.drain('c', 's', async () => {
      stop.abort();
      throw new Error('handler gave up: the tail is stopping');
    }, { failures: DEAD_LETTER, signal: stop.signal }),
    /handler gave up/,
  );
  assert.deepEqual(await deadLetters(db), [{ attempts: 1, last_error: 'Error: poison', asked: true }]);
});

test('a replay whose handler fails with a socket error is a failed try, as on a page: not a transient failure of the tail', async (t) => {
  const db = await testDb(t);
  const refused = async () => {
    throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED', syscall: 'connect' });
  };
  const client = await replayAsked(db, undefined, refused);
  await client.drain('c', 's', refused, { failures: DEAD_LETTER });
  assert.deepEqual(await deadLetters(db), [{ attempts: 2, last_error: 'Error ECONNREFUSED: connect ECONNREFUSED 127.0.0.1:1', asked: false }]);
});

test('a tail with the dead-letter policy replays what is asked for while it runs', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{"poison": 1}', '{}']);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, pollIntervalMs: 20, observer: events.push });
  db.defer(() => client.close());
  let cured = false;
  const stop = new AbortController();
  const tailing = client.tail(
    'c',
    's',
    async (e, tx) => {
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (!cured && e.payloadText.includes('poison')) throw new Error('poison');
    },
    { signal: stop.signal, failures: { onExhausted: 'dead-letter' } },
  );
  tailing.catch(() => undefined);
  await events.next((e) => e.type === 'page' && e.cursor === 2n);
  cured = true;
  await db.observer.query('UPDATE tidemark.dead_letters SET replay_requested_at = now()');
  await events.next((e) => e.type === 'dead-letter:replay' && e.seq === 1n && e.error === undefined);
  stop.abort();
  await assert.rejects(tailing);
  const applied = await db.observer.query<{ seq: string }>('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => Number(r.seq)), [1, 2]);
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0);
});

test('record_dead_letter is refused outside a page, for an event the page did not return, and for a consumer the role was not granted', async (t) => {
  const db = await testDb(t);
  await publish(db, ['{}', '{}']);
  const s = await db.session('sql-consumer');
  await assert.rejects(s.query(`SELECT tidemark.record_dead_letter('c', 's', 1, 1, 'x')`), (err: { code?: string }) => err.code === 'TM004');
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await s.query(`SELECT * FROM tidemark.read_page('c', 's', 1)`);
  await assert.rejects(s.query(`SELECT tidemark.record_dead_letter('c', 's', 2, 1, 'x')`), (err: { code?: string }) => err.code === 'TM005');
  await s.query('ROLLBACK');
  // Only the next event above the cursor: the ones before it are applied and advanced past first.
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await s.query(`SELECT * FROM tidemark.read_page('c', 's', 2)`);
  await assert.rejects(s.query(`SELECT tidemark.record_dead_letter('c', 's', 2, 1, 'x')`), (err: Error & { code?: string }) => err.code === 'TM005' && /not the next event above the cursor/.test(err.message));
  await s.query('ROLLBACK');
  // Through the SQL contract: read, record (which moves the cursor past it), commit.
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await s.query(`SELECT * FROM tidemark.read_page('c', 's', 1)`);
  const id = (await s.query<{ id: string }>(`SELECT tidemark.record_dead_letter('c', 's', 1, 3, 'boom') AS id`)).rows[0]!.id;
  // Moved past it already: an advance short of it is refused, one to it changes nothing.
  await s.query('SAVEPOINT short');
  await assert.rejects(s.query(`SELECT tidemark.advance_cursor('c', 's', 0)`), (err: { code?: string }) => err.code === 'TM005');
  await s.query('ROLLBACK TO SAVEPOINT short');
  assert.equal((await s.query(`SELECT tidemark.advance_cursor('c', 's', 1) AS at`)).rows[0].at, '1');
  await s.query('COMMIT');
  const row = (await db.observer.query('SELECT id::text, attempts, last_error FROM tidemark.dead_letters')).rows[0];
  assert.deepEqual(row, { id, attempts: 3, last_error: 'boom' });
  assert.equal(await cursorOf(db), 1n);

  // A consumer role sees and records the dead letters of its consumers only.
  const role = testRole(t, 'deadletters');
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['mine'])`, [role]);
  await s.query(`SET ROLE "${role}"`);
  assert.equal((await s.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0);
  await s.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await s.query(`SELECT * FROM tidemark.read_page('mine', 's', 1)`);
  await s.query(`SELECT tidemark.record_dead_letter('mine', 's', 1, 1, 'x')`);
  await s.query(`SELECT tidemark.advance_cursor('mine', 's', 1)`);
  await s.query('COMMIT');
  assert.deepEqual((await s.query('SELECT consumer FROM tidemark.dead_letters')).rows, [{ consumer: 'mine' }]);
  // Another consumer's: no page to record in, no row to insert.
  await assert.rejects(s.query(`SELECT tidemark.record_dead_letter('c', 's', 2, 1, 'x')`), (err: { code?: string }) => err.code === 'TM004');
  await assert.rejects(
    s.query(`INSERT INTO tidemark.dead_letters (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error) VALUES ('c', 's', 2, 'k', 'k', '{}', '{}', now(), 1, 'x')`),
    (err: { code?: string }) => err.code === '42501',
  );
  // Its own: the event as stored, whatever the insert says; nothing made up, nothing rewritten.
  await s.query(
    `INSERT INTO tidemark.dead_letters (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error)
     VALUES ('mine', 's', 2, 'forged', 'forged', '{"forged": true}', '{}', now(), 1, 'x')`,
  );
  const stored = (await db.observer.query(`SELECT kind, key, payload::text FROM tidemark.dead_letters WHERE consumer = 'mine' AND seq = 2`)).rows[0];
  assert.deepEqual(stored, { kind: 'k', key: 'k2', payload: '{}' });
  await assert.rejects(
    s.query(`INSERT INTO tidemark.dead_letters (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error) VALUES ('mine', 's', 99, 'k', 'k', '{}', '{}', now(), 1, 'x')`),
    (err: { code?: string }) => err.code === 'TM005',
  );
  await assert.rejects(s.query(`UPDATE tidemark.dead_letters SET payload = '{"forged": true}'`), (err: { code?: string }) => err.code === '42501');
  await s.query('RESET ROLE');
});

test('a cursor moved or rebuilt takes its dead letters with it: those it delivers again, or that a bootstrap rebuilt, go', async (t) => {
  const db = await testDb(t);
  await publish(db, ['{"poison": 1}', '{}', '{"poison": 3}', '{}', '{"poison": 5}']);
  const client = new StreamClient(db.pool(), { listen: false });
  db.defer(() => client.close());
  const policy = { onExhausted: 'dead-letter' } as const;
  const refuse = async (e: StreamEvent) => {
    if (e.payloadText.includes('poison')) throw new Error('poison');
  };
  const dead = async () => (await db.observer.query<{ seq: number }>('SELECT seq::int FROM tidemark.dead_letters ORDER BY seq')).rows.map((r) => r.seq);
  await client.drain('c', 's', refuse, { failures: policy });
  assert.deepEqual(await dead(), [1, 3, 5]);
  // Set back to 2: events 3-5 come again, so their dead letters go; 1's stays (still skipped).
  await setCursor(db.pool(), 'c', 's', 2n);
  assert.deepEqual(await dead(), [1]);
  await client.drain('c', 's', refuse, { failures: policy });
  assert.deepEqual(await dead(), [1, 3, 5]);
  // Forward: nothing delivered again, nothing goes.
  await setCursor(db.pool(), 'c', 's', 'now');
  assert.deepEqual(await dead(), [1, 3, 5]);
  // A bootstrap rebuilds everything up to its safe_seq: a replay would apply those twice.
  const snap = await client.bootstrap('c', 's');
  await snap.commit();
  assert.deepEqual(await dead(), []);
  // A deleted cursor starts again: its dead letters go with it.
  await setCursor(db.pool(), 'c', 's', 0n);
  await client.drain('c', 's', refuse, { failures: policy });
  assert.deepEqual(await dead(), [1, 3, 5]);
  await deleteCursor(db.pool(), 'c', 's');
  assert.deepEqual(await dead(), []);
});

test('a transient failure in the handler (a deadlock) is not a try: the tail retries the page, and nothing is set aside', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE applied (seq bigint PRIMARY KEY)');
  await publish(db, ['{}', '{}', '{}']);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, pollIntervalMs: 20, retryMinMs: 1, retryMaxMs: 5, observer: events.push });
  db.defer(() => client.close());
  const calls: bigint[] = [];
  const stop = new AbortController();
  const tailing = client.tail(
    'c',
    's',
    async (e, tx) => {
      calls.push(e.seq);
      await tx.query('INSERT INTO applied (seq) VALUES ($1)', [e.seq]);
      if (e.seq === 2n && calls.filter((s) => s === 2n).length === 1) throw Object.assign(new Error('deadlock detected'), { code: '40P01' });
    },
    { signal: stop.signal, failures: { onExhausted: 'dead-letter' } },
  );
  tailing.catch(() => undefined);
  await events.next((e) => e.type === 'page' && e.cursor === 3n);
  stop.abort();
  await assert.rejects(tailing);
  assert.deepEqual(calls, [1n, 2n, 1n, 2n, 3n]);
  assert.equal(events.items.filter((e) => e.type === 'retry').length, 1);
  assert.equal(events.items.filter((e) => e.type === 'handler:retry' || e.type === 'dead-letter').length, 0);
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0);
  const applied = await db.observer.query<{ seq: string }>('SELECT seq FROM applied ORDER BY seq');
  assert.deepEqual(applied.rows.map((r) => Number(r.seq)), [1, 2, 3]);
});

test('a cursor that moved past the failing event during its back-off ends the tries: nothing is set aside', async (t) => {
  const db = await testDb(t);
  await publish(db, ['{}', '{"poison": 2}', '{}', '{}', '{}', '{}']);
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, observer: events.push });
  db.defer(() => client.close());
  const calls: bigint[] = [];
  const draining = client.drain(
    'c',
    's',
    async (e) => {
      calls.push(e.seq);
      if (e.payloadText.includes('poison')) throw new Error('poison');
    },
    // A back-off of 1-2 s: the cursor moves long before it ends.
    { failures: { maxAttempts: 2, backoffMinMs: 2000, onExhausted: 'dead-letter' } },
  );
  await events.next((e) => e.type === 'handler:retry');
  // As if a page that handled seq 2 had committed and its answer was lost.
  await db.observer.query(`UPDATE tidemark.cursors SET seq = 2 WHERE consumer = 'c'`);
  const retryAt = events.items.findIndex((e) => e.type === 'handler:retry');
  const result = await draining;
  assert.equal(result.cursor, 6n);
  assert.deepEqual(calls, [1n, 2n, 1n, 3n, 4n, 5n, 6n]);
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0);
  // The try of one event alone, then whole pages again: no tries left over.
  const pages = events.items.slice(retryAt).filter((e) => e.type === 'page' && e.delivered > 0);
  assert.deepEqual(pages.map((e) => (e.type === 'page' ? e.delivered : 0)), [1, 3]);
});

test('a replay interrupted by a stop stays asked for, with no try counted', async (t) => {
  const db = await testDb(t);
  const events = new Recorder<ConsumerEvent>();
  const client = await replayAsked(db, undefined, undefined, { pollIntervalMs: 20, observer: events.push });
  const inReplay = latch();
  const stop = new AbortController();
  const tailing = client.tail(
    'c',
    's',
    async (_e, _tx, ctx) => {
      inReplay.open();
      await new Promise((_, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true }));
    },
    { signal: stop.signal, failures: DEAD_LETTER },
  );
  tailing.catch(() => undefined);
  await inReplay.promise;
  stop.abort(new Error('stopping'));
  await assert.rejects(tailing, /stopping/);
  assert.deepEqual(await deadLetters(db), [{ attempts: 1, last_error: 'Error: poison', asked: true }]);
  assert.equal(events.items.filter((e) => e.type === 'dead-letter:replay').length, 0);
});

test('the failures option is checked before anything runs, naming the field', async (t) => {
  const db = await testDb(t);
  const client = new StreamClient(db.pool(), { listen: false });
  db.defer(() => client.close());
  const h = async () => undefined;
  const bad: [unknown, RegExp][] = [
    [{ maxAttempts: 0 }, /^failures\.maxAttempts: expected an integer between 1 and 1000, got 0$/],
    [{ maxAttempts: 2.5 }, /^failures\.maxAttempts/],
    [{ onExhausted: 'skip' }, /^failures\.onExhausted: expected 'stop' or 'dead-letter', got "skip"$/],
    [{ backoffMinMs: 500, backoffMaxMs: 100 }, /^failures\.backoffMaxMs: must be at least failures\.backoffMinMs \(500\), got 100$/],
    [{ attempts: 3 }, /^attempts: is not a failures option/],
    ['3', /^failures: expected an object, got "3"$/],
  ];
  for (const [failures, message] of bad) {
    await assert.rejects(client.drain('c', 's', h, { failures: failures as never }), (err: Error) => err instanceof InvalidOptionsError && message.test(err.message.replace(/^tidemark: /, '')));
  }
  await assert.rejects(
    client.drain('c', 's', h, { failures: { onExhausted: 'dead-letter' }, beforeCommit: () => undefined }),
    (err: Error) => err instanceof InvalidOptionsError && /^failures\.onExhausted: 'dead-letter' cannot go with beforeCommit/.test(err.message.replace(/^tidemark: /, '')),
  );
  assert.equal((await db.observer.query(`SELECT 1 FROM tidemark.cursors`)).rowCount, 0);
});
