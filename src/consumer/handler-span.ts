/**
 * A handler run inside an OpenTelemetry span per event, when
 * `@opentelemetry/api` is installed: kind CONSUMER, named `<stream> process`,
 * a child of the span that appended the event (its `traceparent` header) and
 * linked to it, with the messaging semantic conventions' attributes. The
 * handler's arguments, return value and errors pass through unchanged; a
 * synchronous return stays synchronous. While no tracer provider is
 * registered (the API installed, no SDK) the handler is called as it is.
 */
import type { Attributes, Link } from '@opentelemetry/api';
import { endAfter, noProvider, producingContext, tidemarkTracer, type Otel } from '../tracing.js';
import type { Handler } from './events.js';

/** Handlers tidemark runs for itself (the relay's page collector): no span of their own. */
const untracedHandlers = new WeakSet<Handler>();

/** Marks `handler` as tidemark's own: {@link handlerInSpans} leaves it as it is. */
export function untraced<H extends Handler>(handler: H): H {
  untracedHandlers.add(handler);
  return handler;
}

/** Where the handler's events come from, for the span's name and attributes. */
export interface HandlerSource {
  schema: string;
  consumer: string;
  stream: string;
}

/** `handler` running each event in a CONSUMER span (see the module comment); `handler` itself when it is not a function or is {@link untraced}. */
export function handlerInSpans(api: Otel, handler: Handler, source: HandlerSource): Handler {
  if (typeof handler !== 'function' || untracedHandlers.has(handler)) return handler;
  const tracer = tidemarkTracer(api);
  const { consumer, stream } = source;
  const name = `${stream} process`;
  const prefix = `${source.schema}:`;
  return (event, tx, context) => {
    // No SDK: the span would record nothing; the handler runs as it is.
    if (noProvider(api)) return handler(event, tx, context);
    const seq = event.seq.toString();
    // A literal, not a spread of shared attributes: spreading these dotted keys cost ten times the rest of the span.
    const attributes: Attributes = {
      'messaging.system': 'tidemark',
      'messaging.operation.type': 'process',
      'messaging.operation.name': 'process',
      'messaging.destination.name': stream,
      'messaging.consumer.group.name': consumer,
      'messaging.message.id': prefix + seq,
      'tidemark.seq': seq,
    };
    if (context.partition !== undefined) attributes['tidemark.partition'] = context.partition;
    const producer = producingContext(api, event.headersText);
    const links: Link[] | undefined = producer ? [{ context: producer }] : undefined;
    const parent = producer ? api.trace.setSpanContext(api.context.active(), producer) : api.context.active();
    return tracer.startActiveSpan(name, { kind: api.SpanKind.CONSUMER, attributes, links }, parent, (span) =>
      endAfter(api, span, () => handler(event, tx, context)),
    );
  };
}
