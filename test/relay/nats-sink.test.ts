import assert from 'node:assert/strict';
import { after, before, test, type TestContext } from 'node:test';
import { jetstreamManager, StorageType, type JetStreamManager, type StoredMsg } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { streamEvent } from '../../src/consumer/exact-json.js';
import { InvalidOptionsError, SinkError } from '../../src/errors.js';
import type { JsonObject } from '../../src/outbox/append.js';
import type { RelayMessage, SinkTarget } from '../../src/relay/sink.js';
import { headerText, natsMessage } from '../../src/relay/sinks/nats/message.js';
import { minimalFilters, subjectCovers, subjectField, subjectFilter } from '../../src/relay/sinks/nats/subject.js';
import { NatsSink, type NatsSinkOptions } from '../../src/relay/sinks/nats/sink.js';
import { loadNats } from '../../src/relay/sinks/nats/client.js';
import { compileTemplate } from '../../src/relay/template.js';
import { waitFor } from '../support/db.js';
import { TEST_ORIGIN } from '../support/memory-sink.js';
import { freePort, startNatsServer, type NatsServer } from '../support/nats-server.js';

// A failed batch must leave no rejection unhandled: record them instead of crashing, and check.
const unhandled: unknown[] = [];
process.on('unhandledRejection', (reason) => unhandled.push(reason));
after(() => assert.deepEqual(unhandled, [], 'no unhandled rejections'));

const TARGET: SinkTarget = { schema: 'tidemark', streams: ['orders', 'payments'], republishWithinMs: 30_000, origin: TEST_ORIGIN };
const never = new AbortController().signal;

type EventFields = Omit<RelayMessage['event'], 'payload' | 'payloadText' | 'headers' | 'headersText'> & { payload: JsonObject; headers: JsonObject };

/** A message as the relay builds it: payload and headers as JSON text, as PostgreSQL returns them. */
function message(seq: number, fields: Partial<EventFields> = {}): RelayMessage {
  const { payload, headers, ...event }: EventFields = {
    seq: BigInt(seq),
    stream: 'orders',
    kind: 'order.placed',
    key: `order-${seq}`,
    payload: { n: seq, text: 'ünïcode ✓' },
    headers: { trace: `t-${seq}` },
    occurredAt: new Date(Date.UTC(2024, 0, 1, 0, 0, 0, seq)),
    ...fields,
  };
  return { id: `tidemark:${seq}`, schema: 'tidemark', event: streamEvent({ ...event, payloadText: JSON.stringify(payload), headersText: JSON.stringify(headers) }) };
}

function batch(from: number, count: number): RelayMessage[] {
  return Array.from({ length: count }, (_, i) => message(from + i));
}

function sinkFor(t: TestContext, server: NatsServer | string, options: Partial<NatsSinkOptions> = {}): NatsSink {
  const sink = new NatsSink({ url: typeof server === 'string' ? server : server.url, ...options });
  t.after(() => sink.close());
  return sink;
}

/** The sink's connection (a private field): read to count what it sent, or to close it behind the sink's back. */
function sinkConnection(sink: NatsSink): NatsConnection {
  return (sink as unknown as { link: { nc: NatsConnection } }).link.nc;
}

async function admin(t: TestContext, server: NatsServer): Promise<JetStreamManager> {
  const nc = await connect({ servers: server.url });
  t.after(() => nc.close());
  return jetstreamManager(nc);
}

async function addStream(jsm: JetStreamManager, subjects: string[], duplicateWindowMs = 120_000, name = 'TIDEMARK'): Promise<void> {
  await jsm.streams.add({ name, subjects, storage: StorageType.File, duplicate_window: duplicateWindowMs * 1e6 });
}

/** Every message the stream holds, in stream order. */
async function stored(jsm: JetStreamManager, stream = 'TIDEMARK'): Promise<StoredMsg[]> {
  const { state } = await jsm.streams.info(stream);
  const seqs = Array.from({ length: state.messages }, (_, i) => state.first_seq + i);
  return Promise.all(seqs.map(async (seq) => (await jsm.streams.getMessage(stream, { seq }))!));
}

async function rejectsWith(promise: Promise<unknown>, check: (err: SinkError) => void): Promise<SinkError> {
  let caught: unknown;
  await promise.then(
    () => assert.fail('expected a rejection'),
    (err: unknown) => (caught = err),
  );
  assert.ok(caught instanceof SinkError, `expected a SinkError, got ${String(caught)}`);
  check(caught);
  return caught;
}


