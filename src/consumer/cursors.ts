/**
 * Cursor administration: list the durable cursors, set one (a new consumer
 * starting from now, a replay from the start of what is kept), delete one.
 *
 * A cursor is not moved under a consumer that holds it: every tailer
 * (TypeScript, the SQL contract, the relay) holds the cursor's advisory
 * lock (`cursor_lock_key`) while it pages, so `setCursor` and
 * `deleteCursor` take that lock for their own transaction first, and refuse,
 * naming the session that holds it, when they cannot. A consumer waiting
 * to retry after a failure (a lost connection, a broker down) has let the
 * lock go; a cursor moved then is where it goes on from, as after a restart
 * (nothing is skipped but what the move skips, and a page is never half
 * applied: its commit checks the cursor it read). Nor is a cursor set
 * below the stream's retention floor (events there were pruned: a consumer
 * would skip them) or above `safe_seq` (events up to it may still be in
 * flight: a consumer would skip those that commit later).
 */
import { CursorContentionError, InvalidOptionsError } from '../errors.js';
import { quoteIdent, type Queryable } from '../db/queryable.js';
import { nameOption, poolOption } from '../options.js';
import type pg from 'pg';

/** One durable cursor, with how far behind it is. */
export interface CursorInfo {
  consumer: string;
  stream: string;
  /** The last seq the consumer committed. */
  seq: bigint;
  /** Published events of the stream above the cursor, counted up to 1,000,000. */
  lagEvents: bigint;
  /** Age of the oldest of them (now minus its `occurred_at`), in seconds; 0 when none. */
  lagSeconds: number;
  /** When the cursor last moved (its last commit). */
  updatedAt: Date;
  /** The session paging it now, if any (a consumer's own cursor). */
  heldBy: CursorHolder | null;
  /** A partition cursor of a consumer group (`tailGroup`, `tail --partitions`); null for a consumer's own cursor. */
  group: PartitionCursor | null;
}

/** Which partition of its group a cursor is, and the member that holds it. */
export interface PartitionCursor {
  partition: number;
  /** The group's partition count. */
  partitions: number;
  /** The member holding the partition (null: free to take). */
  holder: string | null;
  /** Whether the holder's lease is live; a holder whose lease ended is replaced at the next beat of a live member. */
  holderLive: boolean;
  /** How many times it changed hands. */
  moves: bigint;
}

/** A session holding a cursor's lock. */
export interface CursorHolder {
  pid: number;
  applicationName: string | null;
  clientAddr: string | null;
  /** When its current transaction began (null when idle between pages). */
  xactStart: Date | null;
}

/** Where `setCursor` moves a cursor: a seq, `now` (safe_seq: skip everything published), or `start` (the retention floor: replay what is kept). */
export type CursorTarget = bigint | 'now' | 'start';

/** What `setCursor` did. */
export interface CursorSetResult {
  consumer: string;
  stream: string;
  /** The cursor before, or null when it did not exist (it was created). */
  from: bigint | null;
  to: bigint;
  /** The stream's retention floor and safe_seq when it was set. */
  floor: bigint;
  safeSeq: bigint;
}

/** Options of the cursor functions. */
export interface CursorAdminOptions {
  /** The tidemark schema; default `tidemark`. */
  schema?: string;
  /** Only create a missing cursor; an existing one is left where it is (`from` then equals `to`). */
  onlyIfNew?: boolean;
  /** With `onlyIfNew`: check the target as it would be applied, and write nothing. */
  check?: boolean;
}

function schemaOf(options: CursorAdminOptions): string {
  return options.schema ?? 'tidemark';
}

/**
 * Advisory locks other sessions hold in this database, one row per key
 * (the key's high and low halves are classid and objid, as for any bigint
 * key), with the lowest pid holding it.
 */
const HELD_KEYS = `SELECT (l.classid::bigint << 32) | l.objid::bigint AS key, min(l.pid) AS pid
   FROM pg_catalog.pg_locks l
  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid IS NOT NULL AND l.pid <> pg_catalog.pg_backend_pid()
    AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
  GROUP BY 1`;

