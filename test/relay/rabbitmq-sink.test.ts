/**
 * The RabbitMQ sink against the shared broker (127.0.0.1:5672, guest/guest).
 * Each test declares exchanges and queues of its own (random suffix) and
 * deletes them after. Faults are made by the TCP proxy of
 * test/support/proxy.ts between the sink and the broker: a reset or an
 * orderly drop, and a blackhole (bytes held, sockets open) for a stall. The
 * tests read what reached a queue over a connection of their own that does
 * not go through the proxy.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { createServer, type AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { after, test, type TestContext } from 'node:test';
import { connect, type Channel, type ChannelModel, type Message } from 'amqplib';
import { streamEvent } from '../../src/consumer/exact-json.js';
import { ClosedError, InvalidOptionsError, SinkError, isRetryable } from '../../src/errors.js';
import type { RelayMessage } from '../../src/relay/sink.js';
import { RabbitMqSink } from '../../src/relay/sinks/rabbitmq/sink.js';
import { Batch } from '../../src/relay/sinks/rabbitmq/session.js';
import { startProxy, type Proxy } from '../support/proxy.js';
import { TEST_ORIGIN } from '../support/memory-sink.js';

const BROKER = { host: '127.0.0.1', port: 5672 };
const URL_DIRECT = `amqp://guest:guest@${BROKER.host}:${BROKER.port}/`;
const TIMEOUT = { timeout: 60_000 };
const never = new AbortController().signal;

let adminModel: Promise<ChannelModel> | undefined;
after(async () => {
  if (adminModel) await (await adminModel).close();
});

/** Runs `body` on a fresh channel of the test's own connection to the broker (a refused call closes a channel). */
async function admin<T>(body: (ch: Channel) => Promise<T>): Promise<T> {
  adminModel ??= connect(URL_DIRECT).then((model) => model.on('error', () => undefined));
  const ch = await (await adminModel).createChannel();
  ch.on('error', () => undefined);
  try {
    return await body(ch);
  } finally {
    await ch.close().catch(() => undefined);
  }
}

/** A unique name for this test's exchanges and queues. */
function unique(what: string): string {
  return `tidemark-test-${what}-${randomUUID().slice(0, 8)}`;
}

/** A topic exchange deleted after the test; with `queue`, a queue bound to it by `#`, deleted too. */
async function destination(t: TestContext, options: { queue: boolean }): Promise<{ exchange: string; queue: string }> {
  const exchange = unique('x');
  const queue = unique('q');
  await admin(async (ch) => {
    await ch.assertExchange(exchange, 'topic', { durable: false });
    if (options.queue) {
      await ch.assertQueue(queue, { durable: false });
      await ch.bindQueue(queue, exchange, '#');
    }
  });
  t.after(() => deleteAll([exchange], options.queue ? [queue] : []));
  return { exchange, queue };
}

async function deleteAll(exchanges: string[], queues: string[] = []): Promise<void> {
  await admin(async (ch) => {
    for (const queue of queues) await ch.deleteQueue(queue);
    for (const exchange of exchanges) await ch.deleteExchange(exchange);
  });
}

async function exchangeExists(name: string): Promise<boolean> {
  return admin((ch) => ch.checkExchange(name).then(() => true, () => false));
}

/** Every message in `queue` when called, in queue order (taken off it). */
async function readAll(queue: string): Promise<Message[]> {
  return admin(async (ch) => {
    const { messageCount } = await ch.checkQueue(queue);
    const out: Message[] = [];
    if (messageCount === 0) return out;
    await new Promise<void>((resolve, reject) => {
      ch.consume(queue, (m) => m && out.push(m) >= messageCount && resolve(), { noAck: true }).catch(reject);
    });
    return out.slice(0, messageCount);
  });
}

async function messageCount(queue: string): Promise<number> {
  return admin(async (ch) => (await ch.checkQueue(queue)).messageCount);
}

/** `count` events of `stream` from seq `first`, each with a payload of about `padBytes` bytes. */
function events(count: number, options: { stream?: string; first?: bigint; padBytes?: number } = {}): RelayMessage[] {
  const { stream = 'orders', first = 1n, padBytes = 16 } = options;
  return Array.from({ length: count }, (_, i) => {
    const seq = first + BigInt(i);
    return {
      id: `tidemark:${seq}`,
      schema: 'tidemark',
      event: streamEvent({
        seq,
        stream,
        kind: 'order.placed',
        key: `order-${i}`,
        payloadText: JSON.stringify({ n: i, text: 'é'.repeat(3), pad: 'x'.repeat(padBytes) }),
        headersText: JSON.stringify({ traceId: `trace-${i}`, attempt: i, nested: { big: '12345678901234567890' }, CC: 'elsewhere', 'tidemark-seq': 'forged' }),
        occurredAt: new Date(Date.UTC(2026, 0, 2, 3, 4, i % 60, 123)),
      }),
    };
  });
}

