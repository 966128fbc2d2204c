import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, quoteIdent, validateSchema, type Queryable } from '../db/queryable.js';
import { booleanOption, integerOption } from '../options.js';
import { activeTraceMembers, loadedOtel, loadOtel } from '../tracing.js';
import { eventFromValue, type AddedHeaders, type EventRow } from './event.js';
import { EVENT_LIMITS } from './limits.js';

/** A JSON object, as stored in `payload` and `headers`. */
export type JsonObject = { [key: string]: unknown };

/**
 * An event to append. `seq` and `occurred_at` are assigned by the database.
 * The limits (`EVENT_LIMITS` in `src/outbox/limits.ts`) are checked before
 * anything is sent and enforced by the database for every writer. Text
 * fields must not contain NUL or a lone UTF-16 surrogate; JSON must not
 * contain `NaN`, `±Infinity`, BigInt, `\u0000` or a lone surrogate, which
 * PostgreSQL cannot store or JSON.stringify would change.
 */
export interface NewEvent {
  /** Partition that consumers follow, e.g. `orders`. 1-200 characters (UTF-16 code units), as consumers accept. */
  stream: string;
  /** Event type, e.g. `order.placed`. 1-200 characters. */
  kind: string;
  /** Entity reference, e.g. the order id. 1-256 characters. */
  key: string;
  /** Event body. A plain JSON object; default `{}`. With headers at most `maxEventBytes` as stored. */
  payload?: JsonObject;
  /** Metadata such as trace ids. A plain JSON object of at most 64 KiB as stored; default `{}`. */
  headers?: JsonObject;
}

/** Options for {@link append} and {@link appendMany}. Unknown options are refused. */
export interface AppendOptions {
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /**
   * Largest allowed size of payload plus headers, in UTF-8 bytes of the JSON
   * text PostgreSQL stores (`payload::text`). Default and maximum 1 MiB
   * (1048576, `EVENT_LIMITS.eventMaxBytes`, which the database enforces too);
   * set it lower to hold this writer to less.
   */
  maxEventBytes?: number;
  /**
   * Store the active OpenTelemetry span's W3C trace context in each event's
   * headers, as `traceparent` and `tracestate` (when not empty), so that the
   * relay's messages and the consumers' handler spans continue the trace.
   * Only when `@opentelemetry/api` is installed and a valid span is active;
   * never over headers that already name a `traceparent` or `tracestate`
   * (the caller's own trace context wins), and never when they would take
   * the event over a limit (the event is stored without them). Default true.
   */
  traceContext?: boolean;
}

/** Default for {@link AppendOptions.maxEventBytes}: the database's limit, `EVENT_LIMITS.eventMaxBytes`. */
export const DEFAULT_MAX_EVENT_BYTES = EVENT_LIMITS.eventMaxBytes;

const sqlCache = new Map<string, { one: string; many: string }>();

function statements(schema: string): { one: string; many: string } {
  let sql = sqlCache.get(schema);
  if (!sql) {
    const events = `${quoteIdent(schema)}.events`;
    sql = {
      one: `INSERT INTO ${events} (stream, kind, key, payload, headers) VALUES ($1, $2, $3, $4, $5) RETURNING seq`,
      // The multi-argument unnest in FROM is PostgreSQL's own form: the
      // parser expands it into ROWS FROM (pg_catalog.unnest(...), ...)
      // (transformRangeFunction), so no unnest on the search_path can be
      // chosen instead (test/schema/hostile-schema.test.ts).
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

const DEFAULTS = { schema: DEFAULT_SCHEMA, maxEventBytes: DEFAULT_MAX_EVENT_BYTES, traceContext: true };

/** Resolves {@link AppendOptions}; throws InvalidOptionsError naming the option. */
export function resolveAppendOptions(options: unknown): { schema: string; maxEventBytes: number; traceContext: boolean } {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new InvalidOptionsError('options', `expected an object of append options (${Object.keys(DEFAULTS).join(', ')})`);
  }
  for (const name of Object.keys(options)) {
    if (!Object.hasOwn(DEFAULTS, name)) {
      throw new InvalidOptionsError(name, `is not an append option (known: ${Object.keys(DEFAULTS).join(', ')})`);
    }
  }
  const given = options as AppendOptions;
  const schema = validateSchema(given.schema ?? DEFAULT_SCHEMA);
  const maxEventBytes = integerOption(given, 'maxEventBytes', DEFAULT_MAX_EVENT_BYTES, 4, EVENT_LIMITS.eventMaxBytes);
  const traceContext = booleanOption(given, 'traceContext', true);
  return { schema, maxEventBytes, traceContext };
}

/**
 * The active span's trace context as header members (src/tracing.ts),
 * or undefined: when turned off, without `@opentelemetry/api` (looked for
 * once, on the first append; after that a variable read) or without an active span.
 */
function traceMembers(enabled: boolean): AddedHeaders | undefined | Promise<AddedHeaders | undefined> {
  if (!enabled) return undefined;
  const api = loadedOtel();
  if (api === null) return undefined;
  if (api === undefined) return loadOtel().then((loaded) => (loaded ? activeTraceMembers(loaded) : undefined));
  return activeTraceMembers(api);
}

/**
 * Inserts checked rows in one statement; returns their seqs in row order.
 * The seam the CLI writes through (its rows keep the user's JSON text).
 */
export async function insertRows(db: Queryable, schema: string, rows: readonly EventRow[]): Promise<bigint[]> {
  if (rows.length === 0) return [];
  if (rows.length === 1) {
    const [row] = rows as [EventRow];
    const result = await db.query(statements(schema).one, [row.stream, row.kind, row.key, row.payload, row.headers]);
    return [BigInt((result.rows[0] as { seq: string | number }).seq)];
  }
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
  const { schema, maxEventBytes, traceContext } = resolveAppendOptions(options);
  const pending = traceMembers(traceContext);
  const trace = pending instanceof Promise ? await pending : pending;
  const row = eventFromValue(event, 0, maxEventBytes, trace);
  const [seq] = await insertRows(db, schema, [row]);
  return seq!;
}

/**
 * Appends several events in one statement and returns their seqs in input
 * order. Every event is checked before anything is sent: one bad event
 * means nothing is written.
 */
export async function appendMany(db: Queryable, events: readonly NewEvent[], options: AppendOptions = {}): Promise<bigint[]> {
  const { schema, maxEventBytes, traceContext } = resolveAppendOptions(options);
  if (!Array.isArray(events)) throw new InvalidOptionsError('events', 'expected an array of events');
  const pending = traceMembers(traceContext);
  const trace = pending instanceof Promise ? await pending : pending;
  const rows = events.map((event, index) => eventFromValue(event, index, maxEventBytes, trace));
  return insertRows(db, schema, rows);
}
