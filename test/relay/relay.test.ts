import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Pruner, Relay, ResyncRequiredError, SinkError, Watermarker, type RelayEvent } from '../../src/index.js';
import { closeAdmin, insertEvent, testDb, waitFor, type TestDb } from '../support/db.js';
import { latch, Recorder } from '../support/latch.js';
import { brokerDown, MemorySink, poisoned } from '../support/memory-sink.js';

after(closeAdmin);

const FAST = { listen: false, pollIntervalMs: 20, retryMinMs: 5, retryMaxMs: 20 } as const;

/** Writes `streams` in turn, one event each, and publishes them; returns the seqs per stream. */
async function write(db: TestDb, streams: string[]): Promise<Map<string, bigint[]>> {
  const writer = await db.session('writer');
  const seqs = new Map<string, bigint[]>();
  for (const stream of streams) {
    const seq = await insertEvent(writer, stream);
    seqs.set(stream, [...(seqs.get(stream) ?? []), seq]);
  }
  await writer.client.end();
  assert.equal((await new Watermarker(db.pool(), { owner: 'test' }).step()).outcome, 'advanced');
  return seqs;
}

async function cursor(db: TestDb, consumer: string, stream: string): Promise<bigint> {
  const r = await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = $2', [consumer, stream]);
  return BigInt(r.rows[0]?.seq ?? '0');
}

test('relays each stream in seq order, every event once, and commits each cursor at its last acknowledged event', async (t) => {
  const db = await testDb(t);
  const streams = Array.from({ length: 25 }, (_, i) => (i % 3 === 0 ? 'a' : 'b'));
  const written = await write(db, streams);
  const sink = new MemorySink();
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['a', 'b'], batchSize: 4 });
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  await waitFor('every event acknowledged', async () => sink.acked.length === 25);
  stop.abort();
  await running;
  await relay.close();

  assert.deepEqual({ ...sink.target, origin: undefined, onRetry: undefined }, { schema: 'tidemark', streams: ['a', 'b'], republishWithinMs: relay.republishWithinMs, origin: undefined, onRetry: undefined });
  assert.equal(typeof sink.target!.onRetry, 'function', "the hook a sink tells its own retries to (the relay's retry events with seq)");
  assert.match(sink.target!.origin, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'the origin id, read from the watermark row');
  for (const stream of ['a', 'b']) {
    const got = sink.acked.filter((m) => m.event.stream === stream);
    assert.deepEqual(got.map((m) => m.event.seq), written.get(stream), `stream ${stream}: in seq order, each once`);
    assert.deepEqual(got.map((m) => m.id), written.get(stream)!.map((seq) => `tidemark:${seq}`));
    assert.ok(sink.calls.every((call) => call.length <= 4), 'a publish is one page');
    assert.equal(await cursor(db, 'relay', stream), written.get(stream)!.at(-1));
  }
  assert.ok(sink.closed, 'close() closes the sink');
});

test('the cursor never passes an event the broker has not acknowledged; a failed publish is sent again from the cursor', async (t) => {
  const db = await testDb(t);
  const written = (await write(db, ['s', 's', 's', 's', 's'])).get('s')!;
  const sink = new MemorySink();
  const gate = latch();
  sink.gate = gate.promise;
  const started = latch<readonly unknown[]>();
  sink.onPublish = (messages) => started.open(messages);
  sink.failures.push(brokerDown());
  const events = new Recorder<RelayEvent>();
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['s'], observer: events.push });
  db.defer(() => relay.close());
  const stop = new AbortController();
  const running = relay.run(stop.signal);

  const retry = await events.next((e) => e.type === 'retry');
  assert.equal(retry.type === 'retry' && retry.source, 'sink');
  assert.ok(retry.type === 'retry' && retry.error instanceof SinkError && retry.error.retryable);
  assert.equal(await cursor(db, 'relay', 's'), 0n, 'a failed publish commits nothing');

  await started.promise;
  await waitFor('the second publish to wait for its acknowledgements', async () => sink.calls.length === 2);
  assert.equal(await cursor(db, 'relay', 's'), 0n, 'no commit while acknowledgements are outstanding');
  assert.deepEqual(sink.calls[0]!.map((m) => m.event.seq), written, 'the page went out whole');
  assert.deepEqual(sink.calls[1]!.map((m) => m.event.seq), [written[0]], 'after the failure, from the cursor, its first event alone');
  gate.open();
  const published = await events.next((e) => e.type === 'published' && !e.partial);
  assert.equal(published.type === 'published' && published.cursor, written.at(-1));
  await waitFor('the cursor to commit after the acknowledgements', async () => (await cursor(db, 'relay', 's')) === written.at(-1));
  assert.deepEqual(sink.acked.map((m) => m.event.seq), written);
  stop.abort();
  await running;
});