/** The rejection of `promise`, which must reject with a SinkError. */
async function sinkError(promise: Promise<unknown>): Promise<SinkError> {
  const err = await promise.then(
    () => assert.fail('expected a SinkError'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof SinkError, `expected a SinkError, got ${String(err)}`);
  return err;
}

/** A proxy to the broker, closed after the test. */
async function proxied(t: TestContext): Promise<{ proxy: Proxy; url: string }> {
  const proxy = await startProxy({ target: BROKER });
  t.after(() => proxy.close());
  return { proxy, url: proxy.url(URL_DIRECT) };
}

function sinkFor(t: TestContext, options: ConstructorParameters<typeof RabbitMqSink>[0]): RabbitMqSink {
  const sink = new RabbitMqSink(options);
  t.after(() => sink.close());
  return sink;
}

/** `promise`, or a failure naming `what` after `ms`: a hang fails the test at once, not at its timeout. */
async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} took over ${ms} ms`)), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls `check` every 10 ms until it holds; fails after `timeoutMs`. */
async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const TARGET = { schema: 'tidemark', streams: ['orders'], republishWithinMs: 60_000, origin: TEST_ORIGIN };

test('a batch of 1000 reaches a bound queue in order, with its message id, properties, headers and JSON body', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const sink = sinkFor(t, { url: URL_DIRECT, exchange });
  await sink.open(TARGET, never);
  // ~3 KB each: amqplib splits them in frames and its channel buffer fills, so publishing waits for 'drain'.
  const batch = events(1000, { first: 41n, padBytes: 3000 });
  await sink.publish(batch, never);

  const got = await readAll(queue);
  assert.equal(got.length, 1000);
  got.forEach((m, i) => {
    const { event, id } = batch[i]!;
    assert.equal(m.properties.messageId, id, 'in seq order');
    assert.equal(m.fields.exchange, exchange);
    assert.equal(m.fields.routingKey, 'orders.order.placed');
    assert.equal(m.properties.deliveryMode, 2, 'persistent');
    assert.equal(m.properties.contentType, 'application/json');
    assert.equal(m.properties.type, 'order.placed');
    assert.equal(m.properties.appId, 'tidemark');
    assert.equal(m.properties.timestamp, Math.floor(event.occurredAt.getTime() / 1000));
    assert.deepEqual(JSON.parse(m.content.toString('utf8')), event.payload);
    const h = m.properties.headers!;
    assert.equal(h['tidemark-seq'], event.seq.toString(), 'the own header "tidemark-seq" does not override it');
    assert.equal(h['tidemark-stream'], 'orders');
    assert.equal(h['tidemark-kind'], 'order.placed');
    assert.equal(h['tidemark-key'], event.key);
    assert.equal(h['tidemark-occurred-at'], event.occurredAt.toISOString());
    assert.deepEqual(JSON.parse(String(h['tidemark-headers'])), event.headers, 'every own header, losslessly');
    assert.equal(h.traceId, event.headers.traceId, 'a string header under its own name');
    assert.equal(h.attempt, undefined, 'a number header only in tidemark-headers');
    assert.equal(h.CC, undefined, 'CC (a RabbitMQ routing header) is never copied');
  });
  assert.equal(sink.description, `amqp://guest@127.0.0.1:5672/ exchange ${exchange} routing key {stream}.{kind}`, 'no password');
});

test('streams published concurrently on one sink each reach the queue in seq order', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const sink = sinkFor(t, { url: URL_DIRECT, exchange });
  await sink.open({ ...TARGET, streams: ['a', 'b'] }, never);
  const a = events(300, { stream: 'a', first: 1n });
  const b = events(300, { stream: 'b', first: 1001n });
  await Promise.all([sink.publish(a.slice(0, 150), never), sink.publish(b.slice(0, 150), never)]);
  await Promise.all([sink.publish(a.slice(150), never), sink.publish(b.slice(150), never)]);
  const got = await readAll(queue);
  for (const [stream, sent] of [['a', a], ['b', b]] as const) {
    const ids = got.filter((m) => m.properties.headers?.['tidemark-stream'] === stream).map((m) => m.properties.messageId as string);
    assert.deepEqual(ids, sent.map((m) => m.id), `stream ${stream}`);
  }
});

