/**
 * RedisSink against a private redis-server (test/support/redis-server.ts),
 * judged from what the Redis stream holds, read back with XRANGE on a
 * connection of the test's own: entry ids, the exact fields, a republished
 * page taken as delivered and stored once, trimming, the checks of `open`,
 * failures and their retryability, the CloudEvents format. The last test
 * relays from PostgreSQL with the library's `Relay`.
 */
import assert from 'node:assert/strict';
import { after, test, type TestContext } from 'node:test';
import { CloudEvent } from 'cloudevents';
import { Redis } from 'ioredis';
import { InvalidOptionsError, SinkError } from '../../src/errors.js';
import { Relay, Watermarker } from '../../src/index.js';
import { setCursor } from '../../src/consumer/cursors.js';
import type { RelayMessage, SinkTarget } from '../../src/relay/sink.js';
import { RedisSink, type RedisSinkOptions } from '../../src/relay/sinks/redis/sink.js';
import { closeAdmin, insertEvent, testDb, waitFor } from '../support/db.js';
import { EXACT_PAYLOAD, relayMessage, TEST_ORIGIN } from '../support/memory-sink.js';
import { freePort } from '../support/nats-server.js';
import { startRedisServer, type RedisServer } from '../support/redis-server.js';

after(closeAdmin);

const never = new AbortController().signal;
const TARGET: SinkTarget = { schema: 'tidemark', streams: ['orders'], republishWithinMs: 30_000, origin: TEST_ORIGIN };
/** A payload no JavaScript number holds, and characters JSON escapes. */
const PAYLOAD = EXACT_PAYLOAD;
const TRACEPARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

function message(seq: number, fields: { stream?: string; headersText?: string; payloadText?: string } = {}): RelayMessage {
  return relayMessage(seq, fields);
}

const messages = (...seqs: number[]) => seqs.map((seq) => message(seq));

/** A redis-server of the test's own and an admin connection to it. */
async function server(t: TestContext, config: string[] = []): Promise<{ server: RedisServer; admin: Redis }> {
  const s = await startRedisServer(t, config);
  const admin = new Redis({ port: s.port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => 50 });
  admin.on('error', () => undefined);
  await admin.connect();
  t.after(() => admin.disconnect());
  return { server: s, admin };
}

/** A sink, opened, closed after the test. */
async function openSink(t: TestContext, options: RedisSinkOptions, target: SinkTarget = TARGET): Promise<RedisSink> {
  const sink = new RedisSink(options);
  t.after(() => sink.close());
  await sink.open(target, never);
  return sink;
}

/** The ids of a Redis stream's entries, in stream order. */
async function ids(admin: Redis, key = 'tidemark:orders'): Promise<string[]> {
  return (await admin.xrange(key, '-', '+')).map(([id]) => id);
}

test('each event is an entry with id <seq>-0 and exactly the documented fields; the payload arrives byte for byte; a header number JavaScript cannot hold keeps the trace context', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await sink.publish([message(3), message(8, { headersText: `{"traceparent": "${TRACEPARENT}", "tracestate": "k=v", "other": "x", "big": 12345678901234567890}` })], never);
  const entries = await admin.xrange('tidemark:orders', '-', '+');
  assert.deepEqual(entries, [
    [
      '3-0',
      ['id', 'tidemark:3', 'seq', '3', 'stream', 'orders', 'kind', 'order.placed', 'key', 'order-3', 'occurred_at', '2026-12-05T09:00:00.003Z', 'payload', PAYLOAD, 'headers', '{}'],
    ],
    [
      '8-0',
      [
        'id', 'tidemark:8', 'seq', '8', 'stream', 'orders', 'kind', 'order.placed', 'key', 'order-8', 'occurred_at', '2026-12-05T09:00:00.008Z',
        'payload', PAYLOAD, 'headers', `{"traceparent": "${TRACEPARENT}", "tracestate": "k=v", "other": "x", "big": 12345678901234567890}`,
        'traceparent', TRACEPARENT, 'tracestate', 'k=v',
      ],
    ],
  ]);
  // Byte for byte: the payload's UTF-8 as Redis holds it.
  const raw = await admin.xrangeBuffer('tidemark:orders', '3-0', '3-0');
  assert.deepEqual(raw[0]![1][13], Buffer.from(PAYLOAD, 'utf8'));
  assert.match(sink.description, /^redis:\/\/127\.0\.0\.1:\d+ stream \{schema\}:\{stream\}$/);
});

