/**
 * The CloudEvents formats (src/relay/format.ts) as each sink with headers
 * publishes them, judged by the official `cloudevents` SDK: every message
 * read back from JetStream and RabbitMQ is turned into a CloudEvent by the
 * SDK's HTTP binding (structured: the body; binary: the `ce-*` headers and
 * the body) and must validate. The payload's text must come through byte
 * for byte, a number JavaScript cannot hold included.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test, type TestContext } from 'node:test';
import { CloudEvent, HTTP } from 'cloudevents';
import { jetstreamManager, type JetStreamManager, type StoredMsg } from '@nats-io/jetstream';
import { connect as natsConnect } from '@nats-io/transport-node';
import { connect as amqpConnect, type Message } from 'amqplib';
import { InvalidOptionsError } from '../../src/errors.js';
import { cloudEventId, messageFormat, traceContext } from '../../src/relay/format.js';
import type { RelayMessage, SinkTarget } from '../../src/relay/sink.js';
import { NatsSink } from '../../src/relay/sinks/nats/sink.js';
import { RabbitMqSink } from '../../src/relay/sinks/rabbitmq/sink.js';
import { EXACT_PAYLOAD, relayMessage, TEST_ORIGIN } from '../support/memory-sink.js';
import { startNatsServer } from '../support/nats-server.js';

const never = new AbortController().signal;
const TARGET: SinkTarget = { schema: 'tidemark', streams: ['orders'], republishWithinMs: 30_000, origin: TEST_ORIGIN };
/** A payload no JavaScript number holds, and characters JSON escapes. */
const PAYLOAD = EXACT_PAYLOAD;

function message(seq: number, fields: { key?: string; headersText?: string } = {}): RelayMessage {
  return relayMessage(seq, { headersText: '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}', ...fields });
}

/** The SDK's reading of an HTTP-shaped message; throws when it is not a valid CloudEvent. */
function toEvent(headers: Record<string, string>, body: string): CloudEvent<unknown> {
  const read = HTTP.toEvent({ headers, body });
  const event = (Array.isArray(read) ? read[0] : read) as CloudEvent<unknown>;
  assert.equal(event.validate(), true);
  return event;
}

function checkAttributes(event: CloudEvent<unknown>, seq: number): void {
  assert.equal(event.specversion, '1.0');
  assert.equal(event.id, `${TEST_ORIGIN}:${seq}`);
  assert.equal(event.source, '/tidemark/tidemark/orders');
  assert.equal(event.type, 'order.placed');
  assert.equal(event.subject, `order-${seq}`);
  assert.equal(event.time, new Date(Date.UTC(2026, 11, 5, 9, 0, 0, seq)).toISOString());
  assert.equal(event.datacontenttype, 'application/json');
  assert.equal(event['tidemarkseq'], String(seq));
  assert.equal(event['tidemarkstream'], 'orders');
  assert.equal(event['traceparent'], '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
  assert.equal(event['tracestate'], 'k=v');
}

test('a structured CloudEvent keeps the payload text as its data, byte for byte, and validates', () => {
  const format = messageFormat({ format: 'cloudevents' }, 'test', false);
  const text = format.structured(message(7), TEST_ORIGIN);
  assert.ok(text.endsWith(`"data":${PAYLOAD}}`), text);
  checkAttributes(toEvent({ 'content-type': 'application/cloudevents+json' }, text), 7);
  assert.equal(cloudEventId(TEST_ORIGIN, 7n), `${TEST_ORIGIN}:7`);
});

test('an empty key has no subject; a traceparent that is not W3C is not an attribute; templates render source and type', () => {
  const format = messageFormat({ format: 'cloudevents', ceSource: 'urn:shop:{stream}', ceType: 'com.shop.{kind}' }, 'test', false);
  const attributes = new Map(format.attributes(message(3, { key: '', headersText: '{"traceparent": "nope", "tracestate": "k=v"}' }), TEST_ORIGIN));
  assert.equal(attributes.has('subject'), false);
  assert.equal(attributes.has('traceparent'), false);
  assert.equal(attributes.has('tracestate'), false, 'tracestate only beside a traceparent');
  assert.equal(attributes.get('source'), 'urn:shop:orders');
  assert.equal(attributes.get('type'), 'com.shop.order.placed');
  toEvent({ 'content-type': 'application/cloudevents+json' }, format.structured(message(3, { key: '' }), TEST_ORIGIN));
});

test('the trace context is read from the headers\' own names only: not from a polluted Object.prototype, not from a "__proto__" header', () => {
  const proto = Object.prototype as { traceparent?: string };
  proto.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  try {
    assert.equal(traceContext('{"other": "x", "note": "traceparent"}'), undefined);
    assert.equal(traceContext('{"__proto__": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}'), undefined);
  } finally {
    delete proto.traceparent;
  }
  assert.deepEqual(traceContext('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": ""}'), {
    traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
    tracestate: undefined,
  });
});

test('format options are checked: an unknown format, binary mode without headers, CloudEvents templates under the tidemark format', () => {
  assert.throws(() => messageFormat({ format: 'avro' as never }, 'test', true), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'format' && /tidemark, cloudevents, cloudevents-binary/.test(err.message));
  assert.throws(() => messageFormat({ format: 'cloudevents-binary' }, 'redis', false), (err: unknown) => err instanceof InvalidOptionsError && /redis sink/.test(err.message));
  assert.throws(() => messageFormat({ ceType: '{kind}' }, 'test', true), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'ceType');
  assert.throws(() => messageFormat({ format: 'cloudevents', ceSource: '{nope}' }, 'test', true), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'ceSource');
  assert.throws(() => new NatsSink({ url: 'nats://127.0.0.1:1', format: 'xml' as never }), InvalidOptionsError);
  assert.throws(() => new RabbitMqSink({ url: 'amqp://127.0.0.1', format: 'xml' as never }), InvalidOptionsError);
});

async function natsMessages(t: TestContext, format: 'cloudevents' | 'cloudevents-binary'): Promise<StoredMsg[]> {
  const server = await startNatsServer(t);
  const sink = new NatsSink({ url: server.url, createStream: true, format });
  t.after(() => sink.close());
  await sink.open(TARGET, never);
  await sink.publish([message(1), message(2)], never);
  const nc = await natsConnect({ servers: server.url });
  t.after(() => nc.close());
  const jsm: JetStreamManager = await jetstreamManager(nc);
  return [(await jsm.streams.getMessage('TIDEMARK', { seq: 1 }))!, (await jsm.streams.getMessage('TIDEMARK', { seq: 2 }))!];
}

function natsHeaders(m: StoredMsg): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, values] of m.header ?? []) out[name.toLowerCase()] = values[0]!;
  return out;
}