// natsMessage uses the client packages, which a sink loads when it first connects.
before(() => loadNats());
test('publishes a batch pipelined: every message once, in seq order, with its subject, headers, id and body', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  const sink = sinkFor(t, server, { createStream: true });
  await sink.open(TARGET, never);
  const messages = batch(1, 1000);
  // Fields that need escaping, and own headers of every kind.
  messages[1] = message(2, { kind: 'a b*c>', key: ' 50% \r\nkey ' });
  messages[2] = message(3, { kind: 'ends.with.', stream: 'payments' });
  messages[3] = message(4, {
    headers: { 'x-ok': 'yes', 'bad name': 'x', 'Nats-Msg-Id': 'evil', 'tidemark-seq': '0', 'x-num': 7, 'x-crlf': 'a\r\nb', 'x-padded': ' p ' },
  });

  // The server is paused: no acknowledgement can come back, yet all 1000
  // messages are written, so none waited for the one before.
  const sentBefore = sinkConnection(sink).stats().outMsgs;
  await server.pause();
  const publishing = sink.publish(messages, never);
  try {
    await waitFor('all 1000 messages sent before any ack', async () => sinkConnection(sink).stats().outMsgs - sentBefore >= 1000);
  } finally {
    server.resume();
  }
  await publishing;

  const got = await stored(jsm);
  assert.equal(got.length, 1000);
  assert.deepEqual(got.map((m) => m.header.get('Tidemark-Seq')), messages.map((m) => m.event.seq.toString()), 'stored in seq order');
  assert.deepEqual(got.map((m) => m.header.get('Nats-Msg-Id')), messages.map((m) => m.id));
  const first = got[0]!;
  assert.equal(first.subject, 'tidemark.orders.order.placed');
  assert.deepEqual(first.json(), { n: 1, text: 'ünïcode ✓' });
  assert.equal(first.header.get('Tidemark-Stream'), 'orders');
  assert.equal(first.header.get('Tidemark-Kind'), 'order.placed');
  assert.equal(first.header.get('Tidemark-Key'), 'order-1');
  assert.equal(first.header.get('Tidemark-Occurred-At'), '2024-01-01T00:00:00.001Z');
  assert.equal(first.header.get('Tidemark-Headers'), '{"trace":"t-1"}');
  assert.equal(first.header.get('trace'), 't-1');
  // Escaped subjects; header values that read back exactly.
  assert.equal(got[1]!.subject, 'tidemark.orders.a_b_c_');
  assert.equal(got[1]!.header.get('Tidemark-Kind'), 'a b*c>');
  assert.equal(decodeURIComponent(got[1]!.header.get('Tidemark-Key')), ' 50% \r\nkey ');
  assert.equal(got[2]!.subject, 'tidemark.payments.ends.with._');
  // Own headers: only valid names outside Nats-/Tidemark- with plain string values; all of them in Tidemark-Headers.
  const own = got[3]!.header;
  assert.equal(own.get('x-ok'), 'yes');
  for (const name of ['bad name', 'x-num', 'x-crlf', 'x-padded', 'tidemark-seq']) assert.equal(own.has(name), false, name);
  assert.equal(own.get('Nats-Msg-Id'), 'tidemark:4');
  assert.equal(own.get('Tidemark-Seq'), '4');
  assert.deepEqual(JSON.parse(own.get('Tidemark-Headers')), messages[3]!.event.headers);
  assert.deepEqual(unhandled, []);
});

test('republishing a batch is deduplicated by Nats-Msg-Id: the stream keeps each message once', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  const sink = sinkFor(t, server, { createStream: true });
  await sink.open(TARGET, never);
  await sink.publish(batch(1, 200), never);
  await sink.publish(batch(1, 200), never);
  // A republish that starts in the middle and goes further (the relay's retry after a partial ack).
  await sink.publish(batch(101, 150), never);
  const got = await stored(jsm);
  assert.deepEqual(got.map((m) => m.header.get('Tidemark-Seq')), batch(1, 250).map((m) => m.event.seq.toString()));
});

