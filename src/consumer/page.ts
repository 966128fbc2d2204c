import type pg from 'pg';
import { ConnectionLostError, HandlerError, ResyncRequiredError, SQLSTATE, sqlState } from '../errors.js';
import { handledBefore } from './failures.js';
import { quoteIdent, sqlText } from '../db/queryable.js';
import { EVENT_TYPES } from '../db/types.js';
import { transaction, type CursorHold } from './cursor-hold.js';
import type { Handler } from './events.js';
import { streamEventFor } from './exact-json.js';

/** The cursor statements of one schema, shared by pages and bootstrap. */
export interface PageSql {
  /** BEGIN of a page's REPEATABLE READ transaction, its lock waits bounded (a literal: a validated integer). */
  begin: (lockTimeoutMs: number) => string;
  /**
   * A page's first message: BEGIN, the lock wait bound, `read_page` and
   * `page_info` (four results). Simple protocol, so the names travel in
   * the text (`sqlText`).
   */
  open: (consumer: string, stream: string, limit: number, lockTimeoutMs: number) => string;
  /** A page's first message when `events` events were read ahead from `after` up to `through`: BEGIN, the bound, `lock_page` (three results). */
  openAhead: (consumer: string, stream: string, after: bigint, through: bigint, events: number, lockTimeoutMs: number) => string;
  /** `read_page` and `page_info` in a page already open (two results). */
  read: (consumer: string, stream: string, limit: number) => string;
  /** A page's last message: the cursor advance (when `seq` is given) and COMMIT. */
  commit: (consumer: string, stream: string, seq: bigint | undefined) => string;
  /** After TM002 and a ROLLBACK: counts the resync, returns the cursor and the horizon. */
  noteResync: string;
  prefetch: string;
  advance: string;
  ensureCursor: string;
  /** In a page that returned the event: records it as a dead letter ($1 consumer, $2 stream, $3 seq, $4 tries, $5 error); returns its id. */
  recordDeadLetter: string;
  /** The first dead letter of ($1 consumer, $2 stream) asked to be replayed, locked; its event columns as a page reads them, with id and attempts. */
  nextReplay: string;
  /** One row when a dead letter of ($1 consumer, $2 stream) is asked to be replayed. */
  anyReplay: string;
  /** A replayed dead letter ($1 id), delivered: gone, in the handler's transaction. */
  replayed: string;
  /** A replay that failed ($1 id, $2 error): dead again, one try more, the request cleared. */
  replayFailed: string;
}

/**
 * An event's columns as a page reads them: payload and headers as
 * PostgreSQL's own text, which the handler gets byte for byte, and parsed
 * from it without changing a number, never re-serialised (exact-json.ts).
 * A query of them is parsed with EVENT_TYPES (src/db/types.ts).
 */
export const EVENT_COLUMNS = (t: string) =>
  `${t}.seq, ${t}.kind, ${t}.key, ${t}.payload::pg_catalog.text AS payload, ${t}.headers::pg_catalog.text AS headers, ${t}.occurred_at`;

/**
 * Builds the page statements. The page itself is the SQL consumer contract
 * (migration 0006): `read_page` locks the cursor, checks the horizon and
 * reads below safe_seq in the transaction's REPEATABLE READ snapshot;
 * `advance_cursor` moves the cursor within what the page returned. The
 * TypeScript client runs exactly what a client in any language runs, in two
 * messages per page.
 */
