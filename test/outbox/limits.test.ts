/**
 * One set of event limits (src/outbox/limits.ts), checked by append and
 * appendMany before anything is sent and by the database (migration 0005)
 * for every other writer, at the same boundaries.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type pg from 'pg';
import {
  append,
  appendMany,
  InvalidEventError,
  InvalidOptionsError,
  loadMigrations,
  migrate,
  StreamClient,
  Watermarker,
  type NewEvent,
} from '../../src/index.js';
import { EVENT_LIMITS } from '../../src/outbox/limits.js';
import { closeAdmin, lastAllocatedSeq, testDb } from '../support/db.js';

after(closeAdmin);

const good = { stream: 's', kind: 'k', key: 'x' };
const emoji = '\u{1F600}'; // two UTF-16 code units, four UTF-8 bytes

/** `payload` whose stored text (`{"p": "xxx"}`) is exactly `bytes` long. */
function payloadOfSize(bytes: number): { p: string } {
  return { p: 'x'.repeat(bytes - '{"p": ""}'.length) };
}

/** Events at each limit, and one past it, for every field. */
const boundaries: { field: string; at: NewEvent; over: NewEvent }[] = [
  { field: 'stream', at: { ...good, stream: 's'.repeat(200) }, over: { ...good, stream: 's'.repeat(201) } },
  { field: 'stream', at: { ...good, stream: emoji.repeat(100) }, over: { ...good, stream: `${emoji.repeat(100)}s` } },
  { field: 'stream', at: { ...good, stream: '\u00e9'.repeat(200) }, over: { ...good, stream: '\u00e9'.repeat(201) } },
  { field: 'kind', at: { ...good, kind: 'k'.repeat(200) }, over: { ...good, kind: 'k'.repeat(201) } },
  { field: 'key', at: { ...good, key: '\u20ac'.repeat(256) }, over: { ...good, key: '\u20ac'.repeat(257) } },
  { field: 'headers', at: { ...good, headers: payloadOfSize(65536) }, over: { ...good, headers: payloadOfSize(65537) } },
  {
    field: 'payload',
    at: { ...good, payload: payloadOfSize(EVENT_LIMITS.eventMaxBytes - 2) },
    over: { ...good, payload: payloadOfSize(EVENT_LIMITS.eventMaxBytes - 1) },
  },
];

async function count(db: { observer: { query: pg.Client['query'] } }): Promise<number> {
  return (await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n;
}

test('append refuses every field past its limit, naming index and field, and writes nothing (a 300-character stream, a 2 MiB key)', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const cases: [NewEvent, string, RegExp][] = [
    [{ ...good, stream: 's'.repeat(300) }, 'stream', /is 300 characters \(UTF-16 code units\) long, over the limit of 200/],
    [{ ...good, key: 'k'.repeat(2 * 1024 * 1024) }, 'key', /is 2097152 characters .* over the limit of 256/],
    [{ ...good, key: `a\ud800b` }, 'key', /lone UTF-16 surrogate/],
    [{ ...good, headers: { blob: 'h'.repeat(70_000) } }, 'headers', /bytes as stored, over the limit of 65536/],
    [{ ...good, payload: { blob: 'p'.repeat(2 * 1024 * 1024) } }, 'payload', /over the limit of 1048576/],
  ];
  for (const [event, field, message] of cases) {
    await assert.rejects(appendMany(pool, [good, event]), (err: unknown) => {
      assert.ok(err instanceof InvalidEventError, `expected InvalidEventError for ${field}, got ${String(err)}`);
      assert.equal(err.index, 1);
      assert.equal(err.field, field);
      assert.match(err.message, message);
      assert.ok(err.message.length < 200, 'the message does not echo the value');
      return true;
    });
  }
  assert.equal(await count(db), 0);
  assert.equal(await lastAllocatedSeq(db.observer), null, 'nothing reached the database');
});

test('append and the database accept each limit exactly and refuse one past it, for every field', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  for (const { field, at, over } of boundaries) {
    await append(pool, at);
    await assert.rejects(append(pool, over), (err: unknown) => err instanceof InvalidEventError && err.field === field);
    // A plain-SQL writer gets the same answer, in one clear line naming the column.
    const sql = `INSERT INTO tidemark.events (stream, kind, key, payload, headers) VALUES ($1, $2, $3, $4, $5)`;
    const values = (e: NewEvent) => [e.stream, e.kind, e.key, JSON.stringify(e.payload ?? {}), JSON.stringify(e.headers ?? {})];
    await db.observer.query(sql, values(at));
    await assert.rejects(db.observer.query(sql, values(over)), (err: pg.DatabaseError) => {
      assert.equal(err.code, '23514');
      assert.equal(err.column, field);
      assert.match(err.constraint ?? '', /^events_\w+_limit$/);
      assert.match(err.message, new RegExp(`^tidemark events\\.${field}: \\d+ .*, over the limit of \\d+$`));
      return true;
    });
  }
  assert.equal(await count(db), boundaries.length * 2);
});

