/**
 * OpenTelemetry trace context without a broker: what `append` stores in an
 * event's headers, the span a StreamClient handler runs in, and the relay's
 * span per published page (to a memory sink). The SDK's in-memory exporter
 * records the spans; the headers are read back as PostgreSQL's text.
 * (test/observability/tracing-nats.test.ts follows one trace from an HTTP
 * request through NATS.)
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { context, createTraceState, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type SpanContext } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { append, appendMany, EVENT_LIMITS, InvalidOptionsError, Relay, StreamClient, Watermarker, type StreamEvent } from '../../src/index.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { messageFormat } from '../../src/relay/format.js';
import type { RelayMessage } from '../../src/relay/sink.js';
import { headerTable } from '../../src/relay/sinks/rabbitmq/message.js';
import { MemorySink } from '../support/memory-sink.js';

after(closeAdmin);

const exporter = new InMemorySpanExporter();
const tracer = trace.getTracer('test');

before(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
});

/** A remote parent with a trace state, so that the spans started under it carry one. */
const REMOTE: SpanContext = {
  traceId: '0af7651916cd43dd8448eb211c80319c',
  spanId: 'b7ad6b7169203331',
  traceFlags: TraceFlags.SAMPLED,
  isRemote: true,
  traceState: createTraceState('vendor=abc,other=x"y'),
};

/** Runs `fn` in a new active span (under `parent` when given) and returns its result and the span's context. */
async function inSpan<T>(name: string, fn: () => Promise<T>, parent = context.active()): Promise<{ result: T; span: SpanContext }> {
  return tracer.startActiveSpan(name, {}, parent, async (span) => {
    try {
      return { result: await fn(), span: span.spanContext() };
    } finally {
      span.end();
    }
  });
}

async function headersOf(db: TestDb, seq: bigint): Promise<string> {
  return (await db.observer.query<{ h: string }>('SELECT headers::text AS h FROM tidemark.events WHERE seq = $1', [seq.toString()])).rows[0]!.h;
}

const traceparent = (span: SpanContext) => `00-${span.traceId}-${span.spanId}-01`;

test('append stores the active span as traceparent and tracestate under the caller\'s own headers, appendMany too', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const { result: seq, span } = await inSpan('request', () => append(pool, { stream: 's', kind: 'k', key: '1', headers: { big: 12345678901234567890n.toString(), n: 1.5 } }), trace.setSpanContext(ROOT_CONTEXT, REMOTE));
  assert.equal(span.traceId, REMOTE.traceId);
  assert.equal(
    await headersOf(db, seq),
    `{"n": 1.5, "big": "12345678901234567890", "tracestate": "vendor=abc,other=x\\"y", "traceparent": "${traceparent(span)}"}`,
  );

  const { result: seqs, span: batch } = await inSpan('batch', () => appendMany(pool, [{ stream: 's', kind: 'k', key: '2' }, { stream: 's', kind: 'k', key: '3', headers: {} }]));
  for (const s of seqs) assert.equal(await headersOf(db, s), `{"traceparent": "${traceparent(batch)}"}`, 'no tracestate when it is empty');
});

test('a traceparent or tracestate the caller set wins whole; no active span, or traceContext: false, adds nothing', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const { result: own } = await inSpan('request', async () => [
    await append(pool, { stream: 's', kind: 'k', key: '1', headers: { traceparent: 'mine' } }),
    await append(pool, { stream: 's', kind: 'k', key: '2', headers: { tracestate: 'mine=1' } }),
    await append(pool, { stream: 's', kind: 'k', key: '3' }, { traceContext: false }),
  ], trace.setSpanContext(ROOT_CONTEXT, REMOTE));
  assert.equal(await headersOf(db, own[0]!), '{"traceparent": "mine"}');
  assert.equal(await headersOf(db, own[1]!), '{"tracestate": "mine=1"}', 'never half a pair');
  assert.equal(await headersOf(db, own[2]!), '{}');

  assert.equal(await headersOf(db, await append(pool, { stream: 's', kind: 'k', key: '4' })), '{}', 'no active span');
  // A span context that is not valid (all zeros) is not stored either.
  const invalid = trace.setSpanContext(ROOT_CONTEXT, { traceId: '0'.repeat(32), spanId: '0'.repeat(16), traceFlags: 0 });
  assert.equal(await headersOf(db, await context.with(invalid, () => append(pool, { stream: 's', kind: 'k', key: '5' }))), '{}');

  await assert.rejects(append(pool, { stream: 's', kind: 'k', key: '6' }, { traceContext: 'no' as unknown as boolean }), (err) => err instanceof InvalidOptionsError && /traceContext/.test(err.message));
});

test('trace context that would take the headers over their limit is left out; the event is stored as written', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  // {"a": "xxx..."} renders as 9 bytes plus the string: 10 bytes left, far less than a traceparent.
  const filler = 'x'.repeat(EVENT_LIMITS.headersMaxBytes - 9 - 10);
  const { result: seq } = await inSpan('request', () => append(pool, { stream: 's', kind: 'k', key: '1', headers: { a: filler } }));
  assert.equal(await headersOf(db, seq), JSON.stringify({ a: filler }).replace(':', ': '));
  // The same with room for it: stored.
  const { result: roomy, span } = await inSpan('request', () => append(pool, { stream: 's', kind: 'k', key: '2', headers: { a: filler.slice(200) } }));
  assert.match(await headersOf(db, roomy), new RegExp(`^\\{"a": "x+", "traceparent": "${traceparent(span)}"\\}$`));
});

