/**
 * One OpenTelemetry span per page the relay publishes, when
 * `@opentelemetry/api` is installed: kind PRODUCER, named
 * `<stream> publish`, active while the sink publishes, linked to the spans
 * that appended the page's events (their `traceparent` headers). The
 * messages themselves carry each event's own trace context (its headers), so
 * a consumer of the broker continues the appending request's trace; this
 * span shows the relay's part, and its links lead to those traces.
 */
import type { Attributes, Link } from '@opentelemetry/api';
import { endAfter, noProvider, producingContext, tidemarkTracer, type Otel } from '../tracing.js';
import type { RelayMessage } from './sink.js';

/**
 * The most links a page's span carries: distinct producing contexts in seq
 * order; the rest are counted in `tidemark.links.dropped`. A page holds up
 * to `batchSize` events, and tracing backends keep only so many links.
 */
export const MAX_PAGE_LINKS = 128;

/**
 * Runs `publish` (the page's publish, until the broker acknowledged it) in
 * the page's span; just `publish()` without the package, or with no tracer
 * provider registered (the span would record nothing, and reading every
 * event's trace context for its links costs about a microsecond an event).
 */
export function inPublishSpan(api: Otel | null, sink: string, stream: string, messages: readonly RelayMessage[], publish: () => Promise<void>): Promise<void> {
  if (!api || messages.length === 0 || noProvider(api)) return publish();
  const links: Link[] = [];
  const seen = new Set<string>();
  let dropped = 0;
  for (const { event } of messages) {
    const producer = producingContext(api, event.headersText);
    if (!producer) continue;
    const id = `${producer.traceId}-${producer.spanId}`;
    if (seen.has(id)) continue;
    seen.add(id);
    if (links.length < MAX_PAGE_LINKS) links.push({ context: producer });
    else dropped += 1;
  }
  const attributes: Attributes = {
    'messaging.system': sink,
    'messaging.operation.type': 'send',
    'messaging.operation.name': 'publish',
    'messaging.destination.name': stream,
    'messaging.batch.message_count': messages.length,
    'tidemark.sink': sink,
    'tidemark.seq.first': messages[0]!.event.seq.toString(),
    'tidemark.seq.last': messages[messages.length - 1]!.event.seq.toString(),
  };
  if (dropped > 0) attributes['tidemark.links.dropped'] = dropped;
  return tidemarkTracer(api).startActiveSpan(`${stream} publish`, { kind: api.SpanKind.PRODUCER, attributes, links }, (span) => endAfter(api, span, publish));
}
