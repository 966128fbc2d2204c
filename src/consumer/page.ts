import { ConnectionLostError, HandlerError, ResyncRequiredError } from '../errors.js';
import { quoteIdent } from '../db/queryable.js';
import { transaction, type CursorHold } from './cursor-hold.js';
import type { Handler, StreamEvent } from './events.js';

/** The cursor statements of one schema, shared by pages and bootstrap. */
export interface PageSql {
  begin: (lockTimeoutMs: number) => string;
  read: string;
  head: string;
  prefetch: string;
  advance: string;
  resync: string;
  ensureCursor: string;
}

/**
 * Builds the page statements. `read` is the heart of delivery: in one
 * statement, so in one snapshot, it locks the cursor row, reads the stream's
 * horizon and safe_seq, and pages `cursor < seq <= safe_seq` in seq order.
 * It returns no row when the cursor row does not exist, one row with NULL
 * event columns for an empty page, and otherwise one row per event. It reads
 * no event when the horizon is above the cursor (the caller raises a resync).
 */
export function pageSql(schema: string): PageSql {
  const s = quoteIdent(schema);
  return {
    // Literal: validated integer. SET LOCAL bounds the cursor row lock wait.
    begin: (lockTimeoutMs) => `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout = ${Math.trunc(lockTimeoutMs)}`,
    read: `WITH cur AS (
  SELECT c.seq FROM ${s}.cursors c WHERE c.consumer = $1 AND c.stream = $2 FOR NO KEY UPDATE
), hdr AS (
  SELECT cur.seq AS cursor_seq, w.safe_seq, coalesce(h.pruned_through_seq, 0) AS pruned_through
    FROM cur CROSS JOIN ${s}.watermark w LEFT JOIN ${s}.horizons h ON h.stream = $2
)
SELECT hdr.cursor_seq, hdr.safe_seq, hdr.pruned_through,
       e.seq, e.kind, e.key, e.payload, e.headers, e.occurred_at
  FROM hdr LEFT JOIN LATERAL (
    SELECT ev.seq, ev.kind, ev.key, ev.payload, ev.headers, ev.occurred_at
      FROM ${s}.events ev
     WHERE ev.stream = $2 AND ev.seq > hdr.cursor_seq AND ev.seq <= hdr.safe_seq
       AND hdr.pruned_through <= hdr.cursor_seq
     ORDER BY ev.seq
     LIMIT $3
  ) e ON true
 ORDER BY e.seq`,
    // The page's header alone (cursor locked, safe_seq, horizon), for a page
    // whose events were read ahead by \`prefetch\`.
    head: `WITH cur AS (
  SELECT c.seq FROM ${s}.cursors c WHERE c.consumer = $1 AND c.stream = $2 FOR NO KEY UPDATE
)
SELECT cur.seq AS cursor_seq, w.safe_seq, coalesce(h.pruned_through_seq, 0) AS pruned_through
  FROM cur CROSS JOIN ${s}.watermark w LEFT JOIN ${s}.horizons h ON h.stream = $2`,
    // The next page's events, read ahead on another connection: one
    // statement, so safe_seq and the events come from one snapshot, as in
    // \`read\`. No lock and no horizon: the page that uses them checks both.
    prefetch: `SELECT ev.seq, ev.kind, ev.key, ev.payload, ev.headers, ev.occurred_at
  FROM ${s}.events ev
 WHERE ev.stream = $1 AND ev.seq > $2 AND ev.seq <= (SELECT w.safe_seq FROM ${s}.watermark w)
 ORDER BY ev.seq
 LIMIT $3`,
    advance: `UPDATE ${s}.cursors SET seq = $3, updated_at = now() WHERE consumer = $1 AND stream = $2`,
    resync: `UPDATE ${s}.cursors SET resync_count = resync_count + 1, last_resync_at = now() WHERE consumer = $1 AND stream = $2`,
    ensureCursor: `INSERT INTO ${s}.cursors (consumer, stream) VALUES ($1, $2) ON CONFLICT (consumer, stream) DO NOTHING`,
  };
}