export function pageSql(schema: string): PageSql {
  const s = quoteIdent(schema);
  // Literal: validated integer. SET LOCAL bounds the cursor row lock wait.
  const begin = (lockTimeoutMs: number) => `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout = ${Math.trunc(lockTimeoutMs)}`;
  const read = (consumer: string, stream: string, limit: number) => {
    const names = `${sqlText(consumer)}, ${sqlText(stream)}`;
    return `SELECT ${EVENT_COLUMNS('p')} FROM ${s}.read_page(${names}, ${Math.trunc(limit)}) p; SELECT * FROM ${s}.page_info(${names})`;
  };
  return {
    begin,
    open: (consumer, stream, limit, lockTimeoutMs) => `${begin(lockTimeoutMs)}; ${read(consumer, stream, limit)}`,
    openAhead: (consumer, stream, after, through, events, lockTimeoutMs) =>
      `${begin(lockTimeoutMs)}; SELECT * FROM ${s}.lock_page(${sqlText(consumer)}, ${sqlText(stream)}, ${after.toString()}, ${through.toString()}, ${Math.trunc(events)})`,
    read,
    commit: (consumer, stream, seq) =>
      seq === undefined ? 'COMMIT' : `SELECT ${s}.advance_cursor(${sqlText(consumer)}, ${sqlText(stream)}, ${seq.toString()}); COMMIT`,
    noteResync: `SELECT cursor::text, pruned_through::text FROM ${s}.note_resync($1, $2)`,
    // The next page's events, read ahead on another connection: one
    // statement, so safe_seq and the events come from one snapshot, as in
    // read_page. No lock and no horizon: the page that uses them checks both.
    prefetch: `SELECT ${EVENT_COLUMNS('ev')}
  FROM ${s}.events ev
 WHERE ev.stream = $1 AND ev.seq > $2 AND ev.seq <= (SELECT w.safe_seq FROM ${s}.watermark w)
 ORDER BY ev.seq
 LIMIT $3`,
    // Bootstrap's hand-over: the cursor to the snapshot's safe_seq. The
    // rebuilt projection holds every event up to it, dead letters' too: a
    // replay of one of them would apply it twice, so they go.
    advance: `WITH rebuilt AS (DELETE FROM ${s}.dead_letters d WHERE d.consumer = $1 AND d.stream = $2 AND d.seq <= $3)
UPDATE ${s}.cursors SET seq = $3, updated_at = pg_catalog.now() WHERE consumer = $1 AND stream = $2`,
    ensureCursor: `INSERT INTO ${s}.cursors (consumer, stream) VALUES ($1, $2) ON CONFLICT (consumer, stream) DO NOTHING`,
    recordDeadLetter: `SELECT ${s}.record_dead_letter($1, $2, $3, $4, $5)::text AS id`,
    nextReplay: `SELECT d.id::text AS id, d.attempts, ${EVENT_COLUMNS('d')}
  FROM ${s}.dead_letters d
 WHERE d.consumer = $1 AND d.stream = $2 AND d.replay_requested_at IS NOT NULL AND d.id <> ALL($3::pg_catalog.int8[])
   AND d.seq <= (SELECT c.seq FROM ${s}.cursors c WHERE c.consumer = $1 AND c.stream = $2)
 ORDER BY d.seq
 LIMIT 1
   FOR UPDATE SKIP LOCKED`,
    anyReplay: `SELECT 1 FROM ${s}.dead_letters d WHERE d.consumer = $1 AND d.stream = $2 AND d.replay_requested_at IS NOT NULL
   AND d.seq <= (SELECT c.seq FROM ${s}.cursors c WHERE c.consumer = $1 AND c.stream = $2) LIMIT 1`,
    replayed: `DELETE FROM ${s}.dead_letters WHERE id = $1`,
    // In the replay's transaction, after ROLLBACK TO its savepoint: the row
    // stays locked from the read to this commit, so a request made meanwhile
    // waits for it and is kept.
    replayFailed: `UPDATE ${s}.dead_letters SET attempts = attempts + 1, last_error = pg_catalog.left($2, 8192), dead_at = pg_catalog.now(), replay_requested_at = NULL WHERE id = $1`,
  };
}

/** The open page's position, as `page_info` and `lock_page` return it. */
interface PageInfoRow {
  cursor: string;
  safe_seq: string;
}

/**
 * Thrown by a `beforeCommit` whose page's effects outside the database took
 * hold only for a prefix (the relay: the broker acknowledged the events up
 * to `seq`, then refused `failedSeq`): the page commits its cursor at `seq`,
 * then fails with `HandlerError(failedSeq, cause)`. Internal to tidemark.
 */
