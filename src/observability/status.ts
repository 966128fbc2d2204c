import type { Queryable } from '../db/queryable.js';
import { quoteIdent } from '../db/queryable.js';
import { InvalidOptionsError, SQLSTATE, sqlState } from '../errors.js';
import { checkKnownOptions } from '../options.js';

/** A snapshot of a tidemark schema's state, as `tidemark status` shows it. */
export interface TidemarkStatus {
  /** The schema read. */
  schema: string;
  /** The published tidemark. */
  safeSeq: bigint;
  /** The greatest visible seq (null for an empty table). */
  maxSeq: bigint | null;
  /** `maxSeq - safeSeq`: events committed or in flight above the tidemark. */
  lagEvents: bigint;
  /** Seconds since the watermark last advanced, while events wait above it; 0 otherwise. */
  lagSeconds: number;
  /** When safe_seq was last published. */
  watermarkUpdatedAt: Date;
  /** The watermarker lease: holder, expiry, and whether it is live by the database clock. */
  lease: { owner: string | null; expiresAt: Date | null; live: boolean };
  /**
   * The writers safe_seq waits for: the in-flight holders of the oldest
   * observation the watermarker could not publish yet, and any prepared
   * transaction holding the fence. Empty when nothing waits.
   */
  blockingWriters: BlockingWriter[];
  /**
   * False when this role may not read them (a consumer role: naming other
   * sessions' transactions is the owner's): `blockingWriters` is then empty
   * whatever waits.
   */
  blockingWritersVisible: boolean;
  /**
   * False when this role may not read streams and horizons (a writer role,
   * which may read events' seqs and the watermark only): `streams` is then
   * empty.
   */
  streamsVisible: boolean;
  /** False when this role may not read cursors (a writer role): `consumers` and `groups` are then empty. */
  consumersVisible: boolean;
  /** Per stream: events present (0 when `streamCounts` is false), greatest seq present, and the retention horizon. */
  streams: { stream: string; events: bigint; maxSeq: bigint | null; prunedThroughSeq: bigint }[];
  /** Per cursor: position, pending events below safe_seq (counted up to 1,000,000), resyncs. */
  consumers: {
    consumer: string;
    stream: string;
    seq: bigint;
    lagEvents: number;
    updatedAt: Date;
    resyncCount: number;
    lastResyncAt: Date | null;
  }[];
  /** Per partition of each consumer group: its holder (and whether the holder's lease is live), cursor, pending events below safe_seq (counted up to 1,000,000), and how often it changed hands. */
  groups: {
    consumer: string;
    stream: string;
    partition: number;
    partitions: number;
    holder: string | null;
    holderLive: boolean;
    seq: bigint;
    lagEvents: number;
    moves: number;
    updatedAt: Date;
  }[];
  /** The groups whose re-partition is pending (PROTOCOL §6.6): the count asked for, and the barrier the old split reads up to. */
  repartitions: { consumer: string; stream: string; partitions: number; nextPartitions: number; barrier: bigint }[];
}

/** A writer holding safe_seq back (see `blocking_writers()` in docs/PROTOCOL.md). */
export interface BlockingWriter {
  /** Backend pid; null for a prepared transaction. */
  pid: number | null;
  /** The writer's virtual transaction id, as pg_locks shows it. */
  virtualTransaction: string;
  applicationName: string | null;
  clientAddr: string | null;
  /** When its transaction started (or was prepared). */
  xactStart: Date | null;
  /** Seconds since then, by the database clock. */
  ageSeconds: number | null;
  /** pg_stat_activity state, or `prepared`. */
  state: string | null;
  /** Its current or last statement, cut at 200 characters (null for a prepared transaction). */
  query: string | null;
  /** The prepared transaction's name, if it is one. */
  preparedGid: string | null;
  /** The seq the watermarker waits to publish. */
  pendingSeq: bigint;
  /** Since when it waits. */
  waitingSince: Date;
}

/** Options for {@link readStatus}. */
export interface ReadStatusOptions {
  /** Count events per stream (a scan of the events table). Default true. */
  streamCounts?: boolean;
}

const big = (v: string | null): bigint | null => (v === null ? null : BigInt(v));

/**
 * The rows of a read this role may not be allowed: none, and `visible`
 * false, when it is refused for want of a privilege (42501).
 */
async function ifVisible<R>(db: Queryable, text: string, values?: unknown[]): Promise<{ rows: R[]; visible: boolean }> {
  try {
    return { rows: (await db.query(text, values)).rows as R[], visible: true };
  } catch (err) {
    if (sqlState(err) !== SQLSTATE.insufficientPrivilege) throw err;
    return { rows: [], visible: false };
  }
}

/**
 * Reads the watermark, lease, blocking writers, streams, horizons and
 * cursors (and group partitions) of `schema` (five statements; the figures are not from one
 * snapshot). Throws {@link InvalidOptionsError} for an option it does not know.
 * What the role may not read is left out and flagged (`streamsVisible`,
 * `consumersVisible`, `blockingWritersVisible`): its statement fails, so
 * pass a pool, or a connection outside a transaction, which such a failure
 * would abort.
 */
