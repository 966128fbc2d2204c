import { InvalidEventError, InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, quoteIdent, validateSchema, type Queryable } from '../db/queryable.js';

/** A JSON object, as stored in `payload` and `headers`. */
export type JsonObject = { [key: string]: unknown };

/** An event to append. `seq` and `occurred_at` are assigned by the database. */
export interface NewEvent {
  /** Partition that consumers follow, e.g. `orders`. Non-empty. */
  stream: string;
  /** Event type, e.g. `order.placed`. Non-empty. */
  kind: string;
  /** Entity reference, e.g. the order id. Non-empty. */
  key: string;
  /** Event body. A JSON object; default `{}`. */
  payload?: JsonObject;
  /** Metadata such as trace ids. A JSON object; default `{}`. */
  headers?: JsonObject;
}

/** Options for {@link append} and {@link appendMany}. */
export interface AppendOptions {
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /** Largest allowed size of payload plus headers, as UTF-8 JSON bytes. Default 1 MiB (1048576). */
  maxEventBytes?: number;
}

/** Default for {@link AppendOptions.maxEventBytes}. */
export const DEFAULT_MAX_EVENT_BYTES = 1024 * 1024;

const FIELDS = new Set(['stream', 'kind', 'key', 'payload', 'headers']);
const sqlCache = new Map<string, { one: string; many: string }>();

function statements(schema: string): { one: string; many: string } {
  let sql = sqlCache.get(schema);
  if (!sql) {
    const events = `${quoteIdent(schema)}.events`;
    sql = {
      one: `INSERT INTO ${events} (stream, kind, key, payload, headers) VALUES ($1, $2, $3, $4, $5) RETURNING seq`,
      many:
        `INSERT INTO ${events} (stream, kind, key, payload, headers) ` +
        `SELECT stream, kind, key, payload, headers ` +
        `FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[]) ` +
        `WITH ORDINALITY AS e(stream, kind, key, payload, headers, n) ORDER BY n RETURNING seq`,
    };
    sqlCache.set(schema, sql);
  }
  return sql;
}

function resolve(options: AppendOptions): { schema: string; maxEventBytes: number } {
  const schema = validateSchema(options.schema ?? DEFAULT_SCHEMA);
  const maxEventBytes = options.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
  if (!Number.isSafeInteger(maxEventBytes) || maxEventBytes < 2) {
    throw new InvalidOptionsError('maxEventBytes', `expected an integer of at least 2, got ${String(maxEventBytes)}`);
  }
  return { schema, maxEventBytes };
}

function text(event: Record<string, unknown>, index: number, field: string): string {
  const value = event[field];
  if (typeof value !== 'string' || value.length === 0) {
    throw new InvalidEventError(index, field, 'must be a non-empty string');
  }
  if (value.includes('\u0000')) throw new InvalidEventError(index, field, 'must not contain NUL characters');
  return value;
}

function jsonObject(event: Record<string, unknown>, index: number, field: string): string {
  const value = event[field] === undefined ? {} : event[field];
  const proto: unknown = typeof value === 'object' && value !== null ? Object.getPrototypeOf(value) : undefined;
  if (proto !== Object.prototype && proto !== null) {
    throw new InvalidEventError(index, field, 'must be a plain JSON object');
  }
  let json: string;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    throw new InvalidEventError(index, field, `is not serialisable as JSON (${(err as Error).message})`);
  }
  // PostgreSQL's jsonb cannot store \u0000 in strings.
  if (json.includes('\\u0000')) throw new InvalidEventError(index, field, 'must not contain NUL characters');
  return json;
}

interface Row {
  stream: string;
  kind: string;
  key: string;
  payload: string;
  headers: string;
}

function validate(input: unknown, index: number, maxEventBytes: number): Row {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw new InvalidEventError(index, '(event)', 'must be an object with stream, kind and key');
  }
  const event = input as Record<string, unknown>;
  if ('seq' in event) {
    throw new InvalidEventError(index, 'seq', 'is assigned by the database under the fence and cannot be given');
  }
  for (const field of Object.keys(event)) {
    if (!FIELDS.has(field)) {
      throw new InvalidEventError(index, field, `is not an event field (expected ${[...FIELDS].join(', ')})`);
    }
  }
  const row = {
    stream: text(event, index, 'stream'),
    kind: text(event, index, 'kind'),
    key: text(event, index, 'key'),
    payload: jsonObject(event, index, 'payload'),
    headers: jsonObject(event, index, 'headers'),
  };
  const size = Buffer.byteLength(row.payload) + Buffer.byteLength(row.headers);
  if (size > maxEventBytes) {
    throw new InvalidEventError(index, 'payload', `payload and headers are ${size} bytes, over the limit of ${maxEventBytes} (maxEventBytes)`);
  }
  return row;
}

/**
 * Appends one event in the caller's transaction and returns its seq. The
 * insert takes the shared fence (a statement trigger does it), so call this
 * inside the same transaction as your own writes.
 *
 * @example
 * await client.query('BEGIN');
 * await client.query('UPDATE orders SET state = $1 WHERE id = $2', ['paid', id]);
 * const seq = await append(client, { stream: 'orders', kind: 'order.paid', key: id, payload: { amount } });
 * await client.query('COMMIT');
 */
export async function append(db: Queryable, event: NewEvent, options: AppendOptions = {}): Promise<bigint> {
  const { schema, maxEventBytes } = resolve(options);
  const row = validate(event, 0, maxEventBytes);
  const result = await db.query(statements(schema).one, [row.stream, row.kind, row.key, row.payload, row.headers]);
  return BigInt((result.rows[0] as { seq: string | number }).seq);
}

/**
 * Appends several events in one statement and returns their seqs in input
 * order. Every event is validated before anything is sent: one bad event
 * means nothing is written.
 */
export async function appendMany(db: Queryable, events: readonly NewEvent[], options: AppendOptions = {}): Promise<bigint[]> {
  const { schema, maxEventBytes } = resolve(options);
  if (!Array.isArray(events)) throw new InvalidOptionsError('events', 'expected an array of events');
  if (events.length === 0) return [];
  const rows = events.map((event, index) => validate(event, index, maxEventBytes));
  const result = await db.query(statements(schema).many, [
    rows.map((r) => r.stream),
    rows.map((r) => r.kind),
    rows.map((r) => r.key),
    rows.map((r) => r.payload),
    rows.map((r) => r.headers),
  ]);
  // Rows are inserted in ORDER BY n order and the identity (CACHE 1) hands a
  // session increasing numbers, so the sorted seqs follow the input order.
  return (result.rows as { seq: string | number }[])
    .map((r) => BigInt(r.seq))
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}