test('an unroutable message (no queue bound) fails the batch, not retryable, naming its seq, exchange and routing key', TIMEOUT, async (t) => {
  const { exchange } = await destination(t, { queue: false });
  const sink = sinkFor(t, { url: URL_DIRECT, exchange });
  await sink.open(TARGET, never);
  const err = await sinkError(sink.publish(events(3, { first: 7n }), never));
  assert.equal(err.retryable, false);
  assert.equal(isRetryable(err), false);
  assert.equal(err.seq, 7n);
  assert.match(err.message, /no queue is bound/);
  assert.ok(err.message.includes(JSON.stringify(exchange)) && err.message.includes('"orders.order.placed"'), err.message);
});

test('open refuses a missing exchange (not retryable, suggesting createExchange); createExchange declares it', TIMEOUT, async (t) => {
  const missing = unique('missing');
  t.after(() => deleteAll([`${missing}.a`, `${missing}.b`]).catch(() => undefined));

  const refused = sinkFor(t, { url: URL_DIRECT, exchange: `${missing}.{stream}` });
  const err = await sinkError(refused.open({ ...TARGET, streams: ['a', 'b'] }, never));
  assert.equal(err.retryable, false);
  assert.ok(err.message.includes(JSON.stringify(`${missing}.a`)), err.message);
  assert.match(err.message, /createExchange \(--create-exchange\)/);

  const creating = sinkFor(t, { url: URL_DIRECT, exchange: `${missing}.{stream}`, createExchange: true });
  await creating.open({ ...TARGET, streams: ['a', 'b'] }, never);
  assert.ok(await exchangeExists(`${missing}.a`));
  assert.ok(await exchangeExists(`${missing}.b`));
});

test('an exchange named by per-event fields is checked at its first use; one deleted after the check stops the relay', TIMEOUT, async (t) => {
  const base = unique('lazy');
  const lazy = sinkFor(t, { url: URL_DIRECT, exchange: `${base}.{kind}` });
  await lazy.open(TARGET, never); // {kind} is unknown before an event: nothing to check yet
  const err = await sinkError(lazy.publish(events(2), never));
  assert.equal(err.retryable, false);
  assert.ok(err.message.includes(JSON.stringify(`${base}.order.placed`)), err.message);

  const { exchange, queue } = await destination(t, { queue: true });
  const sink = sinkFor(t, { url: URL_DIRECT, exchange });
  await sink.open(TARGET, never);
  await sink.publish(events(2), never);
  await admin((ch) => ch.deleteExchange(exchange));
  const gone = await sinkError(sink.publish(events(2, { first: 3n }), never));
  assert.equal(gone.retryable, false, gone.message);
  assert.ok(gone.message.includes(JSON.stringify(exchange)), gone.message);
  assert.equal(await messageCount(queue), 2);
});

test('a wrong password or vhost is not retryable; a port where nothing listens is, naming host:port', TIMEOUT, async (t) => {
  const password = 'not-the-password';
  const wrong = sinkFor(t, { url: `amqp://guest:${password}@127.0.0.1:5672/` });
  assert.ok(!wrong.description.includes(password), wrong.description);
  const login = await sinkError(wrong.open(TARGET, never));
  assert.equal(login.retryable, false);
  assert.match(login.message, /refused the login of user "guest"/);
  assert.ok(!login.message.includes(password) && !login.message.includes('\n'), login.message);

  const vhost = await sinkError(sinkFor(t, { url: URL_DIRECT + unique('vhost') }).open(TARGET, never));
  assert.equal(vhost.retryable, false);
  assert.match(vhost.message, /vhost "tidemark-test-vhost-/);

  const free = createServer();
  await new Promise<void>((resolve) => free.listen(0, '127.0.0.1', resolve));
  const port = (free.address() as AddressInfo).port;
  await new Promise<void>((resolve) => free.close(() => resolve()));
  const down = await sinkError(sinkFor(t, { url: `amqp://guest:guest@127.0.0.1:${port}/` }).open(TARGET, never));
  assert.equal(down.retryable, true);
  assert.ok(down.message.includes(`127.0.0.1:${port}`) && !down.message.includes('\n'), down.message);
});

test('a connection reset mid-batch fails it retryable; the same batch then publishes and the queue holds each message at least once', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const { proxy, url } = await proxied(t);
  const sink = sinkFor(t, { url, exchange });
  await sink.open(TARGET, never);
  const batch = events(15_000, { padBytes: 1000 });

  let settled = false;
  const first = sink.publish(batch, never).finally(() => (settled = true));
  first.catch(() => undefined);
  // Some of the batch is in the queue: freeze the path (nothing more in or
  // out), check the batch is still waiting for confirms, then reset it.
  await until('the first messages in the queue', async () => (await messageCount(queue)) > 0);
  proxy.blackhole();
  assert.equal(settled, false, 'the reset comes mid-batch');
  proxy.reset();
  const err = await sinkError(first);
  assert.equal(err.retryable, true, err.message);
  assert.match(err.message, /connection to 127\.0\.0\.1:\d+ lost/);

  proxy.heal();
  await sink.publish(batch, never);
  const ids = new Set((await readAll(queue)).map((m) => m.properties.messageId as string));
  assert.deepEqual(batch.filter((m) => !ids.has(m.id)), [], 'every message at least once');
});