test('a stream at the limit is one a consumer can follow; one past it is refused by both sides', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const client = new StreamClient(pool);
  const watermarker = new Watermarker(pool);
  db.defer(() => Promise.all([client.close(), watermarker.close()]));
  for (const { at, over } of boundaries.filter((b) => b.field === 'stream')) {
    const [seq] = await appendMany(pool, [at]);
    await watermarker.step();
    const delivered: bigint[] = [];
    await client.drain('c', at.stream, (event) => void delivered.push(event.seq));
    assert.deepEqual(delivered, [seq]);
    await assert.rejects(append(pool, over), InvalidEventError);
    await assert.rejects(client.drain('c', over.stream, () => undefined), InvalidOptionsError);
  }
});

test('values JSON.stringify would change, or PostgreSQL cannot store, are refused naming field and path', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const cases: [NewEvent, string, RegExp][] = [
    [{ ...good, payload: { price: NaN } }, 'payload', /\$\.price holds NaN/],
    [{ ...good, payload: { items: [{ n: 1 }, { n: Infinity }] } }, 'payload', /\$\.items\[1\]\.n holds Infinity/],
    [{ ...good, headers: { t: -Infinity } }, 'headers', /\$\.t holds -Infinity/],
    [{ ...good, payload: { id: 10n } }, 'payload', /\$\.id holds a BigInt/],
    [{ ...good, payload: { name: 'a\ud800' } }, 'payload', /\$\.name contains a lone UTF-16 surrogate/],
    [{ ...good, payload: { ['\udc00']: 1 } }, 'payload', /lone UTF-16 surrogate/],
    [{ ...good, payload: { text: 'nul\u0000' } }, 'payload', /\$\.text contains \\u0000/],
    [{ ...good, payload: { toJSON: () => undefined } }, 'payload', /plain JSON object/],
  ];
  for (const [event, field, message] of cases) {
    await assert.rejects(append(pool, event), (err: unknown) => {
      assert.ok(err instanceof InvalidEventError, `expected InvalidEventError, got ${String(err)}`);
      assert.equal(err.field, field);
      assert.match(err.message, message);
      return true;
    });
  }
  assert.equal(await lastAllocatedSeq(db.observer), null, 'nothing reached the database');
  // What JSON can hold is stored as JSON.stringify writes it; nulls stay nulls.
  await append(pool, { ...good, payload: { n: null, big: Number.MAX_VALUE, tiny: 5e-324, list: [null, 1.5] } });
  const stored = await db.observer.query(`SELECT payload FROM tidemark.events`);
  assert.deepEqual(stored.rows[0].payload, { n: null, big: Number.MAX_VALUE, tiny: 5e-324, list: [null, 1.5] });
});

test('unknown append options are refused, naming the option', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  for (const options of [{ bogus: 1 }, { schema: 'tidemark', maxEventByte: 10 }]) {
    await assert.rejects(append(pool, good, options as object), (err: unknown) => {
      assert.ok(err instanceof InvalidOptionsError);
      assert.equal(err.option, Object.keys(options).at(-1));
      assert.match(err.message, /is not an append option \(known: schema, maxEventBytes, traceContext\)/);
      return true;
    });
    await assert.rejects(appendMany(pool, [good], options as object), InvalidOptionsError);
  }
  await assert.rejects(append(pool, good, null as unknown as object), InvalidOptionsError);
  // maxEventBytes may lower the limit, not raise it past what the database enforces.
  await assert.rejects(append(pool, good, { maxEventBytes: EVENT_LIMITS.eventMaxBytes + 1 }), /maxEventBytes: expected an integer between 4 and 1048576/);
  assert.equal(await count(db), 0);
});

test('migration 0005 keeps existing rows past the limits (NOT VALID) and holds every new row to them', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 1 });
  // A schema at version 4, holding rows that version 5 would refuse.
  await db.observer.query('DROP SCHEMA tidemark CASCADE');
  const migrations = await loadMigrations();
  await db.observer.query(`CREATE SCHEMA tidemark`);
  await db.observer.query(`CREATE TABLE tidemark.migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
  for (const m of migrations.filter((m) => m.id <= 4)) {
    await db.observer.query(m.sql);
    await db.observer.query(`INSERT INTO tidemark.migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
  }
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES (repeat('s', 300), 'k', repeat('k', 100000))`);

  const { applied } = await migrate(pool);
  assert.equal(applied[0]?.name, '0005_event_limits.sql');
  assert.equal(await count(db), 1, 'the old row is still there');
  await assert.rejects(
    db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES (repeat('s', 300), 'k', 'x')`),
    /tidemark events\.stream: 300 characters \(UTF-16 code units\), over the limit of 200/,
  );
  // Checking the old rows is the operator's explicit choice.
  await assert.rejects(db.observer.query('ALTER TABLE tidemark.events VALIDATE CONSTRAINT events_stream_limit'), /over the limit of 200/);
});
