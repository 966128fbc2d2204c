import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { append, appendMany, InvalidEventError, InvalidOptionsError, type NewEvent } from '../../src/index.js';
import { closeAdmin, lastAllocatedSeq, testDb } from '../support/db.js';

after(closeAdmin);

test('append and appendMany return seqs in input order and store the fields', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const client = await pool.connect();
  await client.query('BEGIN');
  const one = await append(client, { stream: 'orders', kind: 'order.placed', key: 'o-1', payload: { total: 12 }, headers: { trace: 't1' } });
  const many = await appendMany(client, [
    { stream: 'orders', kind: 'order.paid', key: 'o-1', payload: { n: 1 } },
    { stream: 'users', kind: 'user.created', key: 'u-1' },
    { stream: 'orders', kind: 'order.shipped', key: 'o-1', payload: { n: 3, nested: { ok: true } } },
  ]);
  await client.query('COMMIT');
  assert.equal(one, 1n);
  assert.deepEqual(many, [2n, 3n, 4n]);
  const rows = await db.observer.query('SELECT seq, stream, kind, key, payload, headers FROM tidemark.events ORDER BY seq');
  assert.deepEqual(
    rows.rows.map((r) => [r.seq, r.stream, r.kind, r.key, r.payload, r.headers]),
    [
      ['1', 'orders', 'order.placed', 'o-1', { total: 12 }, { trace: 't1' }],
      ['2', 'orders', 'order.paid', 'o-1', { n: 1 }, {}],
      ['3', 'users', 'user.created', 'u-1', {}, {}],
      ['4', 'orders', 'order.shipped', 'o-1', { n: 3, nested: { ok: true } }, {}],
    ],
  );
  assert.deepEqual(await appendMany(client, []), []);
  client.release();
});

test('appendMany keeps input order for a large batch', async (t) => {
  const db = await testDb(t);
  const events = Array.from({ length: 500 }, (_, i): NewEvent => ({ stream: 's', kind: 'k', key: `k${i}`, payload: { i } }));
  const seqs = await appendMany(db.pool(), events);
  const rows = await db.observer.query<{ seq: string; i: number }>(`SELECT seq, (payload->>'i')::int AS i FROM tidemark.events`);
  const bySeq = new Map(rows.rows.map((r) => [BigInt(r.seq), r.i]));
  seqs.forEach((seq, i) => assert.equal(bySeq.get(seq), i));
});

test('bad events are rejected with a message naming the field, and nothing is written', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const good = { stream: 's', kind: 'k', key: 'x' };
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  const cases: [unknown, string, RegExp][] = [
    [{ ...good, stream: '' }, 'stream', /non-empty string/],
    [{ ...good, kind: 7 }, 'kind', /non-empty string/],
    [{ stream: 's', kind: 'k' }, 'key', /non-empty string/],
    [{ ...good, key: 'a\u0000b' }, 'key', /NUL/],
    [{ ...good, payload: [1, 2] }, 'payload', /plain JSON object/],
    [{ ...good, payload: 'text' }, 'payload', /plain JSON object/],
    [{ ...good, payload: new Date() }, 'payload', /plain JSON object/],
    [{ ...good, payload: { toJSON: () => [1] } }, 'payload', /plain JSON object/],
    [{ ...good, headers: null }, 'headers', /plain JSON object/],
    [{ ...good, payload: { s: 'a\u0000b' } }, 'payload', /^event\[0\]\.payload: \$\.s contains \\u0000/],
    [{ ...good, payload: cyclic }, 'payload', /not serialisable/],
    [{ ...good, payload: { big: 1n } }, 'payload', /\$\.big holds a BigInt/],
    [{ ...good, payload: { blob: 'x'.repeat(2000) } }, 'payload', /over the limit of 1000/],
    [{ ...good, seq: 5 }, 'seq', /assigned by the database/],
    [{ ...good, paylaod: {} }, 'paylaod', /not an event field/],
    [null, '(event)', /must be an object/],
  ];
  for (const [event, field, message] of cases) {
    await assert.rejects(append(pool, event as NewEvent, { maxEventBytes: 1000 }), (err: unknown) => {
      assert.ok(err instanceof InvalidEventError, `expected InvalidEventError for ${field}`);
      assert.equal(err.code, 'INVALID_EVENT');
      assert.equal(err.field, field);
      assert.match(err.message, message);
      return true;
    });
  }
  // One bad event in a batch: the whole batch is refused before any SQL.
  await assert.rejects(appendMany(pool, [good, good, { ...good, kind: '' }]), (err: unknown) => {
    assert.ok(err instanceof InvalidEventError);
    assert.equal(err.index, 2);
    return true;
  });
  await assert.rejects(append(pool, good, { maxEventBytes: 0 }), InvalidOptionsError);
  await assert.rejects(append(pool, good, { schema: 'No-Such' }), InvalidOptionsError);
  const count = await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events');
  assert.equal(count.rows[0].n, 0);
  assert.equal(await lastAllocatedSeq(db.observer), null, 'no sequence number was drawn');
});

test('plain SQL cannot choose a seq or change an event', async (t) => {
  const db = await testDb(t);
  const s = db.observer;
  await assert.rejects(
    s.query(`INSERT INTO tidemark.events (seq, stream, kind, key) VALUES (100, 's', 'k', 'x')`),
    /cannot insert a non-DEFAULT value into column "seq"/,
  );
  await s.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  await assert.rejects(s.query(`UPDATE tidemark.events SET seq = DEFAULT`), /events are immutable/);
  await assert.rejects(s.query(`UPDATE tidemark.events SET payload = '{"a":1}'`), /events are immutable/);
  await assert.rejects(s.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', 'x', '[1]')`), /check constraint/);
  const rows = await s.query('SELECT seq, payload FROM tidemark.events');
  assert.deepEqual(rows.rows, [{ seq: '1', payload: {} }]);
});