test('a StreamClient handler runs in a CONSUMER span, child of the appending span and linked to it; errors mark it; returns are unchanged', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 6 });
  const { result: seq, span: producer } = await inSpan('request', () => append(pool, { stream: 'orders', kind: 'k', key: '1' }));
  const untraced = await append(pool, { stream: 'orders', kind: 'k', key: '2' });
  assert.equal((await new Watermarker(pool, { owner: 'test' }).step()).outcome, 'advanced');
  exporter.reset();

  const client = new StreamClient(pool, { listen: false });
  t.after(() => client.close());
  const seen: { seq: bigint; span: SpanContext | undefined }[] = [];
  // A synchronous handler: it gets its span, and its return value is not turned into a promise.
  const result = await client.drain('billing', 'orders', (event: StreamEvent) => {
    seen.push({ seq: event.seq, span: trace.getActiveSpan()?.spanContext() });
  });
  assert.equal(result.delivered, 2);

  const spans = exporter.getFinishedSpans();
  assert.equal(spans.length, 2);
  const [first, second] = spans as [ReadableSpan, ReadableSpan];
  assert.equal(first.name, 'orders process');
  assert.equal(first.kind, SpanKind.CONSUMER);
  assert.equal(first.instrumentationScope.name, 'tidemark');
  assert.match(first.instrumentationScope.version ?? '', /^\d+\.\d+\.\d+/);
  assert.equal(first.spanContext().traceId, producer.traceId, 'the appending span\'s trace');
  assert.equal(first.parentSpanContext?.spanId, producer.spanId, 'its child');
  assert.deepEqual(first.links.map((l) => [l.context.traceId, l.context.spanId]), [[producer.traceId, producer.spanId]], 'and linked to it');
  assert.deepEqual(first.attributes, {
    'messaging.system': 'tidemark',
    'messaging.operation.type': 'process',
    'messaging.operation.name': 'process',
    'messaging.destination.name': 'orders',
    'messaging.consumer.group.name': 'billing',
    'messaging.message.id': `tidemark:${seq}`,
    'tidemark.seq': seq.toString(),
  });
  assert.equal(first.status.code, SpanStatusCode.UNSET);
  assert.deepEqual(seen.map((s) => s.span?.spanId), [first.spanContext().spanId, second.spanContext().spanId], 'the handler ran inside its span');
  assert.equal(second.attributes['tidemark.seq'], untraced.toString());
  assert.equal(second.links.length, 0, 'no producing span: no link');
  assert.notEqual(second.spanContext().traceId, producer.traceId);

  // A failing async handler: the span records the error, the tail gets the handler's own error.
  exporter.reset();
  await append(pool, { stream: 'orders', kind: 'k', key: '3' });
  assert.equal((await new Watermarker(pool, { owner: 'test' }).step()).outcome, 'advanced');
  const boom = new Error('boom');
  await assert.rejects(
    client.drain('billing', 'orders', async () => {
      await Promise.resolve();
      throw boom;
    }),
    (err: Error) => err.cause === boom,
  );
  const [failed] = exporter.getFinishedSpans() as [ReadableSpan];
  assert.equal(failed.status.code, SpanStatusCode.ERROR);
  assert.equal(failed.status.message, 'boom');
  assert.equal(failed.events[0]?.name, 'exception');
});

test('the relay publishes each page in a PRODUCER span linked to the appending spans, without a span per event', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 6 });
  const producers: SpanContext[] = [];
  for (let i = 0; i < 3; i += 1) producers.push((await inSpan('request', () => append(pool, { stream: 'orders', kind: 'k', key: String(i) }))).span);
  await append(pool, { stream: 'orders', kind: 'k', key: 'plain' });
  assert.equal((await new Watermarker(pool, { owner: 'test' }).step()).outcome, 'advanced');
  exporter.reset();

  const sink = new MemorySink();
  const relay = new Relay(pool, sink, { consumer: 'relay', streams: ['orders'], listen: false, pollIntervalMs: 20, batchSize: 10 });
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  await waitFor('the page acknowledged', async () => sink.acked.length === 4);
  stop.abort();
  await running;
  await relay.close();

  const spans = exporter.getFinishedSpans();
  assert.deepEqual(spans.map((s) => s.name), ['orders publish'], 'one span: the page, none per event');
  const [page] = spans as [ReadableSpan];
  assert.equal(page.kind, SpanKind.PRODUCER);
  assert.deepEqual(page.attributes, {
    'messaging.system': 'memory',
    'messaging.operation.type': 'send',
    'messaging.operation.name': 'publish',
    'messaging.destination.name': 'orders',
    'messaging.batch.message_count': 4,
    'tidemark.sink': 'memory',
    'tidemark.seq.first': sink.acked[0]!.event.seq.toString(),
    'tidemark.seq.last': sink.acked[3]!.event.seq.toString(),
  });
  assert.deepEqual(page.links.map((l) => l.context.spanId), producers.map((p) => p.spanId));
  assert.deepEqual(sink.acked.map((m) => m.event.headers.traceparent), [...producers.map(traceparent), undefined], 'each message keeps its event\'s own trace context');

  // Under the W3C names on every sink: RabbitMQ's header table, a CloudEvent's Distributed Tracing extension (NATS: tracing-nats.test.ts).
  const [first] = sink.acked as [RelayMessage];
  assert.equal(headerTable(first).traceparent, traceparent(producers[0]!));
  const attributes = new Map(messageFormat({ format: 'cloudevents' }, 'memory', false).attributes(first, '00000000-0000-4000-8000-000000000000'));
  assert.equal(attributes.get('traceparent'), traceparent(producers[0]!));
});