test('ackTimeoutMs bounds the time without a confirm, not the batch: a large batch confirmed at a steady pace succeeds; one that stops is failed', (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const ackTimeoutMs = 1000;
  let timedOut = 0;
  const settled: boolean[] = [];
  const batch = new Batch(30, (_b, failed) => settled.push(failed));
  batch.arm(ackTimeoutMs, () => (timedOut += 1));
  // 29 confirms, 900 ms apart: 26 s in all, far past ackTimeoutMs, never 1000 ms without one.
  for (let i = 0; i < 29; i += 1) {
    t.mock.timers.tick(900);
    batch.confirm();
  }
  assert.equal(timedOut, 0, 'a batch making progress is not timed out');
  assert.deepEqual(settled, []);
  // The last confirm does not come: 999 ms after the one before, still waiting; at 1000 ms, timed out.
  t.mock.timers.tick(999);
  assert.equal(timedOut, 0);
  t.mock.timers.tick(1);
  assert.equal(timedOut, 1, 'ackTimeoutMs without a confirm times the batch out');
  batch.fail(new Error('timed out'));
  assert.deepEqual(settled, [true]);
  batch.done.catch(() => undefined);
});

test('a connection dropped between batches is replaced by the next publish', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const { proxy, url } = await proxied(t);
  const sink = sinkFor(t, { url, exchange });
  await sink.open(TARGET, never);
  await sink.publish(events(5), never);
  proxy.drop();
  await until('the proxy to have no connection', () => proxy.connections() === 0);
  // The sink may not have seen the close yet: that publish fails retryable and
  // the next one reconnects, as the relay's retry does (the Sink contract).
  const second = events(5, { first: 6n });
  await sink.publish(second, never).catch(async (err: unknown) => {
    assert.ok(err instanceof SinkError && err.retryable, String(err));
    await sink.publish(second, never);
  });
  assert.deepEqual(
    (await readAll(queue)).map((m) => m.properties.messageId),
    events(10).map((m) => m.id),
  );
});

test('a stalled connection fails the batch retryable within ackTimeoutMs; after the path heals publishing works; close() does not hang', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const { proxy, url } = await proxied(t);
  const ackTimeoutMs = 1000;
  const connectTimeoutMs = 1000;
  const sink = sinkFor(t, { url, exchange, ackTimeoutMs, connectTimeoutMs });
  await sink.open(TARGET, never);

  proxy.blackhole();
  let started = performance.now();
  const stalled = await within(ackTimeoutMs + 2000, 'the stalled publish', sinkError(sink.publish(events(100), never)));
  let waited = performance.now() - started;
  assert.equal(stalled.retryable, true);
  assert.match(stalled.message, /100 of 100 messages not confirmed within 1000 ms \(ackTimeoutMs\)/);
  assert.ok(waited >= ackTimeoutMs - 50, `failed after ${waited.toFixed(0)} ms`);

  // Still stalled: reconnecting gives up within connectTimeoutMs.
  started = performance.now();
  const reconnect = await within(connectTimeoutMs + 2000, 'reconnecting', sinkError(sink.publish(events(100), never)));
  waited = performance.now() - started;
  assert.equal(reconnect.retryable, true);
  assert.match(reconnect.message, /no answer within 1000 ms \(connectTimeoutMs\)/);
  assert.ok(waited >= connectTimeoutMs - 50, `gave up after ${waited.toFixed(0)} ms`);

  proxy.heal();
  await sink.publish(events(100), never);
  const ids = new Set((await readAll(queue)).map((m) => m.properties.messageId as string));
  assert.equal(ids.size, 100);

  proxy.blackhole();
  started = performance.now();
  await within(connectTimeoutMs + 2000, 'close()', sink.close());
  waited = performance.now() - started;
  assert.ok(waited >= connectTimeoutMs - 50, `close() waited ${waited.toFixed(0)} ms for the stalled broker, its bound is connectTimeoutMs`);
  await sink.close(); // idempotent
  proxy.heal();
});