test('an invalid traceparent is not copied into a field of its own', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await sink.publish([message(1, { headersText: '{"traceparent": "nope", "tracestate": "k=v"}' })], never);
  const [, fields] = ((await admin.xrange('tidemark:orders', '-', '+')) as [string, string[]][])[0]!;
  assert.ok(!fields.includes('traceparent'));
});

test('a republished page is taken as delivered and stored once; so is a page stored in part before', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await sink.publish(messages(1, 2, 4), never);
  // The same page again (a crash between the reply and the cursor's commit): resolves, nothing added.
  await sink.publish(messages(1, 2, 4), never);
  assert.deepEqual(await ids(admin), ['1-0', '2-0', '4-0']);
  // A page of which a first attempt stored a prefix: the rest is added, in order.
  await admin.xadd('tidemark:orders', '6-0', 'id', 'tidemark:6');
  await sink.publish(messages(5, 6, 7, 9), never);
  assert.deepEqual(await ids(admin), ['1-0', '2-0', '4-0', '6-0', '7-0', '9-0']);
  assert.equal((await admin.xrange('tidemark:orders', '6-0', '6-0'))[0]![1].length, 2, 'the stored entry is left as it was');
});

test('only Redis\'s exact refusal of a lower id counts as delivered: id 0-0 fails, not retryable, and nothing after it in the page is stored', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  const err = await sink.publish(messages(...Array.from({ length: 300 }, (_, i) => i)), never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError, String(err));
  assert.equal(err.retryable, false);
  assert.equal(err.seq, 0n);
  assert.match(err.message, /ERR The ID specified in XADD must be greater than 0-0/);
  assert.deepEqual(await ids(admin), [], 'a page is stored up to its first refusal, never past it');
});

/** How many times the server ran `command` (INFO commandstats), 0 when never. */
async function calls(admin: Redis, command: string): Promise<number> {
  const info = (await admin.info('commandstats')) as string;
  return Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
}

test('a page is one call of the page script; a user without @scripting gets MULTI/EXEC pages, with the same entries', async (t) => {
  const { server: s, admin } = await server(t);
  const scripted = await openSink(t, { url: s.url, stream: 'a:{stream}' });
  await scripted.publish(messages(1, 2, 3), never);
  await scripted.publish(messages(2, 3, 4), never);
  assert.deepEqual(await ids(admin, 'a:orders'), ['1-0', '2-0', '3-0', '4-0']);
  assert.deepEqual([await calls(admin, 'evalsha'), await calls(admin, 'exec')], [2, 0], 'two pages, two script calls');

  await admin.call('ACL', 'SETUSER', 'relay', 'on', '>secret', '~*', '+@all', '-@scripting');
  const plain = await openSink(t, { url: s.url.replace('redis://', 'redis://relay:secret@'), stream: 'b:{stream}' });
  await plain.publish(messages(1, 2, 3), never);
  await plain.publish(messages(2, 3, 4), never);
  assert.deepEqual(await ids(admin, 'b:orders'), ['1-0', '2-0', '3-0', '4-0']);
  assert.deepEqual((await admin.xrange('b:orders', '-', '+')).map(([, f]) => f), (await admin.xrange('a:orders', '-', '+')).map(([, f]) => f), 'the same fields');
  assert.deepEqual([await calls(admin, 'evalsha'), await calls(admin, 'exec')], [2, 2], 'the pages went as transactions');
});

test('a server that lost the page script (a restart, SCRIPT FLUSH) is sent the script itself, and the page is stored whole', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await admin.script('FLUSH');
  // 300 events: three parts, each of which finds the script gone.
  await sink.publish(messages(...Array.from({ length: 300 }, (_, i) => i + 1)), never);
  assert.deepEqual(await ids(admin), Array.from({ length: 300 }, (_, i) => `${i + 1}-0`));
  assert.ok((await calls(admin, 'eval')) >= 2, 'the open probe and at least one page part went as EVAL');
  await sink.publish(messages(301), never);
  assert.deepEqual((await admin.xrange('tidemark:orders', '301-0', '301-0')).length, 1);
});