interface HeadRow {
  cursor_seq: string;
  safe_seq: string;
  pruned_through: string;
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
  payload: StreamEvent['payload'];
  headers: StreamEvent['headers'];
  occurred_at: Date;
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

interface PageRow {
  cursor_seq: string;
  safe_seq: string;
  pruned_through: string;
  seq: string | null;
  kind: string;
  key: string;
  payload: StreamEvent['payload'];
  headers: StreamEvent['headers'];
  occurred_at: Date;
}

/** What one page did. */
export interface PageResult {
  /** False when the cursor row did not exist; the caller creates it and pages again. */
  found: boolean;
  delivered: number;
  cursor: bigint;
  safeSeq: bigint;
  /** The page had `limit` events: page again at once. */
  full: boolean;
  /** The next page's events, being read ahead (only after a full page, with `readAhead.next`). */
  prefetch?: Prefetch;
}

/**
 * One page in one REPEATABLE READ transaction on the hold's connection:
 * read, run the handler on each event, advance the cursor, commit.
 *
 * - Horizon above the cursor: the resync is counted in a committed
 *   transaction, then `ResyncRequiredError`.
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
  beforeCommit?: (page: { consumer: string; stream: string; delivered: number; cursor: bigint }) => unknown,
  readAhead?: PageReadAhead,
): Promise<PageResult> {
  const { consumer, stream } = hold;
  const statement = async <T>(run: () => Promise<T>): Promise<T> => {
    try {
      return await run();
    } catch (err) {
      const failure = hold.contention(err);
      await hold.rollback();
      throw failure;
    }
  };

  const ahead = readAhead?.use ? await within(readAhead.use.rows, readAhead.waitMs) : undefined;
  await statement(() => hold.query(sql.begin(lockTimeoutMs)));
  // The page's header and its events: from \`read\` (each row carries the
  // header), or \`head\` and the events read ahead.
  let head: HeadRow | undefined;
  let rows: readonly (EventRow | PageRow)[] = [];
  if (ahead && ahead.length === limit) {
    // Events read ahead are this page's events when the cursor is still
    // where the read started: below safe_seq events are final, so the first
    // \`limit\` of them above the cursor are the same in every snapshot that
    // sees them (PROTOCOL §6.2). A horizon above the cursor (events pruned
    // since) raises the resync below, as for a page read here.
    head = (await statement(() => hold.query<HeadRow>(sql.head, [consumer, stream]))).rows[0];
    if (head && BigInt(head.cursor_seq) === readAhead!.use!.after) rows = ahead;
    else head = undefined;
  }
  if (!head) {
    const read = (await statement(() => hold.query<PageRow>(sql.read, [consumer, stream, limit]))).rows;
    head = read[0];
    rows = read[0]?.seq === null ? [] : read;
  }
  if (!head) {
    await statement(() => hold.query('ROLLBACK'));
    return { found: false, delivered: 0, cursor: 0n, safeSeq: 0n, full: false };
  }
  const cursor = BigInt(head.cursor_seq);
  const safeSeq = BigInt(head.safe_seq);
  const prunedThrough = BigInt(head.pruned_through);
  if (prunedThrough > cursor) {
    await statement(() => hold.query(sql.resync, [consumer, stream]));
    await statement(() => hold.query('COMMIT'));
    throw new ResyncRequiredError(consumer, stream, cursor, prunedThrough);
  }

  let live = true;
  const tx = transaction(hold, () => live, 'the page transaction');
  const context = { consumer, stream, signal };
  let handled = cursor;
  let delivered = 0;
  try {
    for (const row of rows) {
      if (row.seq === null || signal.aborted) break;
      const event: StreamEvent = {
        seq: BigInt(row.seq),
        stream,
        kind: row.kind,
        key: row.key,
        payload: row.payload,
        headers: row.headers,
        occurredAt: row.occurred_at,
      };
      try {
        await handler(event, tx, context);
      } catch (err) {
        await hold.rollback();
        if (signal.aborted && err === signal.reason) throw err;
        // The page's connection died under the handler (its ROLLBACK failed
        // too): a retryable loss, whatever error the handler surfaced.
        if (hold.isBroken) throw new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err);
        throw new HandlerError(consumer, stream, event.seq, err);
      }
      handled = event.seq;
      delivered += 1;
    }
  } finally {
    live = false; // a handle kept by a handler can no longer reach this connection
  }

  const full = rows.length >= limit;
  // Read the next page while this one's beforeCommit and COMMIT run.
  const prefetch = full && handled === BigInt(rows[rows.length - 1]!.seq!) ? readAhead?.next?.(handled) : undefined;
  if (handled > cursor && beforeCommit) {
    try {
      await beforeCommit({ consumer, stream, delivered, cursor: handled });
    } catch (err) {
      if (err instanceof CommitThrough && err.seq > cursor && err.seq < handled && !hold.isBroken) {
        // The page's effects outside the database took hold up to err.seq:
        // commit that prefix, then fail on the rest (PROTOCOL §9).
        await statement(() => hold.query(sql.advance, [consumer, stream, err.seq.toString()]));
        await statement(() => hold.query('COMMIT'));
        throw new HandlerError(consumer, stream, err.failedSeq, err.cause);
      }
      await hold.rollback();
      if (hold.isBroken) throw new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err);
      throw new HandlerError(consumer, stream, handled, err instanceof CommitThrough ? err.cause : err);
    }
  }
  if (handled > cursor) await statement(() => hold.query(sql.advance, [consumer, stream, handled.toString()]));
  await statement(() => hold.query('COMMIT'));
  if (signal.aborted) throw signal.reason;
  return { found: true, delivered, cursor: handled, safeSeq, full, prefetch };
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