export class CommitThrough extends Error {
  constructor(
    readonly seq: bigint,
    readonly failedSeq: bigint,
    override readonly cause: unknown,
  ) {
    super(`commit through seq ${seq}, then fail`);
  }
}

/** An event row as `prefetch` returns it. */
export interface EventRow {
  seq: string;
  kind: string;
  key: string;
  /** `payload::text`. */
  payload: string;
  /** `headers::text`. */
  headers: string;
  occurred_at: Date;
}

/** The event `handler` receives for a row of `stream` (read_page's, a read ahead, a dead letter's). */
export function eventOf(row: EventRow, stream: string, handler: Handler) {
  return streamEventFor(handler, {
    seq: BigInt(row.seq),
    stream,
    kind: row.kind,
    key: row.key,
    payloadText: row.payload,
    headersText: row.headers,
    occurredAt: row.occurred_at,
  });
}

/**
 * The next page's events, being read ahead from `after` on another
 * connection. `rows` resolves to the events read, or to undefined when the
 * read failed; it never rejects. The page uses them only when they are a
 * full page (fewer means the read saw an older safe_seq than the page may).
 */
export interface Prefetch {
  after: bigint;
  rows: Promise<EventRow[] | undefined>;
}

/** Read-ahead for {@link runPage}: events read ahead for this page, and how to start the next page's read. */
export interface PageReadAhead {
  /** Events read ahead for this page; used only when the locked cursor is still at `after` and nothing above it was pruned. */
  use?: Prefetch;
  /** How long the page waits for `use` before reading as usual. */
  waitMs: number;
  /** Starts reading the next page from `after` (or declines: no free connection); called once a full page's handlers ran, before `beforeCommit`. */
  next?: (after: bigint) => Prefetch | undefined;
}

/** What one page did. */
export interface PageResult {
  delivered: number;
  cursor: bigint;
  safeSeq: bigint;
  /** The page had `limit` events: page again at once. */
  full: boolean;
  /** The next page's events, being read ahead (only after a full page, with `readAhead.next`). */
  prefetch?: Prefetch;
}

/**
 * One page in one REPEATABLE READ transaction on the hold's connection, in
 * two messages: `BEGIN; read_page; page_info`, the handler on each event,
 * then `advance_cursor; COMMIT`.
 *
 * - Horizon above the cursor (TM002): the page rolls back, the resync is
 *   counted in its own transaction (`note_resync`), then
 *   `ResyncRequiredError`. Undefined when the cursor is no longer behind the
 *   horizon by then (a bootstrap moved it): the caller pages again.
 * - Handler error: the page rolls back, then `HandlerError` with the
 *   handler's error as `cause` (or the abort reason itself, when the handler
 *   threw exactly that; or `ConnectionLostError`, when the connection died).
 * - Abort between events: the handled prefix commits with the cursor at its
 *   last event, then the abort reason is thrown.
 */
