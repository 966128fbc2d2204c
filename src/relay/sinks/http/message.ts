/**
 * One request of the HTTP sink: its body and headers, by format.
 *
 * `tidemark` (default): the body is the payload, PostgreSQL's JSON text
 * byte for byte (`content-type: application/json`); the event's fields are
 * headers: `tidemark-seq`, `tidemark-stream`, `tidemark-kind`,
 * `tidemark-key`, `tidemark-occurred-at` (ISO 8601), `tidemark-headers`
 * (the event's headers as JSON text). A text field is percent-encoded where
 * a header could not carry it as it is (`%`, anything outside printable
 * ASCII, whitespace at either end): `decodeURIComponent` gives it back. The
 * event's own headers whose value is a string follow under their own names
 * when the name is a header token outside the reserved families and the
 * value is printable ASCII, so `traceparent` and `tracestate` continue the
 * trace at the receiver.
 *
 * `cloudevents`: the body is the structured-mode envelope
 * (`application/cloudevents+json`). `cloudevents-binary` (CloudEvents' HTTP
 * binding): the body is the payload, `content-type` is `datacontenttype`,
 * each other attribute is a `ce-<name>` header percent-encoded as the
 * binding says, and `traceparent` / `tracestate` are plain headers.
 *
 * A batch (`batchSize` above 1) is one key's consecutive events in one
 * request, however many (one too): a JSON array of `{"id","seq","stream","kind","key","occurredAt",
 * "headers","payload"}` objects (`tidemark`), or CloudEvents' batch mode,
 * an array of envelopes (`application/cloudevents-batch+json`).
 */
import { Buffer } from 'node:buffer';
import { stringHeaders, type RelayMessage } from '../../sink.js';
import { CE_STRUCTURED_CONTENT_TYPE, cloudEventId, type MessageFormat } from '../../format.js';

export const CE_BATCH_CONTENT_TYPE = 'application/cloudevents-batch+json';

/** A request ready to sign and send. */
export interface Outgoing {
  /** The first event's seq: what a refusal names. */
  seq: bigint;
  stream: string;
  /** `webhook-id`: `<origin>:<seq>`, or `<origin>:<first>-<last>` for a batch. */
  id: string;
  body: Buffer;
  headers: Record<string, string>;
  /** Events in the request. */
  count: number;
}

/** Names the event's own headers may not take: ours, the bindings', and what steers HTTP itself or carries credentials. */
const RESERVED_FAMILY = /^(tidemark|webhook|ce|content|proxy|sec|x-forwarded)-/i;
const RESERVED = new Set([
  'host', 'connection', 'keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'expect', 'date',
  'authorization', 'cookie', 'forwarded', 'user-agent', 'content-type', 'content-length', 'content-encoding',
]);
/** An HTTP token (RFC 9110): what a header name may be. */
const HEADER_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** A value copied as it is: printable ASCII and tabs, no whitespace at its ends. */
const PLAIN_VALUE = /^[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?$/;

/** What {@link headerText} encodes: `%`, anything outside printable ASCII, a space at either end. */
const NEEDS_ENCODING = /[^\x20-\x7e]|%|^ | $/u;

/** A text field as a header value that reads back exactly with `decodeURIComponent`. */
export function headerText(value: string): string {
  if (!NEEDS_ENCODING.test(value)) return value; // the usual case, without building a new string
  const inner = value.replace(/%|[^\x20-\x7e]/gu, encodeURIComponent);
  return inner.replace(/^ +| +$/g, (ends) => ends.replaceAll(' ', '%20'));
}

/** A CloudEvents attribute value as the HTTP binding writes it: space, `"`, `%` and all outside printable ASCII percent-encoded (UTF-8). */
export function ceHeaderText(value: string): string {
  return value.replace(/[^\x21-\x7e]|["%]/gu, encodeURIComponent);
}

/** The `tidemark-*` headers, then the event's own copyable ones: one object literal (a fixed shape is cheaper to build and to send than a dictionary). */
function eventHeaders(message: RelayMessage, contentType: string): Record<string, string> {
  const { event } = message;
  const headers: Record<string, string> = {
    'content-type': contentType,
    'tidemark-seq': event.seq.toString(),
    'tidemark-stream': headerText(event.stream),
    'tidemark-kind': headerText(event.kind),
    'tidemark-key': headerText(event.key),
    'tidemark-occurred-at': event.occurredAt.toISOString(),
    'tidemark-headers': headerText(event.headersText),
  };
  // No own header to copy (`{}`, the usual case for events without trace context): skip the parse.
  if (event.headersText.length <= 2) return headers;
  for (const [name, value] of stringHeaders(event.headersText)) {
    if (!HEADER_TOKEN.test(name) || RESERVED_FAMILY.test(name) || RESERVED.has(name.toLowerCase()) || !PLAIN_VALUE.test(value)) continue;
    headers[name.toLowerCase()] = value;
  }
  return headers;
}

/** The request for one event. */
export function single(message: RelayMessage, format: MessageFormat, origin: string): Outgoing {
  const { event } = message;
  const headers = eventHeaders(message, 'application/json');
  let text = event.payloadText;
  if (format.format === 'cloudevents') {
    headers['content-type'] = CE_STRUCTURED_CONTENT_TYPE;
    text = format.structured(message, origin);
  } else if (format.format === 'cloudevents-binary') {
    for (const [name, value] of format.attributes(message, origin)) {
      if (name === 'datacontenttype') headers['content-type'] = value;
      else if (name === 'traceparent' || name === 'tracestate') {
        // Copied as the tidemark format copies them: only a value a header carries as it is.
        if (PLAIN_VALUE.test(value)) headers[name] = value;
      }
      else headers[`ce-${name}`] = ceHeaderText(value);
    }
  }
  return { seq: event.seq, stream: event.stream, id: cloudEventId(origin, event.seq), body: Buffer.from(text, 'utf8'), headers, count: 1 };
}

/** The request for a run of one key's events (`batchSize` above 1: always an array, one event included). */
export function batch(messages: readonly RelayMessage[], format: MessageFormat, origin: string): Outgoing {
  const first = messages[0]!.event;
  const last = messages[messages.length - 1]!.event;
  const headers: Record<string, string> = Object.create(null) as Record<string, string>;
  let text = '[';
  messages.forEach((message, i) => {
    const { event } = message;
    if (i > 0) text += ',';
    if (format.format === 'cloudevents') text += format.structured(message, origin);
    else {
      text +=
        `{"id":${JSON.stringify(cloudEventId(origin, event.seq))},"seq":"${event.seq}","stream":${JSON.stringify(event.stream)},` +
        `"kind":${JSON.stringify(event.kind)},"key":${JSON.stringify(event.key)},"occurredAt":"${event.occurredAt.toISOString()}",` +
        `"headers":${event.headersText},"payload":${event.payloadText}}`;
    }
  });
  text += ']';
  headers['content-type'] = format.format === 'cloudevents' ? CE_BATCH_CONTENT_TYPE : 'application/json';
  headers['tidemark-seq'] = `${first.seq}-${last.seq}`;
  headers['tidemark-stream'] = headerText(first.stream);
  headers['tidemark-key'] = headerText(first.key);
  headers['tidemark-count'] = String(messages.length);
  return { seq: first.seq, stream: first.stream, id: `${cloudEventId(origin, first.seq)}-${last.seq}`, body: Buffer.from(text, 'utf8'), headers, count: messages.length };
}
