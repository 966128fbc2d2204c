/**
 * One trace from an HTTP request to the consumers of what it appended: an
 * HTTP client span calls a node:http server whose SERVER span appends an
 * event; a `StreamClient` tail handles it, and the relay publishes it to a
 * private nats-server, where a JetStream consumer of the test picks the
 * trace context up from the message's headers with the W3C propagator, as
 * any OpenTelemetry-instrumented NATS consumer would. Spans are recorded by
 * the SDK's in-memory exporter.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import {
  context,
  createTraceState,
  defaultTextMapGetter,
  defaultTextMapSetter,
  ROOT_CONTEXT,
  SpanKind,
  trace,
  TraceFlags,
  type SpanContext,
  type TextMapGetter,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { jetstream } from '@nats-io/jetstream';
import { connect, type MsgHdrs } from '@nats-io/transport-node';
import { append, NatsSink, Relay, StreamClient, Watermarker } from '../../src/index.js';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { startNatsServer } from '../support/nats-server.js';

after(closeAdmin);

const exporter = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
const tracer = trace.getTracer('test');
const w3c = new W3CTraceContextPropagator();

/** NATS message headers as a propagator's carrier. */
const natsGetter: TextMapGetter<MsgHdrs> = {
  keys: (h) => h.keys(),
  get: (h, key) => (h.has(key) ? h.get(key) : undefined),
};

/** The caller of the whole flow: a trace begun elsewhere, with a trace state to carry along. */
const UPSTREAM: SpanContext = {
  traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
  spanId: '00f067aa0ba902b7',
  traceFlags: TraceFlags.SAMPLED,
  isRemote: true,
  traceState: createTraceState('congo=t61rcWkgMzE'),
};

test('one trace id from an HTTP request to the NATS consumer: the appending SERVER span is the parent of the tail handler\'s span and of the NATS consumer\'s', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 8 });
  const server = await startNatsServer(t);

  // The application: each POST appends an order event inside its SERVER span.
  const http = createServer((req, res) => {
    const parent = w3c.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter);
    void tracer.startActiveSpan('POST /orders', { kind: SpanKind.SERVER }, parent, async (span) => {
      try {
        const seq = await append(pool, { stream: 'orders', kind: 'order.placed', key: 'o-1', payload: { amount: 5 } });
        res.end(seq.toString());
      } catch (err) {
        res.statusCode = 500;
        res.end(String(err));
      } finally {
        span.end();
      }
    });
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => http.close(resolve)));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/orders`;

  // The HTTP client: a CLIENT span under the upstream trace, its context sent as W3C headers.
  const seq = await tracer.startActiveSpan('POST', { kind: SpanKind.CLIENT }, trace.setSpanContext(ROOT_CONTEXT, UPSTREAM), async (span) => {
    try {
      const headers: Record<string, string> = {};
      w3c.inject(context.active(), headers, defaultTextMapSetter);
      const response = await fetch(url, { method: 'POST', headers });
      const body = await response.text();
      assert.equal(response.status, 200, body);
      return BigInt(body);
    } finally {
      span.end();
    }
  });
  assert.equal((await new Watermarker(pool, { owner: 'test' }).step()).outcome, 'advanced');

  // A tail of the same stream handles it.
  const client = new StreamClient(pool, { listen: false, pollIntervalMs: 20 });
  const stopTail = new AbortController();
  let handledIn: SpanContext | undefined;
  const tailing = client.tail('billing', 'orders', () => void (handledIn = trace.getActiveSpan()?.spanContext()), { signal: stopTail.signal }).catch((err: unknown) => err);
  await waitFor('the tail to handle the event', async () => handledIn);
  stopTail.abort();
  await tailing;
  await client.close();

  // The relay publishes it to NATS; a JetStream consumer continues the trace from the message's headers.
  const relay = new Relay(pool, new NatsSink({ url: server.url, createStream: true }), { consumer: 'relay', streams: ['orders'], listen: false, pollIntervalMs: 20 });
  const stopRelay = new AbortController();
  const relaying = relay.run(stopRelay.signal);
  t.after(async () => {
    stopRelay.abort();
    await relaying.catch(() => undefined);
    await relay.close();
  });
  const nc = await connect({ servers: server.url, name: 'test consumer' });
  t.after(() => nc.close());
  await waitFor('the relay to create the stream', async () => (await relay.lag())[0]?.cursor === seq, 30_000);
  const message = await (await jetstream(nc).consumers.get('TIDEMARK')).next({ expires: 10_000 });
  assert.ok(message, 'the relayed message');
  const h = message.headers!;
  await tracer.startActiveSpan('orders receive', { kind: SpanKind.CONSUMER }, w3c.extract(ROOT_CONTEXT, h, natsGetter), async (span) => span.end());
  stopRelay.abort();
  await relaying;

  const spans = exporter.getFinishedSpans();
  const named = (name: string): ReadableSpan => {
    const found = spans.filter((s) => s.name === name);
    assert.equal(found.length, 1, `one ${name} span, among ${spans.map((s) => s.name).join(', ')}`);
    return found[0]!;
  };
  const clientSpan = named('POST');
  const serverSpan = named('POST /orders');
  const handlerSpan = named('orders process');
  const receiveSpan = named('orders receive');
  const pageSpan = named('orders publish');
  const producing = `00-${serverSpan.spanContext().traceId}-${serverSpan.spanContext().spanId}-01`;

  // The message carries the appending span's context under the W3C names, exactly as stored.
  assert.equal(h.get('traceparent'), producing);
  assert.equal(h.get('tracestate'), 'congo=t61rcWkgMzE');
  assert.deepEqual(JSON.parse(h.get('Tidemark-Headers')), { traceparent: producing, tracestate: 'congo=t61rcWkgMzE' });

  // One trace, from the upstream caller to both consumers.
  for (const span of [clientSpan, serverSpan, handlerSpan, receiveSpan]) assert.equal(span.spanContext().traceId, UPSTREAM.traceId, span.name);
  assert.equal(clientSpan.parentSpanContext?.spanId, UPSTREAM.spanId);
  assert.equal(serverSpan.parentSpanContext?.spanId, clientSpan.spanContext().spanId, 'the server span continues the request');
  assert.equal(handlerSpan.parentSpanContext?.spanId, serverSpan.spanContext().spanId, 'the handler span is a child of the appending span');
  assert.deepEqual(handlerSpan.links.map((l) => l.context.spanId), [serverSpan.spanContext().spanId], 'and links to it');
  assert.equal(handledIn?.spanId, handlerSpan.spanContext().spanId, 'the handler ran in it');
  assert.equal(handlerSpan.kind, SpanKind.CONSUMER);
  assert.equal(handlerSpan.attributes['messaging.message.id'], `tidemark:${seq}`);
  assert.equal(receiveSpan.parentSpanContext?.spanId, serverSpan.spanContext().spanId, 'the NATS consumer continues the appending span');
  assert.equal(receiveSpan.spanContext().traceState?.serialize(), 'congo=t61rcWkgMzE');

  // The relay's page: a PRODUCER span of its own trace, linked to the appending span.
  assert.equal(pageSpan.kind, SpanKind.PRODUCER);
  assert.equal(pageSpan.attributes['tidemark.sink'], 'nats');
  assert.equal(pageSpan.attributes['messaging.batch.message_count'], 1);
  assert.deepEqual(pageSpan.links.map((l) => [l.context.traceId, l.context.spanId]), [[UPSTREAM.traceId, serverSpan.spanContext().spanId]]);
});