export async function readStatus(db: Queryable, schema: string, options: ReadStatusOptions = {}): Promise<TidemarkStatus> {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
  if (options.streamCounts !== undefined && typeof options.streamCounts !== 'boolean') throw new InvalidOptionsError('streamCounts', 'expected a boolean');
  checkKnownOptions(options, { streamCounts: true } satisfies Required<ReadStatusOptions>, 'readStatus');
  const s = quoteIdent(schema);
  const head = (await db.query(
    `SELECT w.safe_seq::text, (SELECT max(seq) FROM ${s}.events)::text AS max_seq, w.updated_at, w.lease_owner, w.lease_expires_at,
            coalesce(w.lease_expires_at > clock_timestamp(), false) AS live,
            extract(epoch FROM clock_timestamp() - w.updated_at)::float8 AS age
       FROM ${s}.watermark w`,
  )).rows[0] as { safe_seq: string; max_seq: string | null; updated_at: Date; lease_owner: string | null; lease_expires_at: Date | null; live: boolean; age: number };
  const safeSeq = BigInt(head.safe_seq);
  const maxSeq = big(head.max_seq);
  const lagEvents = maxSeq !== null && maxSeq > safeSeq ? maxSeq - safeSeq : 0n;
  const counts = options.streamCounts ?? true;
  // Each role reads what it may: a writer the watermark and seqs, a
  // consumer also streams and its own cursors, the owner everything.
  const streams = await ifVisible<{ stream: string; events: string; max_seq: string | null; pruned: string }>(
    db,
    counts
      ? `SELECT coalesce(e.stream, h.stream) AS stream, coalesce(e.n, 0)::text AS events, e.max_seq::text, coalesce(h.pruned_through_seq, 0)::text AS pruned
           FROM (SELECT stream, count(*) AS n, max(seq) AS max_seq FROM ${s}.events GROUP BY stream) e
           FULL JOIN ${s}.horizons h ON h.stream = e.stream ORDER BY 1`
      : `SELECT stream, '0' AS events, NULL::text AS max_seq, pruned_through_seq::text AS pruned FROM ${s}.horizons ORDER BY 1`,
  );
  const blocking = await ifVisible<{
    pid: number | null;
    virtualtransaction: string;
    application_name: string | null;
    client_addr: string | null;
    xact_start: Date | null;
    age_seconds: number | null;
    state: string | null;
    query: string | null;
    prepared_gid: string | null;
    pending_seq: string;
    waiting_since: Date;
  }>(db, `SELECT * FROM ${s}.blocking_writers()`);
  const consumers = await ifVisible<{ consumer: string; stream: string; seq: string; updated_at: Date; resync_count: number; last_resync_at: Date | null; lag: number }>(
    db,
    `SELECT c.consumer, c.stream, c.seq::text, c.updated_at, c.resync_count, c.last_resync_at,
            (SELECT count(*) FROM (SELECT 1 FROM ${s}.events e
              WHERE e.stream = c.stream AND e.seq > c.seq AND e.seq <= $1::bigint LIMIT 1000000) p)::int AS lag
       FROM ${s}.cursors c ORDER BY c.consumer, c.stream`,
    [head.safe_seq],
  );
  const groups = consumers.visible
    ? await ifVisible<{ consumer: string; stream: string; partition: number; partitions: number; holder: string | null; holder_live: boolean; seq: string; lag: string; moves: string; updated_at: Date }>(
        db,
        `SELECT consumer, stream, partition, partitions, holder, holder_live, seq::text, lag::text, moves::text, updated_at FROM ${s}.group_partitions()`,
      )
    : { rows: [], visible: false };
  const repartitions = groups.rows.length > 0
    ? await ifVisible<{ consumer: string; stream: string; partitions: number; next_partitions: number; barrier: string }>(
        db,
        `SELECT g.consumer, g.stream, g.partitions, g.next_partitions, g.barrier::text FROM ${s}.groups g WHERE g.next_partitions IS NOT NULL ORDER BY g.consumer, g.stream`,
      )
    : { rows: [], visible: false };
  return {
    schema,
    safeSeq,
    maxSeq,
    lagEvents,
    lagSeconds: lagEvents > 0n ? head.age : 0,
    watermarkUpdatedAt: head.updated_at,
    lease: { owner: head.lease_owner, expiresAt: head.lease_expires_at, live: head.live },
    blockingWriters: blocking.rows.map((b) => ({
      pid: b.pid,
      virtualTransaction: b.virtualtransaction,
      applicationName: b.application_name,
      clientAddr: b.client_addr,
      xactStart: b.xact_start,
      ageSeconds: b.age_seconds,
      state: b.state,
      query: b.query,
      preparedGid: b.prepared_gid,
      pendingSeq: BigInt(b.pending_seq),
      waitingSince: b.waiting_since,
    })),
    blockingWritersVisible: blocking.visible,
    streamsVisible: streams.visible,
    consumersVisible: consumers.visible,
    streams: streams.rows.map((r) => ({ stream: r.stream, events: BigInt(r.events), maxSeq: big(r.max_seq), prunedThroughSeq: BigInt(r.pruned) })),
    consumers: consumers.rows.map((r) => ({
      consumer: r.consumer,
      stream: r.stream,
      seq: BigInt(r.seq),
      lagEvents: r.lag,
      updatedAt: r.updated_at,
      resyncCount: r.resync_count,
      lastResyncAt: r.last_resync_at,
    })),
    groups: groups.rows.map((r) => ({
      consumer: r.consumer,
      stream: r.stream,
      partition: r.partition,
      partitions: r.partitions,
      holder: r.holder,
      holderLive: r.holder_live,
      seq: BigInt(r.seq),
      lagEvents: Number(r.lag),
      moves: Number(r.moves),
      updatedAt: r.updated_at,
    })),
    repartitions: repartitions.rows.map((r) => ({ consumer: r.consumer, stream: r.stream, partitions: r.partitions, nextPartitions: r.next_partitions, barrier: BigInt(r.barrier) })),
  };
}
