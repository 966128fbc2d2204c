// One trace from the request that appended an event to the handler that
// consumed it. An OpenTelemetry SDK is set up here with an in-memory
// exporter, so the example can print what it recorded; a service sets up
// its own SDK and exporter once, and tidemark finds @opentelemetry/api.
// Run: DATABASE_URL=postgres://... npx tsx examples/tracing.ts
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { append, createPool, migrate, StreamClient, Watermarker } from 'tidemark';

const exporter = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));

const pool = createPool({ connectionString: process.env.DATABASE_URL });
await migrate(pool);

// The request: its span is active while the event is appended, so the
// event's headers get its traceparent.
const seq = await trace.getTracer('shop').startActiveSpan('POST /orders', async (span) => {
  try {
    return await append(pool, { stream: 'traced-orders', kind: 'order.placed', key: 'o-1', payload: { total: 42 } });
  } finally {
    span.end();
  }
});

const watermarker = new Watermarker(pool);
await watermarker.step(); // a service runs `tidemark serve` for this
await new StreamClient(pool).drain('traced-billing', 'traced-orders', (event) => {
  if (event.seq === seq) console.log(`handled ${event.kind}, traceparent ${event.headers.traceparent === undefined ? 'missing' : 'stored'}`);
});

const spans = exporter.getFinishedSpans();
const request = spans.find((s) => s.name === 'POST /orders')!;
const handler = spans.find((s) => s.name === 'traced-orders process')!;
console.log(`handler span in the request's trace: ${handler.spanContext().traceId === request.spanContext().traceId}`);
console.log(`handler span's parent is the request span: ${handler.parentSpanContext?.spanId === request.spanContext().spanId}`);
await watermarker.close();
await pool.end();