test('a page Redis refuses for memory (OOM) fails, retryable, storing nothing; published again, every event is there once, in order', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await sink.publish(messages(1), never);
  await admin.config('SET', 'maxmemory-policy', 'noeviction');
  await admin.config('SET', 'maxmemory', '1');
  const err = await sink.publish(messages(2, 3, 4), never).then(() => undefined, (e: unknown) => e);
  await admin.config('SET', 'maxmemory', '0');
  assert.ok(err instanceof SinkError && err.retryable, String(err));
  assert.match(err.message, /OOM command not allowed/);
  assert.deepEqual(await ids(admin), ['1-0']);
  await sink.publish(messages(2, 3, 4), never);
  assert.deepEqual(await ids(admin), ['1-0', '2-0', '3-0', '4-0']);
});

test('maxLen trims by count (MAXLEN ~), minIdLag by seq (MINID ~); a trimmed event published again is still taken as delivered', async (t) => {
  const { server: s, admin } = await server(t, ['--stream-node-max-entries', '10']);
  const byCount = await openSink(t, { url: s.url, stream: 'count:{stream}', maxLen: 20 });
  const bySeq = await openSink(t, { url: s.url, stream: 'seq:{stream}', minIdLag: 20 });
  const seqs = Array.from({ length: 200 }, (_, i) => i + 1);
  for (let i = 0; i < seqs.length; i += 50) {
    await byCount.publish(messages(...seqs.slice(i, i + 50)), never);
    await bySeq.publish(messages(...seqs.slice(i, i + 50)), never);
  }
  // `~`: whole nodes of 10 entries go, so between 20 and 29 stay.
  const counted = await ids(admin, 'count:orders');
  assert.ok(counted.length >= 20 && counted.length < 30, `${counted.length} entries`);
  assert.equal(counted.at(-1), '200-0');
  const bySeqIds = await ids(admin, 'seq:orders');
  assert.ok(bySeqIds.length >= 20 && bySeqIds.length < 30, `${bySeqIds.length} entries`);
  assert.ok(bySeqIds.every((id) => Number(id.split('-')[0]) >= 181 - 9), bySeqIds.join(' '));
  // Trimmed away, published again: refused as below the top, so delivered; nothing comes back.
  await byCount.publish(messages(1, 2, 3), never);
  assert.deepEqual(await ids(admin, 'count:orders'), counted);
});

test('options are checked in the constructor, each error naming its option; the password never shows', () => {
  const refuses = (options: unknown, option: string, pattern?: RegExp) =>
    assert.throws(
      () => new RedisSink(options as RedisSinkOptions),
      (err: unknown) => err instanceof InvalidOptionsError && err.option === option && (!pattern || pattern.test(err.message)),
      `${JSON.stringify(options)} -> ${option}`,
    );
  refuses({ url: 'nats://127.0.0.1:4222' }, 'url', /scheme nats: is not redis: or rediss:/);
  refuses({ url: 'redis://:s3cret@' }, 'url');
  refuses({ url: 'redis://u:s3cret@host:6379/x' }, 'url', /^url: the database "x" is not a number.*redis:\/\/u:\*\*\*@host:6379\/x/);
  refuses({ url: 'redis://user@host' }, 'url', /a user without a password/);
  refuses({ url: 'redis://host?db=1' }, 'url');
  refuses({ url: 'redis://h', stream: '{seq}' }, 'stream', /names \{seq\}/);
  refuses({ url: 'redis://h', stream: '{stream}:{kind}' }, 'stream', /names \{kind\}/);
  refuses({ url: 'redis://h', stream: '{bogus}' }, 'stream', /unknown field/);
  refuses({ url: 'redis://h', maxLen: 0 }, 'maxLen');
  refuses({ url: 'redis://h', minIdLag: 1.5 }, 'minIdLag');
  refuses({ url: 'redis://h', maxLen: 10, minIdLag: 10 }, 'minIdLag', /not both/);
  refuses({ url: 'redis://h', ackTimeoutMs: -1 }, 'ackTimeoutMs');
  refuses({ url: 'redis://h', connectTimeoutMs: 'soon' }, 'connectTimeoutMs');
  refuses({ url: 'redis://h', format: 'cloudevents-binary' }, 'format', /needs message headers/);
  refuses({ url: 'redis://h', ceType: 'x' }, 'ceType');
  refuses({ url: 'redis://h', subject: 'x' }, 'subject', /is not a RedisSink option/);
  const sink = new RedisSink({ url: 'rediss://relay:p%40ss@redis.example:6380/2', stream: 'events:{stream}', maxLen: 1000 });
  assert.equal(sink.description, 'rediss://relay:***@redis.example:6380/2 stream events:{stream} maxlen ~1000');
  assert.ok(!sink.description.includes('p%40ss'));
  assert.equal(sink.ackTimeoutMs, 10_000);
});

