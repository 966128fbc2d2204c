/** An event as the RabbitMQ sink publishes it: the AMQP header table and the names templates render. */
import { Buffer } from 'node:buffer';
import type { Options } from 'amqplib';
import { SinkError } from '../../../errors.js';
import { streamEvent } from '../../../consumer/exact-json.js';
import { stringHeaders, type RelayMessage } from '../../sink.js';
import { HEADER_TABLE_MAX_BYTES, NAME, NOT_COPIED, SHORTSTR_MAX_BYTES } from './protocol.js';

/** One message ready to publish. */
export interface Outgoing {
  seq: bigint;
  id: string;
  exchange: string;
  routingKey: string;
  content: Buffer;
  options: Options.Publish;
}


/**
 * The `tidemark-*` headers, a binary-mode CloudEvent's `cloudEvents:*`
 * attributes (all but `datacontenttype`, the message's content type), then each own header whose value is a string
 * under its own name while the table stays within amqplib's limit (all of
 * them are in `tidemark-headers`, as JSON, whatever their type).
 */
export function headerTable(message: RelayMessage, cloudEvent: readonly [string, string][] = []): Record<string, string> {
  const { event } = message;
  const table: Record<string, string> = Object.create(null) as Record<string, string>;
  table['tidemark-seq'] = event.seq.toString();
  table['tidemark-stream'] = event.stream;
  table['tidemark-kind'] = event.kind;
  table['tidemark-key'] = event.key;
  table['tidemark-occurred-at'] = event.occurredAt.toISOString();
  table['tidemark-headers'] = event.headersText;
  // A binary-mode CloudEvent's attributes (CloudEvents' AMQP binding): `cloudEvents:<name>`.
  for (const [name, value] of cloudEvent) table[`cloudEvents:${name}`] = value;
  let size = 0;
  for (const [name, value] of Object.entries(table)) size += entryBytes(name, value);
  if (size > HEADER_TABLE_MAX_BYTES) {
    throw new SinkError(NAME, `seq ${event.seq}: its headers take ${size} bytes as an AMQP header table, over amqplib's ${HEADER_TABLE_MAX_BYTES}`, {
      retryable: false,
      seq: event.seq,
    });
  }
  for (const [name, value] of stringHeaders(event.headersText)) {
    if (typeof value !== 'string' || name === '' || name.startsWith('tidemark-') || NOT_COPIED.has(name)) continue;
    if (Buffer.byteLength(name) > SHORTSTR_MAX_BYTES || size + entryBytes(name, value) > HEADER_TABLE_MAX_BYTES) continue;
    table[name] = value;
    size += entryBytes(name, value);
  }
  return table;
}

/** A string entry of an AMQP field table: name length, name, type tag, value length, value. */
function entryBytes(name: string, value: string): number {
  return 1 + Buffer.byteLength(name) + 1 + 4 + Buffer.byteLength(value);
}

/** `value` when it fits an AMQP short string; a rendered name that does not stops the relay. */
export function shortString(value: string, option: 'exchange' | 'routingKey', seq?: bigint): string {
  const bytes = Buffer.byteLength(value);
  if (bytes === 0 || bytes > SHORTSTR_MAX_BYTES) {
    const what = `${seq === undefined ? '' : `seq ${seq}: `}the ${option} template renders ${bytes} bytes`;
    throw new SinkError(NAME, `${what}; AMQP takes 1 to ${SHORTSTR_MAX_BYTES}: change ${option}`, { retryable: false, seq });
  }
  return value;
}

/** A message carrying only what a `{schema}`/`{stream}` template reads. */
export function probe(schema: string, stream: string): RelayMessage {
  return { id: '', schema, event: streamEvent({ seq: 0n, stream, kind: '', key: '', payloadText: '{}', headersText: '{}', occurredAt: new Date(0) }) };
}