test('a message the broker can never take stops the relay with an error naming its seq; the cursor stays before it', async (t) => {
  const db = await testDb(t);
  const written = (await write(db, ['s', 's', 's'])).get('s')!;
  const sink = new MemorySink();
  sink.failures.push(poisoned(written[0]!));
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['s'] });
  db.defer(() => relay.close());
  // Raced against any acknowledgement: a relay that retried (or skipped) the poisoned event would publish the rest.
  const outcome = await Promise.race([
    relay.run().then(() => 'resolved', (err: unknown) => err),
    waitFor('an acknowledgement', async () => sink.acked.length > 0).then(() => 'acknowledged'),
  ]);
  assert.ok(outcome instanceof SinkError && !outcome.retryable && outcome.seq === written[0], `stopped with the sink's error, got ${String(outcome)}`);
  assert.equal(await cursor(db, 'relay', 's'), 0n);
  assert.equal(sink.acked.length, 0);
});

test('a broker that takes only a few messages at a time (a full queue) still lets the relay advance, in seq order', async (t) => {
  const db = await testDb(t);
  const written = (await write(db, Array.from({ length: 7 }, () => 's'))).get('s')!;
  const sink = new MemorySink();
  sink.acceptPerCall = 2;
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['s'], batchSize: 7 });
  db.defer(() => relay.close());
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  await waitFor('the cursor to reach the last event', async () => (await cursor(db, 'relay', 's')) === written.at(-1));
  stop.abort();
  await running;
  const first = [...new Set(sink.acked.map((m) => m.event.seq))];
  assert.deepEqual(first, written, 'every event, first arrivals in seq order');
  t.diagnostic(`publish calls ${sink.calls.length}, messages acknowledged ${sink.acked.length} for ${written.length} events`);
});

test('stopping while a publish waits for its acknowledgements: they finish, the cursor commits, run resolves', async (t) => {
  const db = await testDb(t);
  const written = (await write(db, ['s', 's', 's', 's'])).get('s')!;
  const sink = new MemorySink();
  const gate = latch();
  sink.gate = gate.promise;
  const started = latch();
  sink.onPublish = () => started.open();
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['s'] });
  db.defer(() => relay.close());
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  await started.promise;
  stop.abort();
  gate.open();
  await running;
  assert.deepEqual(sink.acked.map((m) => m.event.seq), written);
  assert.equal(await cursor(db, 'relay', 's'), written.at(-1));
});

test('events pruned before the relay read them end it with RESYNC_REQUIRED; nothing is skipped or sent', async (t) => {
  const db = await testDb(t);
  await write(db, ['s', 's', 's']);
  const pruned = await new Pruner(db.pool(), { retentionMs: 0, allowShortRetention: true }).prune();
  assert.equal(pruned.deleted, 3);
  const sink = new MemorySink();
  const relay = new Relay(db.pool(), sink, { ...FAST, consumer: 'relay', streams: ['s'] });
  db.defer(() => relay.close());
  await assert.rejects(relay.run(), ResyncRequiredError);
  assert.equal(sink.calls.length, 0);
  assert.equal(await cursor(db, 'relay', 's'), 0n);
});