test('open refuses, not retryable, a template under which two streams share a key, and a key of another type', async (t) => {
  const { server: s, admin } = await server(t);
  const shared = new RedisSink({ url: s.url, stream: 'all-events' });
  t.after(() => shared.close());
  const err = await shared.open({ ...TARGET, streams: ['orders', 'payments'] }, never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError && !err.retryable, String(err));
  assert.match(err.message, /streams "orders" and "payments" would share the Redis stream "all-events"/);

  await admin.set('tidemark:orders', 'a string');
  const typed = new RedisSink({ url: s.url });
  t.after(() => typed.close());
  const wrong = await typed.open(TARGET, never).then(() => undefined, (e: unknown) => e);
  assert.ok(wrong instanceof SinkError && !wrong.retryable, String(wrong));
  assert.match(wrong.message, /the key "tidemark:orders" on 127\.0\.0\.1:\d+ holds a string, not a stream/);

  // Changed after open: the page fails with WRONGTYPE, not retryable.
  await admin.del('tidemark:orders');
  const sink = await openSink(t, { url: s.url });
  await admin.set('tidemark:orders', 'a string');
  const page = await sink.publish(messages(1, 2), never).then(() => undefined, (e: unknown) => e);
  assert.ok(page instanceof SinkError && !page.retryable, String(page));
  assert.match(page.message, /WRONGTYPE/);
  assert.equal(page.seq, undefined, 'about the key, not an event: the relay stops under either onRefused policy');
});

test('a server down is retryable, at open and at publish; the next publish reconnects by itself', async (t) => {
  const unreachable = new RedisSink({ url: `redis://127.0.0.1:${await freePort()}`, connectTimeoutMs: 2000 });
  t.after(() => unreachable.close());
  const down = await unreachable.open(TARGET, never).then(() => undefined, (e: unknown) => e);
  assert.ok(down instanceof SinkError && down.retryable, String(down));
  assert.match(down.message, /^redis: cannot connect to 127\.0\.0\.1:\d+: .*ECONNREFUSED/);

  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url });
  await sink.publish(messages(1), never);
  await s.kill();
  const failed = await sink.publish(messages(2), never).then(() => undefined, (e: unknown) => e);
  assert.ok(failed instanceof SinkError && failed.retryable, String(failed));
  await s.restart();
  await sink.publish(messages(2, 3), never);
  await waitFor('the admin connection back', async () => (await admin.ping().catch(() => '')) === 'PONG');
  assert.deepEqual(await ids(admin), ['1-0', '2-0', '3-0'], 'the acknowledged entry survived the crash (appendfsync always)');
});

test('a page without a reply within ackTimeoutMs fails, retryable, and the connection is dropped; the next publish connects again', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url, ackTimeoutMs: 300 });
  await sink.publish(messages(1), never);
  // A stopped server: the connection stays open and nothing is answered.
  await s.pause();
  t.after(() => s.resume());
  const err = await sink.publish(messages(2), never).then(() => undefined, (e: unknown) => e);
  s.resume();
  assert.ok(err instanceof SinkError && err.retryable, String(err));
  assert.match(err.message, /no reply from 127\.0\.0\.1:\d+ to the event seq 2 within 300 ms \(ackTimeoutMs\); the connection was dropped/);
  // The page may or may not have been stored when the server read it after SIGCONT: either way it is there once after the republish.
  await sink.publish(messages(2, 3), never);
  assert.deepEqual(await ids(admin), ['1-0', '2-0', '3-0']);
  // The dropped connection's end reaches the server after SIGCONT: polled, not assumed.
  await waitFor('one relay connection left', async () => ((await admin.client('LIST')) as string).split('\n').filter((line) => line.includes('name=tidemark-relay')).length === 1);
});