/** The session holding the lock of cursor ($1, $2), if any. */
const HOLDER_SQL = (s: string) => `WITH held AS (${HELD_KEYS})
 SELECT h.pid, a.application_name, host(a.client_addr) AS client_addr, a.xact_start
   FROM held h LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
  WHERE h.key = ${s}.cursor_lock_key($1, $2)`;

interface HolderRow {
  pid: number;
  application_name: string | null;
  client_addr: string | null;
  xact_start: Date | null;
}

function holder(row: HolderRow | undefined): CursorHolder | null {
  if (!row) return null;
  return { pid: row.pid, applicationName: row.application_name, clientAddr: row.client_addr, xactStart: row.xact_start };
}

/**
 * Every cursor of the schema with its lag and holder, in (consumer, stream)
 * order: the consumers' own, and each partition's of the consumer groups
 * (in partition order).
 */
export async function listCursors(db: Queryable, options: CursorAdminOptions = {}): Promise<CursorInfo[]> {
  const s = quoteIdent(schemaOf(options));
  const r = await db.query(
    `WITH w AS (SELECT safe_seq FROM ${s}.watermark),
          held AS (${HELD_KEYS})
     SELECT c.consumer, c.stream, c.seq::text, c.updated_at,
            (SELECT count(*) FROM (SELECT 1 FROM ${s}.events e
              WHERE e.stream = c.stream AND e.seq > c.seq AND e.seq <= w.safe_seq LIMIT 1000000) p)::text AS lag,
            coalesce((SELECT extract(epoch FROM pg_catalog.clock_timestamp() - e.occurred_at)::float8 FROM ${s}.events e
              WHERE e.stream = c.stream AND e.seq > c.seq AND e.seq <= w.safe_seq ORDER BY e.seq LIMIT 1), 0) AS lag_seconds,
            h.pid, a.application_name, host(a.client_addr) AS client_addr, a.xact_start
       FROM ${s}.cursors c LEFT JOIN w ON true
       LEFT JOIN held h ON h.key = ${s}.cursor_lock_key(c.consumer, c.stream)
       LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
      ORDER BY c.consumer, c.stream`,
  );
  const own: CursorInfo[] = (r.rows as (HolderRow & { consumer: string; stream: string; seq: string; updated_at: Date; lag: string; lag_seconds: number })[]).map((row) => ({
    consumer: row.consumer,
    stream: row.stream,
    seq: BigInt(row.seq),
    lagEvents: BigInt(row.lag),
    lagSeconds: Math.max(0, row.lag_seconds),
    updatedAt: row.updated_at,
    heldBy: row.pid === null ? null : holder(row),
    group: null,
  }));
  return [...own, ...(await partitionCursors(db, s))].sort(
    (a, b) => compare(a.consumer, b.consumer) || compare(a.stream, b.stream) || (a.group?.partition ?? -1) - (b.group?.partition ?? -1),
  );
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The groups' partition cursors (group_partitions, migration 0015), with the age of each one's oldest pending event. */
async function partitionCursors(db: Queryable, s: string): Promise<CursorInfo[]> {
  // The oldest pending event of a partition, when it has one: the first of
  // the stream above its cursor whose key is the partition's.
  const r = await db.query(
    `WITH w AS (SELECT safe_seq FROM ${s}.watermark)
     SELECT g.consumer, g.stream, g.partition, g.partitions, g.holder, g.holder_live, g.seq::text, g.lag::text, g.moves::text, g.updated_at,
            CASE WHEN g.lag > 0 THEN (SELECT extract(epoch FROM pg_catalog.clock_timestamp() - e.occurred_at)::float8 FROM ${s}.events e
              WHERE e.stream = g.stream AND e.seq > g.seq AND e.seq <= w.safe_seq AND ${s}.key_partition(e.key, g.partitions) = g.partition
              ORDER BY e.seq LIMIT 1) ELSE 0 END AS lag_seconds
       FROM ${s}.group_partitions() g LEFT JOIN w ON true`,
  );
  type Row = { consumer: string; stream: string; partition: number; partitions: number; holder: string | null; holder_live: boolean; seq: string; lag: string; moves: string; updated_at: Date; lag_seconds: number };
  return (r.rows as Row[]).map((row) => ({
    consumer: row.consumer,
    stream: row.stream,
    seq: BigInt(row.seq),
    lagEvents: BigInt(row.lag),
    lagSeconds: Math.max(0, row.lag_seconds),
    updatedAt: row.updated_at,
    heldBy: null,
    group: { partition: row.partition, partitions: row.partitions, holder: row.holder, holderLive: row.holder_live, moves: BigInt(row.moves) },
  }));
}

/** Runs `work` in a transaction of its own on a pooled connection, holding the cursor's lock; refuses when a consumer holds it. */
async function withCursorLock<T>(pool: pg.Pool, schema: string, consumer: string, stream: string, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  poolOption(pool);
  nameOption(consumer, 'consumer');
  nameOption(stream, 'stream');
  const s = quoteIdent(schema);
  const client = await pool.connect();
  try {
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    try {
      const free = (await client.query<{ ok: boolean }>(`SELECT pg_catalog.pg_try_advisory_xact_lock(${s}.cursor_lock_key($1, $2)) AS ok`, [consumer, stream])).rows[0]!.ok;
      if (!free) {
        const who = holder((await client.query<HolderRow>(HOLDER_SQL(s), [consumer, stream])).rows[0]);
        throw new CursorContentionError(consumer, stream, { heldBy: heldByText(who) });
      }
      const result = await work(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
  } finally {
    client.release();
  }
}

function heldByText(who: CursorHolder | null): string {
  if (!who) return 'a session that has just let go of it; try again';
  const parts = [`pid ${who.pid}`];
  if (who.applicationName) parts.push(`application ${JSON.stringify(who.applicationName)}`);
  if (who.clientAddr) parts.push(`from ${who.clientAddr}`);
  return `held by ${parts.join(', ')}: stop that consumer first`;
}

/**
 * Moves the cursor of (consumer, stream) to `to`, creating it when the
 * consumer is new. Refuses (CursorContentionError) while a consumer holds
 * it, and (InvalidOptionsError, option `to`) a seq below the stream's
 * retention floor or above safe_seq. Nothing is written when it refuses.
 */
export async function setCursor(pool: pg.Pool, consumer: string, stream: string, to: CursorTarget, options: CursorAdminOptions = {}): Promise<CursorSetResult> {
  if (!(typeof to === 'bigint' && to >= 0n) && to !== 'now' && to !== 'start') {
    throw new InvalidOptionsError('to', `expected a seq (a non-negative integer), 'now' or 'start', got ${String(to)}`);
  }
  poolOption(pool);
  const schema = schemaOf(options);
  const s = quoteIdent(schema);
  const read = async (client: pg.ClientBase, lockRow: boolean) => {
    const at = (await client.query<{ safe_seq: string; floor: string; seq: string | null }>(
      `SELECT w.safe_seq::text, coalesce(h.pruned_through_seq, 0)::text AS floor,
              (SELECT c.seq::text FROM ${s}.cursors c WHERE c.consumer = $1 AND c.stream = $2${lockRow ? ' FOR NO KEY UPDATE' : ''}) AS seq
         FROM ${s}.watermark w LEFT JOIN ${s}.horizons h ON h.stream = $2`,
      [consumer, stream],
    )).rows[0];
    if (!at) throw new Error(`the watermark row of schema ${JSON.stringify(schema)} is missing; was the schema migrated (tidemark migrate)?`);
    return { safeSeq: BigInt(at.safe_seq), floor: BigInt(at.floor), from: at.seq === null ? null : BigInt(at.seq) };
  };
  const target = (at: { safeSeq: bigint; floor: bigint; from: bigint | null }): bigint => {
    // `now` skips to the present, never back: a bootstrap may have left a
    // cursor above the published safe_seq.
    const seq = to === 'now' ? (at.from !== null && at.from > at.safeSeq ? at.from : at.safeSeq) : to === 'start' ? at.floor : to;
    if (seq < at.floor) {
      throw new InvalidOptionsError('to', `seq ${seq} is below the retention floor of stream ${JSON.stringify(stream)}: events through seq ${at.floor} were pruned, so a consumer would skip them; set it to ${at.floor} ('start') or later`);
    }
    if (seq > at.safeSeq && !(to === 'now' && seq === at.from)) {
      throw new InvalidOptionsError('to', `seq ${seq} is above safe_seq ${at.safeSeq}: events up to it may still be in flight, and a consumer would skip those that commit later; set it to ${at.safeSeq} ('now') or lower`);
    }
    return seq;
  };
  if (options.onlyIfNew) {
    // A cursor that exists is left alone, whoever holds it, so no lock is
    // needed: the insert creates it only where there is none. A consumer
    // creating it at the same moment either finds this row (its start) or
    // has its own (then this changes nothing); in REPEATABLE READ a row it
    // cannot see fails its page with a serialization failure, retried.
    const client = await pool.connect();
    try {
      const at = await read(client, false);
      if (at.from !== null) return { consumer, stream, from: at.from, to: at.from, floor: at.floor, safeSeq: at.safeSeq };
      const seq = target(at);
      if (options.check) return { consumer, stream, from: null, to: seq, floor: at.floor, safeSeq: at.safeSeq };
      const made = await client.query<{ seq: string }>(
        `INSERT INTO ${s}.cursors (consumer, stream, seq) VALUES ($1, $2, $3) ON CONFLICT (consumer, stream) DO NOTHING RETURNING seq::text`,
        [consumer, stream, seq.toString()],
      );
      if (made.rows.length > 0) return { consumer, stream, from: null, to: seq, floor: at.floor, safeSeq: at.safeSeq };
      const now = await read(client, false);
      return { consumer, stream, from: now.from, to: now.from ?? seq, floor: now.floor, safeSeq: now.safeSeq };
    } finally {
      client.release();
    }
  }
  return withCursorLock(pool, schema, consumer, stream, async (client) => {
    const at = await read(client, true);
    const seq = target(at);
    // Dead letters above the new position are events it delivers again: a
    // replay of one would apply it twice.
    await client.query(
      `WITH again AS (DELETE FROM ${s}.dead_letters d WHERE d.consumer = $1 AND d.stream = $2 AND d.seq > $3)
       INSERT INTO ${s}.cursors (consumer, stream, seq) VALUES ($1, $2, $3)
       ON CONFLICT (consumer, stream) DO UPDATE SET seq = EXCLUDED.seq, updated_at = pg_catalog.now()`,
      [consumer, stream, seq.toString()],
    );
    return { consumer, stream, from: at.from, to: seq, floor: at.floor, safeSeq: at.safeSeq };
  });
}

/** Deletes the cursor of (consumer, stream); refuses (CursorContentionError) while a consumer holds it. Resolves with the seq it was at, or null when there was none. */
export async function deleteCursor(pool: pg.Pool, consumer: string, stream: string, options: CursorAdminOptions = {}): Promise<bigint | null> {
  const schema = schemaOf(options);
  const s = quoteIdent(schema);
  return withCursorLock(pool, schema, consumer, stream, async (client) => {
    // The consumer starts again: its dead letters are events it delivers again.
    const r = await client.query<{ seq: string }>(
      // Only a consumer's own: a group's dead letters have a partition, and its name no cursor.
      `WITH again AS (DELETE FROM ${s}.dead_letters d WHERE d.consumer = $1 AND d.stream = $2 AND d.partition IS NULL)
       DELETE FROM ${s}.cursors WHERE consumer = $1 AND stream = $2 RETURNING seq::text`,
      [consumer, stream],
    );
    return r.rows[0] ? BigInt(r.rows[0].seq) : null;
  });
}