test('an aborted publish rejects with the signal\'s reason at once; publishing goes on after', TIMEOUT, async (t) => {
  const { exchange, queue } = await destination(t, { queue: true });
  const { proxy, url } = await proxied(t);
  const sink = sinkFor(t, { url, exchange });
  await sink.open(TARGET, never);
  proxy.blackhole(); // the confirms cannot come: only the abort can end the publish
  const stop = new AbortController();
  const publishing = sink.publish(events(10), stop.signal);
  const reason = new Error('relay stopping');
  stop.abort(reason);
  await within(1000, 'the aborted publish', assert.rejects(publishing, (err) => err === reason));
  proxy.heal();
  await sink.publish(events(10, { first: 11n }), never);
  const ids = new Set((await readAll(queue)).map((m) => m.properties.messageId as string));
  assert.ok(events(10, { first: 11n }).every((m) => ids.has(m.id)));
});

test('options are checked before anything connects: unknown names, bad URLs, bad templates and numbers', async () => {
  const bad = (options: unknown, option: string, message: RegExp) => {
    assert.throws(
      () => new RabbitMqSink(options as ConstructorParameters<typeof RabbitMqSink>[0]),
      (err: unknown) => err instanceof InvalidOptionsError && err.option === option && message.test(err.message),
    );
  };
  bad({ url: URL_DIRECT, exchang: 'x' }, 'exchang', /is not a RabbitMqSink option \(known: url, exchange, routingKey/);
  bad({}, 'url', /not a string/);
  bad({ url: 'not a url' }, 'url', /not a URL/);
  bad({ url: 'http://guest:secret@host/' }, 'url', /scheme http: is not amqp: or amqps:/);
  bad({ url: 'amqp:///vhost' }, 'url', /no host/);
  bad({ url: 'amqp://host/a/b' }, 'url', /%2F/);
  bad({ url: 'amqp://host/?heartbeats=5' }, 'url', /unknown query parameter "heartbeats"/);
  bad({ url: 'amqp://host/?heartbeat=-1' }, 'url', /heartbeat must be an integer/);
  assert.throws(
    () => new RabbitMqSink({ url: 'http://guest:secret@host/' }),
    (err: unknown) => err instanceof Error && !err.message.includes('secret'),
    'a rejected URL is echoed without its password',
  );
  bad({ url: URL_DIRECT, exchange: 'x.{nope}' }, 'exchange', /unknown field \{nope\}/);
  bad({ url: URL_DIRECT, routingKey: '{stream' }, 'routingKey', /unclosed "\{"/);
  bad({ url: URL_DIRECT, routingKey: '' }, 'routingKey', /non-empty template/);
  bad({ url: URL_DIRECT, createExchange: 'yes' }, 'createExchange', /expected a boolean/);
  bad({ url: URL_DIRECT, ackTimeoutMs: 0 }, 'ackTimeoutMs', /between 1 and/);
  bad({ url: URL_DIRECT, connectTimeoutMs: 1.5 }, 'connectTimeoutMs', /between 1 and/);

  const sink = new RabbitMqSink({ url: 'amqps://relay:p%40ss@mq.example:5671/prod?heartbeat=10', routingKey: '{stream}' });
  assert.equal(sink.description, 'amqps://relay@mq.example:5671/prod?heartbeat=10 exchange tidemark routing key {stream}');
  assert.equal(sink.ackTimeoutMs, 10_000);
  assert.equal(sink.name, 'rabbitmq');
  await sink.close();
  await assert.rejects(sink.publish(events(1), never), ClosedError);
  await assert.rejects(sink.open(TARGET, never), ClosedError);
});
