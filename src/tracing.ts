/**
 * OpenTelemetry trace context, when the application has `@opentelemetry/api`
 * (an optional peer dependency): the W3C `traceparent` / `tracestate` text
 * that `append` stores in an event's headers, read back on the consumer and
 * relay side as the producing span's context. Without the package nothing
 * here runs: it is looked for once, on the first call that could use it,
 * and its absence is remembered.
 */
import { readFileSync } from 'node:fs';
import type * as OtelApi from '@opentelemetry/api';
import { importOptional } from './options.js';

/** The `@opentelemetry/api` module. */
export type Otel = typeof OtelApi;

/** The instrumentation scope's name: tidemark's spans come from this tracer. */
export const TRACER_NAME = 'tidemark';
/** The header names of the W3C Trace Context, as stored in an event's headers and copied to messages. */
export const TRACEPARENT = 'traceparent';
export const TRACESTATE = 'tracestate';

/** A `traceparent` of version 00 as W3C Trace Context writes it: trace id, parent span id, flags, lower-case hex. */
const TRACEPARENT_TEXT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
/** A `tracestate` value a header carries as it is: printable ASCII (W3C Trace Context, section 3.3). */
const TRACESTATE_TEXT = /^[\x20-\x7e]+$/;

/** undefined: not looked for yet; null: not installed (or not loadable); else the module. */
let otel: Otel | null | undefined;
let loading: Promise<Otel | null> | undefined;

/**
 * `@opentelemetry/api`, loaded on the first call and kept; null when it
 * cannot be loaded. Any failure counts as absent: trace context is an
 * addition, never a reason for an append or a page to fail.
 */
export function loadOtel(): Promise<Otel | null> {
  if (otel !== undefined) return Promise.resolve(otel);
  loading ??= importOptional<Otel>('@opentelemetry/api', 'trace context').then(
    (api) => (otel = api),
    () => (otel = null),
  );
  return loading;
}

/** The module when {@link loadOtel} found it (synchronous, for hot paths); undefined before the first load ended. */
export function loadedOtel(): Otel | null | undefined {
  return otel;
}

let version: string | undefined | null = null;

/** tidemark's version, for the tracer's scope: package.json one level up from src/ and dist/. */
function packageVersion(): string | undefined {
  if (version === null) {
    try {
      version = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: string }).version;
    } catch {
      version = undefined;
    }
  }
  return version;
}

let noopProvider: object | undefined;

/**
 * Whether no tracer provider is registered (no SDK): every span would be a
 * no-op, so a per-event span can be skipped. Checked per call, so a
 * provider registered later is seen. Another copy of the API than the one
 * tidemark loaded registers its own no-op: then this says false, and the
 * spans are started as usual.
 */
export function noProvider(api: Otel): boolean {
  noopProvider ??= new api.ProxyTracerProvider().getDelegate();
  const provider = api.trace.getTracerProvider();
  return provider instanceof api.ProxyTracerProvider && provider.getDelegate() === noopProvider;
}

/** tidemark's tracer from the global provider (a proxy: a provider registered later is used too). */
export function tidemarkTracer(api: Otel): OtelApi.Tracer {
  return api.trace.getTracer(TRACER_NAME, packageVersion());
}

/**
 * The active span's context as JSON members to add to an event's headers:
 * `"traceparent": "00-…"` and, when the trace state is not empty,
 * `"tracestate": "…"`, with the UTF-8 bytes they add as jsonb renders them
 * (`size`: the members and one `, ` each). Undefined when no valid span is
 * active, or the trace state is not printable ASCII.
 */
export function activeTraceMembers(api: Otel): { text: string; size: number } | undefined {
  const span = api.trace.getSpanContext(api.context.active());
  if (span === undefined || !api.trace.isSpanContextValid(span)) return undefined;
  const flags = (span.traceFlags & 0xff).toString(16).padStart(2, '0');
  // Hex and '-' only: the JSON text is the value in quotes, and jsonb prints it so.
  let text = `"${TRACEPARENT}": "00-${span.traceId}-${span.spanId}-${flags}"`;
  const state = span.traceState?.serialize();
  if (state) {
    if (!TRACESTATE_TEXT.test(state)) return undefined; // a pair never goes half-stored
    // Printable ASCII: JSON.stringify escapes only `"` and `\`, as jsonb does, so its length is the rendered size.
    text += `, "${TRACESTATE}": ${JSON.stringify(state)}`;
  }
  return { text, size: text.length + 2 };
}

/**
 * The producing span's context from an event's headers (PostgreSQL's JSON
 * text): its `traceparent` and `tracestate` when they are strings and the
 * `traceparent` is valid; undefined otherwise. Never throws.
 */
export function producingContext(api: Otel, headersText: string): OtelApi.SpanContext | undefined {
  // Most events carry none: no parse for them.
  if (!headersText.includes(`"${TRACEPARENT}"`)) return undefined;
  let headers: Record<string, unknown>;
  try {
    headers = JSON.parse(headersText) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  const parent = headers[TRACEPARENT];
  const match = typeof parent === 'string' ? TRACEPARENT_TEXT.exec(parent) : null;
  if (!match) return undefined;
  const [, traceId, spanId, flags] = match as unknown as [string, string, string, string];
  // The format is checked above; W3C also refuses all-zero ids.
  if (traceId === api.INVALID_TRACEID || spanId === api.INVALID_SPANID) return undefined;
  const context: OtelApi.SpanContext = { traceId, spanId, traceFlags: parseInt(flags, 16), isRemote: true };
  const state = headers[TRACESTATE];
  if (typeof state === 'string' && state !== '') context.traceState = api.createTraceState(state);
  return context;
}

/** Ends `span` after `run`, marking a throw or a rejection as the span's error; a synchronous return stays synchronous. */
export function endAfter<T>(api: Otel, span: OtelApi.Span, run: () => T): T {
  let result: T;
  try {
    result = run();
  } catch (err) {
    failed(api, span, err);
    span.end();
    throw err;
  }
  if (isThenable(result)) {
    return Promise.resolve(result).then(
      (value: unknown) => {
        span.end();
        return value;
      },
      (err: unknown) => {
        failed(api, span, err);
        span.end();
        throw err;
      },
    ) as T;
  }
  span.end();
  return result;
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (typeof value === 'object' || typeof value === 'function') && value !== null && typeof (value as { then?: unknown }).then === 'function';
}

function failed(api: Otel, span: OtelApi.Span, err: unknown): void {
  span.recordException(err instanceof Error ? err : String(err));
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
}
