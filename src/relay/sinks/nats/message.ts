/**
 * One event as a JetStream message: subject, headers, body, and its size
 * as the server counts it against `max_payload`.
 *
 * Headers: `Nats-Msg-Id` (`<schema>:<seq>`, JetStream's duplicate
 * detection), `Nats-Expected-Stream` (JetStream refuses the message rather
 * than store it in another stream), `Tidemark-Seq` (decimal),
 * `Tidemark-Stream`, `Tidemark-Kind`, `Tidemark-Key` (percent-encoded where
 * a header could not carry them exactly: `decodeURIComponent` gives the
 * value back), `Tidemark-Occurred-At` (ISO 8601), `Tidemark-Headers` (the
 * event's headers as PostgreSQL's JSON text, always), and each of the event's own
 * headers whose name is a header token outside the `Nats-` and `Tidemark-`
 * families and whose value is a string a header carries as it is. Body:
 * the payload as PostgreSQL's JSON text, byte for byte, in UTF-8.
 *
 * In the CloudEvents formats (src/relay/format.ts) the headers above stay,
 * and: `cloudevents` (structured mode) sends the event's envelope as the
 * body with `content-type: application/cloudevents+json`;
 * `cloudevents-binary` keeps the payload as the body and adds
 * `content-type: application/json` and one `ce-<attribute>` header per
 * attribute (CloudEvents' NATS binding), each value as `headerText` writes it.
 */
import type { MsgHdrs } from '@nats-io/transport-node';
import { nats } from './client.js';
import { stringHeaders, type RelayMessage } from '../../sink.js';
import type { Template } from '../../template.js';
import { CE_STRUCTURED_CONTENT_TYPE, type MessageFormat } from '../../format.js';
import { subjectField } from './subject.js';

/** An event ready to send. */
export interface NatsMessage {
  seq: bigint;
  subject: string;
  headers: MsgHdrs;
  body: Uint8Array;
  /** Header block plus body, in bytes: what the server compares with `max_payload`. */
  bytes: number;
}

/** Header names the event's own headers may not take: NATS's (they steer JetStream) and ours. */
const RESERVED_HEADER = /^(nats|tidemark)-/i;
/** An HTTP token (RFC 9110): what a header name may be. */
const HEADER_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** What a header value cannot carry as it is: control characters (CR and LF end it), and whitespace at its ends (the client trims it). */
const UNSAFE_HEADER_VALUE = /(?!\t)\p{Cc}|^\s|\s$/u;
const encoder = new TextEncoder();

/** The message's layout: tidemark's own (no format given) or a CloudEvent, with the installation's origin id. */
export interface NatsLayout {
  format: MessageFormat;
  origin: string;
}

/** Builds the message for `message`, to `stream`, on the subject `subject` renders. */
export function natsMessage(message: RelayMessage, stream: string, subject: Template, layout?: NatsLayout): NatsMessage {
  const { event } = message;
  const h = nats().transport.headers();
  h.set('Nats-Msg-Id', message.id);
  h.set('Nats-Expected-Stream', stream);
  h.set('Tidemark-Seq', event.seq.toString());
  h.set('Tidemark-Stream', headerText(event.stream));
  h.set('Tidemark-Kind', headerText(event.kind));
  h.set('Tidemark-Key', headerText(event.key));
  h.set('Tidemark-Occurred-At', event.occurredAt.toISOString());
  h.set('Tidemark-Headers', event.headersText);
  for (const [name, value] of stringHeaders(event.headersText)) {
    if (typeof value === 'string' && HEADER_TOKEN.test(name) && !RESERVED_HEADER.test(name) && !UNSAFE_HEADER_VALUE.test(value)) h.append(name, value);
  }
  let text = event.payloadText;
  if (layout?.format.format === 'cloudevents') {
    h.set('content-type', CE_STRUCTURED_CONTENT_TYPE);
    text = layout.format.structured(message, layout.origin);
  } else if (layout?.format.format === 'cloudevents-binary') {
    const attributes = layout.format.attributes(message, layout.origin);
    for (const [name, value] of attributes) {
      if (name === 'datacontenttype') h.set('content-type', value);
      else h.set(`ce-${name}`, headerText(value));
    }
  }
  const body = encoder.encode(text);
  return { seq: event.seq, subject: subject.render(message, subjectField), headers: h, body, bytes: headerBytes(h) + body.length };
}

/**
 * The header block's size on the wire: `NATS/1.0`, then `\r\n<name>: <value>`
 * per value, then `\r\n\r\n`, in UTF-8 (the client's encoding; the public
 * `MsgHdrs` type does not expose it).
 */
function headerBytes(h: MsgHdrs): number {
  let bytes = 'NATS/1.0'.length + 4; // and the closing \r\n\r\n
  for (const [name, values] of h) for (const value of values) bytes += 4 + Buffer.byteLength(name, 'utf8') + Buffer.byteLength(value, 'utf8'); // \r\n<name>: <value>
  return bytes;
}

/**
 * A field as a header value that reads back exactly: `%`, control
 * characters and whitespace at either end percent-encoded, anything else as
 * it is; `decodeURIComponent` restores the value.
 */
export function headerText(value: string): string {
  const inner = value.replace(/%|(?!\t)\p{Cc}/gu, encodeURIComponent);
  return inner.replace(/^\s+|\s+$/gu, (ends) => [...ends].map(encodeURIComponent).join(''));
}