test('a field over proto-max-bulk-len is refused before sending, not retryable, naming the seq', async (t) => {
  const { server: s, admin } = await server(t, ['--proto-max-bulk-len', '1mb']);
  const sink = await openSink(t, { url: s.url });
  const big = message(2, { payloadText: JSON.stringify({ x: 'x'.repeat(1_100_000) }) });
  const err = await sink.publish([message(1), big, message(3)], never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError && !err.retryable, String(err));
  assert.equal(err.seq, 2n);
  assert.match(err.message, /the event seq 2 has a field of 1100008 bytes .*over the server's proto-max-bulk-len of 1048576 bytes/);
  assert.deepEqual(await ids(admin), [], 'nothing of the page was sent');
});

test('format cloudevents: content-type and a structured envelope the CloudEvents SDK validates, data byte for byte', async (t) => {
  const { server: s, admin } = await server(t);
  const sink = await openSink(t, { url: s.url, format: 'cloudevents', ceType: 'com.example.{kind}' });
  assert.match(sink.description, / as cloudevents$/);
  await sink.publish([message(5, { headersText: `{"traceparent": "${TRACEPARENT}"}` })], never);
  const [id, fields] = ((await admin.xrange('tidemark:orders', '-', '+')) as [string, string[]][])[0]!;
  assert.equal(id, '5-0');
  assert.deepEqual(fields.filter((_, i) => i % 2 === 0), ['content-type', 'cloudevent']);
  assert.equal(fields[1], 'application/cloudevents+json');
  const text = fields[3]!;
  assert.ok(text.endsWith(`"data":${PAYLOAD}}`), 'data is the payload\'s text as it is');
  const event = new CloudEvent(JSON.parse(text) as Record<string, unknown>);
  assert.equal(event.validate(), true);
  assert.equal(event.id, `${TEST_ORIGIN}:5`);
  assert.equal(event.source, '/tidemark/tidemark/orders');
  assert.equal(event.type, 'com.example.order.placed');
  assert.equal(event.subject, 'order-5');
  assert.equal(event['traceparent'], TRACEPARENT);
  assert.equal(event['tidemarkseq'], '5');
});

test('Relay with a RedisSink: each stream into its own Redis stream; a second run from cursors moved back to start (cursor set) adds nothing', async (t) => {
  const db = await testDb(t);
  const { server: s, admin } = await server(t);
  const writer = await db.session('writer');
  const seqs = { orders: [] as bigint[], payments: [] as bigint[] };
  for (let i = 0; i < 30; i += 1) seqs[i % 3 === 0 ? 'payments' : 'orders'].push(await insertEvent(writer, i % 3 === 0 ? 'payments' : 'orders'));
  await new Watermarker(db.pool({ max: 1 }), { owner: 'test' }).step();
  const cursor = async (stream: string) =>
    (await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = $2', ['to-redis', stream])).rows[0]?.seq;
  const published = [0, 0];
  for (let run = 0; run < 2; run += 1) {
    const relay = new Relay(db.pool({ max: 4 }), new RedisSink({ url: s.url }), {
      consumer: 'to-redis',
      streams: ['orders', 'payments'],
      batchSize: 7,
      observer: (e) => {
        if (e.type === 'published') published[run]! += e.count;
      },
    });
    const stop = new AbortController();
    const running = relay.run(stop.signal);
    await waitFor('both cursors at their last seq', async () => (await cursor('orders')) === String(seqs.orders.at(-1)) && (await cursor('payments')) === String(seqs.payments.at(-1)));
    stop.abort();
    await running;
    await relay.close();
    // As `tidemark cursor set --to start` does: the next run reads every event again, and Redis refuses each as stored.
    if (run === 0) for (const stream of ['orders', 'payments']) await setCursor(db.pool({ max: 1 }), 'to-redis', stream, 'start');
  }
  assert.deepEqual(published, [30, 30], 'the second run published every event again');
  assert.deepEqual(await ids(admin, 'tidemark:orders'), seqs.orders.map((seq) => `${seq}-0`));
  assert.deepEqual(await ids(admin, 'tidemark:payments'), seqs.payments.map((seq) => `${seq}-0`));
});

test("a Relay with a RedisSink refuses onRefused 'dead-letter': a replayed dead letter would land below the stream's top", async (t) => {
  const db = await testDb(t);
  const sink = new RedisSink({ url: 'redis://127.0.0.1:6379' });
  assert.throws(
    () => new Relay(db.pool(), sink, { consumer: 'r', streams: ['orders'], onRefused: 'dead-letter' }),
    (err: unknown) => err instanceof InvalidOptionsError && err.option === 'onRefused' && /a Redis stream takes an entry only above its top/.test(err.message),
  );
});