test('NATS, structured: the body is the envelope, content-type application/cloudevents+json, Nats-Msg-Id as before', async (t) => {
  const stored = await natsMessages(t, 'cloudevents');
  for (const [i, m] of stored.entries()) {
    const headers = natsHeaders(m);
    assert.equal(headers['content-type'], 'application/cloudevents+json');
    assert.equal(headers['nats-msg-id'], `tidemark:${i + 1}`);
    const body = new TextDecoder().decode(m.data);
    assert.ok(body.endsWith(`"data":${PAYLOAD}}`));
    checkAttributes(toEvent(headers, body), i + 1);
  }
});

test('NATS, binary: ce-* headers, the payload text as the body', async (t) => {
  const stored = await natsMessages(t, 'cloudevents-binary');
  for (const [i, m] of stored.entries()) {
    const headers = natsHeaders(m);
    assert.equal(headers['content-type'], 'application/json');
    const body = new TextDecoder().decode(m.data);
    assert.equal(body, PAYLOAD);
    const event = toEvent(headers, body);
    checkAttributes(event, i + 1);
  }
});

const AMQP_URL = 'amqp://guest:guest@127.0.0.1:5672/';

async function amqpMessages(t: TestContext, format: 'cloudevents' | 'cloudevents-binary'): Promise<Message[]> {
  const model = await amqpConnect(AMQP_URL);
  t.after(() => model.close());
  const ch = await model.createChannel();
  const exchange = `tidemark-test-ce-${randomUUID().slice(0, 8)}`;
  const { queue } = await ch.assertQueue('', { exclusive: true });
  await ch.assertExchange(exchange, 'topic', { durable: false, autoDelete: false });
  t.after(() => ch.deleteExchange(exchange).catch(() => undefined));
  await ch.bindQueue(queue, exchange, '#');
  const sink = new RabbitMqSink({ url: AMQP_URL, exchange, format });
  t.after(() => sink.close());
  await sink.open(TARGET, never);
  await sink.publish([message(1), message(2)], never);
  const out: Message[] = [];
  await new Promise<void>((resolve, reject) => {
    ch.consume(queue, (m) => m && out.push(m) >= 2 && resolve(), { noAck: true }).catch(reject);
  });
  return out;
}

/** An AMQP message as HTTP-shaped headers: `cloudEvents:x` is `ce-x`, the content type is `content-type`. */
function amqpHeaders(m: Message): Record<string, string> {
  const out: Record<string, string> = { 'content-type': String(m.properties.contentType) };
  for (const [name, value] of Object.entries(m.properties.headers ?? {})) {
    if (name.startsWith('cloudEvents:')) out[`ce-${name.slice('cloudEvents:'.length)}`] = String(value);
  }
  return out;
}

test('RabbitMQ, structured: the body is the envelope, content_type application/cloudevents+json, message_id as before', async (t) => {
  const got = await amqpMessages(t, 'cloudevents');
  for (const [i, m] of got.entries()) {
    assert.equal(m.properties.contentType, 'application/cloudevents+json');
    assert.equal(m.properties.messageId, `tidemark:${i + 1}`);
    const body = m.content.toString('utf8');
    assert.ok(body.endsWith(`"data":${PAYLOAD}}`));
    checkAttributes(toEvent(amqpHeaders(m), body), i + 1);
  }
});

test('RabbitMQ, binary: cloudEvents:* headers, the payload text as the body', async (t) => {
  const got = await amqpMessages(t, 'cloudevents-binary');
  for (const [i, m] of got.entries()) {
    assert.equal(m.properties.contentType, 'application/json');
    assert.equal(m.properties.headers?.['cloudEvents:datacontenttype'], undefined, 'the content type is the property');
    const body = m.content.toString('utf8');
    assert.equal(body, PAYLOAD);
    checkAttributes(toEvent(amqpHeaders(m), body), i + 1);
  }
});