test('open refuses a missing stream, naming it and --create-stream; createStream creates it', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  await rejectsWith(sinkFor(t, server, { stream: 'EVENTS' }).open(TARGET, never), (err) => {
    assert.equal(err.retryable, false);
    assert.match(err.message, /JetStream stream EVENTS does not exist/);
    assert.match(err.message, /--create-stream/);
    assert.match(err.message, /--subjects 'tidemark\.orders\.>,tidemark\.payments\.>'/);
  });
  await sinkFor(t, server, { stream: 'EVENTS', createStream: true }).open({ ...TARGET, republishWithinMs: 90_000 }, never);
  const { config } = await jsm.streams.info('EVENTS');
  assert.deepEqual(config.subjects, ['tidemark.orders.>', 'tidemark.payments.>']);
  assert.equal(config.storage, StorageType.File);
  assert.equal(config.duplicate_window, 180_000 * 1e6, '2 × the republish bound');
  // The stream now exists: a second sink opens it as it is; a short bound gets the 2-minute floor.
  await sinkFor(t, server, { stream: 'OTHER', createStream: true, subject: 'other.{stream}' }).open(TARGET, never);
  const other = await jsm.streams.info('OTHER');
  assert.deepEqual(other.config.subjects, ['other.orders', 'other.payments']);
  assert.equal(other.config.duplicate_window, 120_000 * 1e6);
});

test('open refuses a stream whose subjects do not cover every subject the relay can publish', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  // One token after the stream: a kind such as order.placed (two tokens) would not be taken.
  await addStream(jsm, ['tidemark.orders.*', 'tidemark.payments.>']);
  await rejectsWith(sinkFor(t, server).open(TARGET, never), (err) => {
    assert.equal(err.retryable, false);
    assert.match(err.message, /does not take subject tidemark\.orders\.> \(its subjects: tidemark\.orders\.\*, tidemark\.payments\.>\)/);
  });
  await jsm.streams.update('TIDEMARK', { subjects: ['tidemark.*.>'] });
  await sinkFor(t, server).open(TARGET, never);
  // A template whose first token is the kind needs the whole subject space.
  await rejectsWith(sinkFor(t, server, { subject: '{kind}.{schema}' }).open(TARGET, never), (err) => assert.match(err.message, /does not take subject >/));
});

test('open refuses a duplicate window not longer than the republish bound', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  await addStream(jsm, ['tidemark.>'], 120_000);
  await rejectsWith(sinkFor(t, server).open({ ...TARGET, republishWithinMs: 120_000 }, never), (err) => {
    assert.equal(err.retryable, false);
    assert.match(err.message, /duplicate window 2m0s of stream TIDEMARK is not longer than the relay's republish bound of 120 s; raise it \(nats stream edit TIDEMARK --dupe-window 4m0s\)/);
  });
  await sinkFor(t, server).open({ ...TARGET, republishWithinMs: 119_999 }, never);
});

test('a subject another stream took over after open is refused, not stored there', async (t) => {
  const server = await startNatsServer(t);
  const jsm = await admin(t, server);
  await addStream(jsm, ['tidemark.>']);
  const sink = sinkFor(t, server);
  await sink.open(TARGET, never);
  await jsm.streams.update('TIDEMARK', { subjects: ['elsewhere.>'] });
  await addStream(jsm, ['tidemark.>'], 120_000, 'INTRUDER');
  await rejectsWith(sink.publish(batch(1, 3), never), (err) => {
    assert.equal(err.retryable, false);
    assert.match(err.message, /seq 1 .*belongs to another stream than TIDEMARK/);
  });
  assert.equal((await jsm.streams.info('INTRUDER')).state.messages, 0);
});

test('open fails retryably when no server listens, naming the address', async (t) => {
  const port = await freePort();
  const started = Date.now();
  await rejectsWith(sinkFor(t, `nats://u:secret@127.0.0.1:${port}`, { connectTimeoutMs: 2000 }).open(TARGET, never), (err) => {
    assert.equal(err.retryable, true);
    assert.match(err.message, new RegExp(`cannot connect to NATS at 127\\.0\\.0\\.1:${port} .*; is nats-server running with -js\\?$`));
    assert.doesNotMatch(err.message, /secret|\n/);
  });
  assert.ok(Date.now() - started < 10_000);
});

test('open refuses a server without JetStream', async (t) => {
  const server = await startNatsServer(t, { jetstream: false });
  await rejectsWith(sinkFor(t, server, { createStream: true }).open(TARGET, never), (err) => {
    assert.equal(err.retryable, false);
    assert.match(err.message, /JetStream is not enabled on the NATS server at 127\.0\.0\.1:\d+.*-js/);
  });
});

