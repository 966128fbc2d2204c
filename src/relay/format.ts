/**
 * What a sink's messages look like: tidemark's own layout (the payload as
 * the body, the event's fields in `tidemark-*` headers) or a CloudEvent
 * (CloudEvents 1.0, https://cloudevents.io), in structured mode (the body
 * is the event's JSON envelope, `application/cloudevents+json`) or binary
 * mode (the body is the payload, the attributes are headers: `ce-*` over
 * HTTP and NATS, `cloudEvents:*` over AMQP).
 *
 * The attributes of an event's CloudEvent:
 * - `id`: `<origin>:<seq>`, the installation's origin id (migration 18, a
 *   random UUID) and the seq: unique across databases and schemas, and the
 *   same on every publish of the event;
 * - `source`: a template, default `/tidemark/{schema}/{stream}`;
 * - `type`: a template, default `{kind}`;
 * - `subject`: the key (absent when the key is empty);
 * - `time`: `occurred_at` (RFC 3339, milliseconds);
 * - `datacontenttype`: `application/json`;
 * - `data`: the payload, PostgreSQL's JSON text byte for byte: in a
 *   structured envelope it is the value of `data` as it is, never parsed and
 *   written again;
 * - extensions `tidemarkseq` (decimal) and `tidemarkstream`, and
 *   `traceparent` / `tracestate` (the Distributed Tracing extension) when
 *   the event's headers carry them as strings.
 */
import { InvalidOptionsError } from '../errors.js';
import { echoValue } from '../options.js';
import type { RelayMessage } from './sink.js';
import { compileTemplate, type Template } from './template.js';

/** The layouts a sink can publish. */
export const FORMATS = ['tidemark', 'cloudevents', 'cloudevents-binary'] as const;
export type RelayFormat = (typeof FORMATS)[number];

/** The format options every sink takes. */
export interface FormatOptions {
  /**
   * `tidemark` (default): the payload as the body, the event's fields in
   * headers. `cloudevents`: a structured-mode CloudEvent as the body.
   * `cloudevents-binary`: the payload as the body, the CloudEvent's
   * attributes as headers (sinks whose messages have headers).
   */
  format?: RelayFormat;
  /** The CloudEvents `source` template. Default `/tidemark/{schema}/{stream}`. */
  ceSource?: string;
  /** The CloudEvents `type` template. Default `{kind}`. */
  ceType?: string;
}

export const CE_SPEC_VERSION = '1.0';
export const CE_STRUCTURED_CONTENT_TYPE = 'application/cloudevents+json';
export const CE_DATA_CONTENT_TYPE = 'application/json';
const DEFAULT_SOURCE = '/tidemark/{schema}/{stream}';
const DEFAULT_TYPE = '{kind}';

/** A checked format: renders an event's CloudEvent. */
export interface MessageFormat {
  readonly format: RelayFormat;
  /** The `source` template in force (for descriptions). */
  readonly source: string;
  /** The `type` template in force. */
  readonly type: string;
  /**
   * The CloudEvent's attributes without `data`, in the order of the module
   * comment: context attributes, then extensions. `origin` is the
   * installation's id (`SinkTarget.origin`).
   */
  attributes(message: RelayMessage, origin: string): [name: string, value: string][];
  /** The structured-mode envelope as JSON text; `data` is the payload's text as it is. */
  structured(message: RelayMessage, origin: string): string;
}

/**
 * Checks the format options of sink `sink` (throws `InvalidOptionsError`
 * naming the option). `binary`: whether the sink has headers to carry
 * binary mode.
 */
export function messageFormat(options: FormatOptions, sink: string, binary: boolean): MessageFormat {
  const format = options.format ?? 'tidemark';
  if (!(FORMATS as readonly unknown[]).includes(format)) {
    throw new InvalidOptionsError('format', `expected one of ${FORMATS.join(', ')}, got ${echoValue(format)}`);
  }
  if (format === 'cloudevents-binary' && !binary) {
    throw new InvalidOptionsError('format', `cloudevents-binary needs message headers, which the ${sink} sink does not have: use cloudevents (structured mode)`);
  }
  if (format === 'tidemark') {
    for (const name of ['ceSource', 'ceType'] as const) {
      if (options[name] !== undefined) throw new InvalidOptionsError(name, `applies to the cloudevents formats, not ${format}`);
    }
  }
  const source = compileTemplate(options.ceSource ?? DEFAULT_SOURCE, 'ceSource');
  const type = compileTemplate(options.ceType ?? DEFAULT_TYPE, 'ceType');
  return {
    format,
    source: source.text,
    type: type.text,
    attributes: (message, origin) => attributes(message, origin, source, type),
    structured(message, origin) {
      let out = '{';
      for (const [name, value] of attributes(message, origin, source, type)) out += `${JSON.stringify(name)}:${JSON.stringify(value)},`;
      return `${out}"data":${message.event.payloadText}}`;
    },
  };
}

/** The CloudEvents `id` of an event: `<origin>:<seq>`. */
export function cloudEventId(origin: string, seq: bigint): string {
  return `${origin}:${seq}`;
}

/** A W3C `traceparent`: version, trace id, parent id, flags, lower-case hex. */
const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

function attributes(message: RelayMessage, origin: string, source: Template, type: Template): [string, string][] {
  const { event } = message;
  const out: [string, string][] = [
    ['specversion', CE_SPEC_VERSION],
    ['id', cloudEventId(origin, event.seq)],
    ['source', source.render(message)],
    ['type', type.render(message)],
  ];
  if (event.key !== '') out.push(['subject', event.key]);
  out.push(['time', event.occurredAt.toISOString()], ['datacontenttype', CE_DATA_CONTENT_TYPE], ['tidemarkseq', event.seq.toString()], ['tidemarkstream', event.stream]);
  const trace = traceContext(event.headersText);
  if (trace) {
    out.push(['traceparent', trace.traceparent]);
    if (trace.tracestate !== undefined) out.push(['tracestate', trace.tracestate]);
  }
  return out;
}

/**
 * The W3C trace context an event's headers carry: a valid `traceparent` as
 * a string, and `tracestate` when a non-empty string. Read from the
 * headers' text (a plain parse: `event.headers` throws on a number no
 * JavaScript number holds exactly), and only when the text names a
 * traceparent at all.
 */
export function traceContext(headersText: string): { traceparent: string; tracestate: string | undefined } | undefined {
  if (!headersText.includes('"traceparent"')) return undefined;
  // JSON.parse makes every name an own property (even "__proto__"); jsonb keeps one value per name.
  const headers = JSON.parse(headersText) as { traceparent?: unknown; tracestate?: unknown };
  // Own properties only, as stringHeaders read them: never a polluted Object.prototype's.
  const traceparent = Object.hasOwn(headers, 'traceparent') ? headers.traceparent : undefined;
  const tracestate = Object.hasOwn(headers, 'tracestate') ? headers.tracestate : undefined;
  if (typeof traceparent !== 'string' || !TRACEPARENT.test(traceparent)) return undefined;
  return { traceparent, tracestate: typeof tracestate === 'string' && tracestate !== '' ? tracestate : undefined };
}