export async function runPage(
  hold: CursorHold,
  sql: PageSql,
  limit: number,
  lockTimeoutMs: number,
  handler: Handler,
  signal: AbortSignal,
  beforeCommit?: (page: { consumer: string; stream: string; delivered: number; cursor: bigint; partition?: number }) => unknown,
  readAhead?: PageReadAhead,
): Promise<PageResult | undefined> {
  const { consumer, stream } = hold;
  const statement = async <T>(run: () => Promise<T>): Promise<T> => {
    try {
      return await run();
    } catch (err) {
      const failure = sqlState(err) === SQLSTATE.resyncRequired ? err : hold.contention(err);
      await hold.rollback();
      throw failure;
    }
  };
  const results = async (text: string) => (await hold.query(text, undefined, EVENT_TYPES)) as unknown as pg.QueryResult[];

  const ahead = readAhead?.use ? await within(readAhead.use.rows, readAhead.waitMs) : undefined;
  let info: PageInfoRow | undefined;
  let rows: readonly EventRow[] = [];
  try {
    if (ahead && ahead.length === limit) {
      // Events read ahead are this page's events when the cursor is still
      // where the read started: below safe_seq events are final, so the
      // first `limit` of them above the cursor are the same in every
      // snapshot that sees them (PROTOCOL §6.2). lock_page checks the
      // horizon as read_page does, and that the rows read ahead are all of
      // the stream's events in their range.
      const after = readAhead!.use!.after;
      const opened = await statement(() => results(sql.openAhead(consumer, stream, after, BigInt(ahead.at(-1)!.seq), ahead.length, lockTimeoutMs)));
      info = opened[2]!.rows[0] as PageInfoRow;
      if (BigInt(info.cursor) === after) rows = ahead;
      else {
        const read = await statement(() => results(sql.read(consumer, stream, limit)));
        rows = read[0]!.rows as EventRow[];
        info = read[1]!.rows[0] as PageInfoRow;
      }
    } else {
      const opened = await statement(() => results(sql.open(consumer, stream, limit, lockTimeoutMs)));
      rows = opened[2]!.rows as EventRow[];
      info = opened[3]!.rows[0] as PageInfoRow;
    }
  } catch (err) {
    if (sqlState(err) !== SQLSTATE.resyncRequired) throw err;
    // Nothing was delivered; the page rolled back. Count the resync in its
    // own transaction, with the cursor and horizon it found.
    let noted: { cursor: string; pruned_through: string } | undefined;
    try {
      noted = (await hold.query<{ cursor: string; pruned_through: string }>(sql.noteResync, [consumer, stream])).rows[0];
    } catch (noteErr) {
      throw hold.translate(noteErr);
    }
    if (!noted) return undefined;
    throw new ResyncRequiredError(consumer, stream, BigInt(noted.cursor), BigInt(noted.pruned_through));
  }
  const cursor = BigInt(info.cursor);
  const safeSeq = BigInt(info.safe_seq);

  let live = true;
  const tx = transaction(hold, () => live, 'the page transaction');
  const context = hold.partition === undefined ? { consumer, stream, signal } : { consumer, stream, signal, partition: hold.partition };
  let handled = cursor;
  let delivered = 0;
  try {
    for (const row of rows) {
      if (signal.aborted) break;
      const event = eventOf(row, stream, handler);
      try {
        await handler(event, tx, context);
      } catch (err) {
        await hold.rollback();
        if (signal.aborted && err === signal.reason) throw err;
        // The page's connection died under the handler (its ROLLBACK failed
        // too): a retryable loss, whatever error the handler surfaced.
        if (hold.isBroken) throw new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err);
        const failure = new HandlerError(consumer, stream, event.seq, err, event.key);
        handledBefore.set(failure, delivered);
        throw failure;
      }
      handled = event.seq;
      delivered += 1;
    }
  } finally {
    live = false; // a handle kept by a handler can no longer reach this connection
  }

  const full = rows.length >= limit;
  // Read the next page while this one's beforeCommit and COMMIT run.
  const prefetch = full && handled === BigInt(rows[rows.length - 1]!.seq) ? readAhead?.next?.(handled) : undefined;
  if (handled > cursor && beforeCommit) {
    try {
      await beforeCommit(hold.partition === undefined ? { consumer, stream, delivered, cursor: handled } : { consumer, stream, delivered, cursor: handled, partition: hold.partition });
    } catch (err) {
      if (err instanceof CommitThrough && err.seq > cursor && err.seq < handled && !hold.isBroken) {
        // The page's effects outside the database took hold up to err.seq:
        // commit that prefix, then fail on the rest (PROTOCOL §9).
        await statement(() => hold.query(sql.commit(consumer, stream, err.seq)));
        throw new HandlerError(consumer, stream, err.failedSeq, err.cause);
      }
      await hold.rollback();
      if (hold.isBroken) throw new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err);
      throw new HandlerError(consumer, stream, handled, err instanceof CommitThrough ? err.cause : err);
    }
  }
  await statement(() => hold.query(sql.commit(consumer, stream, handled > cursor ? handled : undefined)));
  if (signal.aborted) throw signal.reason;
  return { delivered, cursor: handled, safeSeq, full, prefetch };
}

/** `promise`'s value, or undefined when it takes longer than `ms`. */
async function within<T>(promise: Promise<T | undefined>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}