test('a message over max_payload fails the batch, not retryable, naming its seq and both sizes, before anything is sent', async (t) => {
  const server = await startNatsServer(t, { config: 'max_payload: 4096' });
  const jsm = await admin(t, server);
  const sink = sinkFor(t, server, { createStream: true });
  await sink.open(TARGET, never);
  const subject = compileTemplate('{schema}.{stream}.{kind}', 'subject');
  // A message of exactly `bytes` on the wire, as the sink counts them.
  const sized = (seq: number, bytes: number) => {
    const m = message(seq, { payload: { pad: '' } });
    return message(seq, { payload: { pad: 'x'.repeat(bytes - natsMessage(m, 'TIDEMARK', subject).bytes) } });
  };
  await rejectsWith(sink.publish([message(1), sized(2, 4097), message(3)], never), (err) => {
    assert.equal(err.retryable, false);
    assert.equal(err.seq, 2n);
    assert.match(err.message, /the event seq 2 is 4097 bytes .* over the server's max_payload of 4096 bytes/);
  });
  assert.equal((await jsm.streams.info('TIDEMARK')).state.messages, 0, 'nothing of the batch was sent');
  // The count is exact: the server takes a message of max_payload bytes (it would cut the connection otherwise).
  await sink.publish([message(1), sized(2, 4096), message(3)], never);
  assert.equal((await jsm.streams.info('TIDEMARK')).state.messages, 3);

  // The stream's own limit, lowered after open: JetStream's refusal names the event too.
  await jsm.streams.update('TIDEMARK', { subjects: ['tidemark.>'], max_msg_size: 1000 });
  await rejectsWith(sink.publish([message(4), sized(5, 2000)], never), (err) => {
    assert.equal(err.retryable, false);
    assert.equal(err.seq, 5n);
    assert.match(err.message, /seq 5 .*max_msg_size of stream TIDEMARK/);
  });
  // A sink opened now checks that limit before sending.
  const fresh = sinkFor(t, server);
  await fresh.open(TARGET, never);
  await rejectsWith(fresh.publish([sized(6, 1001)], never), (err) => assert.match(err.message, /seq 6 is 1001 bytes .* over the max_msg_size of stream TIDEMARK of 1000 bytes/));
  assert.deepEqual(unhandled, []);
});

test('a server killed mid-batch fails the publish retryably within ackTimeoutMs; after a restart the same batch lands once', async (t) => {
  const server = await startNatsServer(t);
  const jsm0 = await admin(t, server);
  await addStream(jsm0, ['tidemark.>']);
  const sink = sinkFor(t, server, { ackTimeoutMs: 3000 });
  await sink.open(TARGET, never);
  await sink.publish(batch(1, 100), never);

  // Paused, the server reads nothing of the next batch; killed, it never will.
  const sentBefore = sinkConnection(sink).stats().outMsgs;
  await server.pause();
  const started = Date.now();
  const publishing = sink.publish(batch(101, 100), never);
  await waitFor('the batch sent', async () => sinkConnection(sink).stats().outMsgs - sentBefore >= 100);
  await server.kill();
  await rejectsWith(publishing, (err) => {
    assert.equal(err.retryable, true);
    assert.match(err.message, /seq 101/);
  });
  assert.ok(Date.now() - started < 3000 + 1500, `failed after ${Date.now() - started} ms`);

  // While the server is down (an outage of over 5 s in all), a publish fails retryably too.
  await rejectsWith(sink.publish(batch(101, 100), never), (err) => {
    assert.equal(err.retryable, true);
    assert.match(err.message, /NATS at 127\.0\.0\.1:\d+ is unreachable/);
  });

  await server.start();
  // The client reconnects by itself; a publish made before it has waits for it.
  await sink.publish(batch(101, 100), never);
  const jsm = await admin(t, server);
  const got = await stored(jsm);
  assert.deepEqual(got.map((m) => m.header.get('Tidemark-Seq')), batch(1, 200).map((m) => m.event.seq.toString()));

  // A connection closed for good is replaced on the next publish.
  await sinkConnection(sink).close();
  await sink.publish(batch(201, 10), never);
  assert.equal((await jsm.streams.info('TIDEMARK')).state.messages, 210);
  assert.deepEqual(unhandled, []);
});

test('an aborted publish rejects with the reason at once, leaving nothing unhandled', async (t) => {
  const server = await startNatsServer(t);
  const sink = sinkFor(t, server, { createStream: true });
  await sink.open(TARGET, never);
  await server.pause();
  t.after(() => server.resume());
  const stop = new AbortController();
  const publishing = sink.publish(batch(1, 50), stop.signal);
  const reason = new Error('stopping');
  stop.abort(reason);
  await assert.rejects(publishing, (err) => err === reason);
  // Closing rejects the 50 abandoned requests at once ("connection closed");
  // a rejection nobody handled would be reported by the end of this turn.
  await sink.close();
  await new Promise((resolve) => setImmediate(resolve));
  assert.deepEqual(unhandled, []);
});

test('options are checked in the constructor, naming the option; description never shows a password', () => {
  const invalid = (options: unknown, option: string, pattern: RegExp) =>
    assert.throws(
      () => new NatsSink(options as NatsSinkOptions),
      (err: unknown) => err instanceof InvalidOptionsError && err.option === option && pattern.test(err.message) && !err.message.includes('hunter2'),
    );
  invalid({ url: 'nats://h:4222', stram: 'X' }, 'stram', /is not a NatsSink option/);
  invalid({}, 'url', /expected a NATS URL/);
  invalid({ url: 'http://h:4222' }, 'url', /scheme "http"/);
  invalid({ url: 'nats://u:hunter2@h:4222/path' }, 'url', /path/);
  invalid({ url: 'nats://u:hunter2@h:99999' }, 'url', /not a URL/);
  invalid({ url: 'nats://a:1,tls://b:2' }, 'url', /mixes/);
  for (const stream of ['a.b', 'a b', 'a>', 'a*', 'a/b', '']) invalid({ url: 'nats://h', stream }, 'stream', /JetStream stream name/);
  invalid({ url: 'nats://h', subject: '{schema}.{kind2}' }, 'subject', /unknown field \{kind2\}/);
  invalid({ url: 'nats://h', subject: '{schema}..{kind}' }, 'subject', /empty token/);
  invalid({ url: 'nats://h', subject: '{schema}.*' }, 'subject', /wildcard/);
  invalid({ url: 'nats://h', ackTimeoutMs: 0 }, 'ackTimeoutMs', /integer/);
  invalid({ url: 'nats://h', createStream: 'yes' }, 'createStream', /boolean/);

  const sink = new NatsSink({ url: 'nats://relay:hunter2@10.0.0.1:4222,10.0.0.2' });
  assert.equal(sink.name, 'nats');
  assert.equal(sink.description, 'nats://10.0.0.1:4222,10.0.0.2:4222 stream TIDEMARK subject {schema}.{stream}.{kind}');
  assert.equal(sink.ackTimeoutMs, 10_000);
});

test('subjects: fields escaped token by token, filters cut at the first per-event field, NATS wildcard coverage', () => {
  assert.equal(subjectField('order.placed'), 'order.placed');
  assert.equal(subjectField('a b\t*>\u0000'), 'a_b____');
  assert.equal(subjectField('.x..y.'), '_.x._.y._');
  assert.equal(subjectField(''), '_');

  const filter = (text: string, stream = 'orders') => subjectFilter(compileTemplate(text, 'subject'), 'tidemark', stream);
  assert.equal(filter('{schema}.{stream}.{kind}'), 'tidemark.orders.>');
  assert.equal(filter('{schema}.{stream}.{kind}', 'eu west.*'), 'tidemark.eu_west._.>');
  assert.equal(filter('events.{stream}.x{kind}.{schema}'), 'events.orders.>');
  assert.equal(filter('{seq}.{stream}'), '>');
  assert.equal(filter('all.{schema}.{stream}'), 'all.tidemark.orders');

  const covers: [string, string, boolean][] = [
    ['>', 'a', true],
    ['>', 'a.>', true],
    ['a.>', 'a.b.>', true],
    ['a.>', 'a.>', true],
    ['a.>', 'a', false],
    ['a.*', 'a.b', true],
    ['a.*', 'a.>', false],
    ['a.*', 'a.*', true],
    ['a.b', 'a.*', false],
    ['a.*.>', 'a.b.>', true],
    ['a.*.>', 'a.>', false],
    ['a.b', 'a.b', true],
    ['a.b', 'a.b.c', false],
    ['a.b.c', 'a.b', false],
    ['a.b', 'a.c', false],
  ];
  for (const [pattern, f, expected] of covers) assert.equal(subjectCovers(pattern, f), expected, `${pattern} covers ${f}`);
  assert.deepEqual(minimalFilters(['a.b.>', 'a.>', 'c.d', 'a.>', 'c.d']), ['a.>', 'c.d']);

  for (const value of ['plain', ' 50% \r\nend\t', '\u0085ü✓', '%25']) assert.equal(decodeURIComponent(headerText(value)), value);
  assert.equal(headerText('order.placed'), 'order.placed');
});