test('a broker that cannot be reached at start is retried; a second relay of the same consumer stands by and takes over', async (t) => {
  const db = await testDb(t);
  const first = (await write(db, ['s', 's'])).get('s')!;
  const sink1 = new MemorySink();
  sink1.openFailure = brokerDown();
  const events1 = new Recorder<RelayEvent>();
  const relay1 = new Relay(db.pool(), sink1, { ...FAST, consumer: 'relay', streams: ['s'], observer: events1.push });
  db.defer(() => relay1.close());
  const stop1 = new AbortController();
  const running1 = relay1.run(stop1.signal);
  await events1.next((e) => e.type === 'retry' && e.source === 'sink');
  await events1.next((e) => e.type === 'published');

  const sink2 = new MemorySink();
  const events2 = new Recorder<RelayEvent>();
  const relay2 = new Relay(db.pool(), sink2, { ...FAST, consumer: 'relay', streams: ['s'], observer: events2.push });
  db.defer(() => relay2.close());
  const stop2 = new AbortController();
  const running2 = relay2.run(stop2.signal);
  await events2.next((e) => e.type === 'retry' && e.source === 'database'); // the cursor is held
  stop1.abort();
  await running1;
  const second = (await write(db, ['s', 's'])).get('s')!;
  await waitFor('the standby to relay the new events', async () => sink2.acked.length === 2);
  stop2.abort();
  await running2;
  assert.deepEqual(sink1.acked.map((m) => m.event.seq), first);
  assert.deepEqual(sink2.acked.map((m) => m.event.seq), second, 'the standby starts after what the first one committed');
});

test('options are checked before anything connects', (t) => {
  const pool = { connect() {} } as never;
  const sink = new MemorySink();
  assert.throws(() => new Relay(pool, sink, { consumer: '', streams: ['s'] }), /consumer/);
  assert.throws(() => new Relay(pool, sink, { consumer: 'c', streams: [] }), /streams: expected a non-empty array/);
  assert.throws(() => new Relay(pool, sink, { consumer: 'c', streams: ['s', 's'] }), /streams: names "s" twice/);
  assert.throws(() => new Relay(pool, sink, { consumer: 'c', streams: ['s'], bogus: 1 } as never), /bogus: is not a Relay option/);
  assert.throws(() => new Relay(pool, {} as never, { consumer: 'c', streams: ['s'] }), /sink: expected a Sink/);
  const relay = new Relay(pool, sink, { consumer: 'c', streams: ['s'] });
  assert.equal(relay.republishWithinMs, 30_000 + 25_000 + 5_000 + 2 * 10_000 + 10_000, 'restart + session death + lock + 2 responses + back-off');
  t.diagnostic(`republishWithinMs default ${relay.republishWithinMs}`);
});

test('lag() answers within responseTimeoutMs or rejects: a statement that cannot finish is not waited on', async (t) => {
  const db = await testDb(t);
  await write(db, ['s']);
  // The bound is what is tested, not the machine's speed: answers are awaited under a generous one.
  const relay = new Relay(db.pool(), new MemorySink(), { ...FAST, consumer: 'r', streams: ['s'], responseTimeoutMs: 30_000 });
  const tight = new Relay(db.pool(), new MemorySink(), { ...FAST, consumer: 'r', streams: ['s'], responseTimeoutMs: 300 });
  assert.deepEqual((await relay.lag()).map((l) => [l.stream, l.cursor, l.events]), [['s', 0n, 1]]);
  // An operator's lock on the cursors table: lag()'s read waits for it, without end on the server.
  const locker = await db.session('locker');
  await locker.query('BEGIN');
  await locker.query('LOCK TABLE tidemark.cursors IN ACCESS EXCLUSIVE MODE');
  await assert.rejects(tight.lag(), { name: 'NoResponseError', message: /the relay lag: no answer from the server within 300 ms/ });
  await locker.query('ROLLBACK');
  assert.equal((await relay.lag())[0]?.events, 1, 'and answers again once the lock is gone');
});
