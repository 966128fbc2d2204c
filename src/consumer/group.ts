import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type pg from 'pg';
import { InvalidOptionsError } from '../errors.js';
import { acquire } from '../db/acquire.js';
import { withDeadline } from '../db/deadline.js';
import { quoteIdent, sqlText } from '../db/queryable.js';
import { booleanOption, integerOption, nameOption } from '../options.js';
import { EVENT_COLUMNS, type PageSql } from './page.js';
import type { TailOptions } from './stream-client.js';

/** Options for {@link StreamClient.tailGroup}. */
export interface GroupOptions extends TailOptions {
  /**
   * Partitions of the group, fixed when the group is created (its first
   * member's beat). A member joins with the group's count (or a pending
   * re-partition's): one with another is refused (the database's error,
   * SQLSTATE TM007). Once in, it follows the group's count if
   * `repartitionGroup` changes it. Default 16.
   */
  partitions?: number;
  /** This member's name, unique in the group. Default `<host>:<pid>:<random>`. */
  member?: string;
  /** Pages of this member's partitions that run at once (each on a pooled connection). Default 4. */
  concurrency?: number;
  /**
   * The member's lease. It beats (renews and rebalances) every third of it;
   * partitions of a member that stops beating move to the others once it
   * ends, and a page must commit before the lease it began under ends.
   * Default 10000.
   */
  leaseTtlMs?: number;
  /**
   * Create the group's partition index (`events_partition_<n>`) when it is
   * missing, so that a page of a partition is one index range scan. It
   * costs appends (README, Consumer groups). `false`: page without it
   * unless it exists. Default true.
   */
  partitionIndex?: boolean;
}

export interface ResolvedGroupOptions {
  partitions: number;
  member: string;
  concurrency: number;
  leaseTtlMs: number;
  partitionIndex: boolean;
}

export const GROUP_OPTION_NAMES = { partitions: true, member: true, concurrency: true, leaseTtlMs: true, partitionIndex: true } as const;

export function resolveGroupOptions(options: GroupOptions): ResolvedGroupOptions {
  const member = options.member ?? `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;
  nameOption(member, 'member');
  return {
    partitions: integerOption(options, 'partitions', 16, 1, 1024),
    member,
    concurrency: integerOption(options, 'concurrency', 4, 1, 256),
    leaseTtlMs: integerOption(options, 'leaseTtlMs', 10_000, 100, 3_600_000),
    partitionIndex: booleanOption(options, 'partitionIndex', true),
  };
}

/** The group's statements in SQL (migration 0015). */
export function groupSql(schema: string) {
  const s = quoteIdent(schema);
  return {
    /**
     * The partitions held after the beat, and how long until the first
     * other member's lease ends (ms; null when there is none): a member
     * beats again then, so that a dead member's partitions move once its
     * lease ends rather than up to a beat interval later (migration 0016).
     * And the group's partition count: a re-partition (migration 0017)
     * changes it under a running member, which follows. (The statement's
     * snapshot does not see a group its own beat created: that one has
     * the member's count.)
     */
    beat: `SELECT ARRAY(SELECT b.partition FROM ${s}.group_beat($1, $2, $3, $4, $5) b ORDER BY b.partition) AS partitions, ${s}.others_lease_end_ms($1, $2, $4) AS others_end_ms,
  coalesce((SELECT g.partitions FROM ${s}.groups g WHERE g.consumer = $1 AND g.stream = $2), $3) AS count`,
    leave: `SELECT ${s}.leave_group($1, $2, $3) AS released`,
    /** A FROM item: the index's statement, and whether it exists and is valid ($1 partitions). */
    indexState: `${s}.partition_index_state($1)`,
  };
}

/**
 * Creates the partition index of groups of `partitions` when it is missing
 * (CONCURRENTLY: writers go on; it waits for older transactions). Returns
 * whether it built it. Throws when the role may not, and for an invalid
 * index (a build that did not finish). Aborting `signal` cancels a build.
 */
export async function buildPartitionIndex(pool: pg.Pool, schema: string, partitions: number, signal: AbortSignal, responseTimeoutMs: number): Promise<boolean> {
  let client: pg.PoolClient | undefined;
  let pid: number | undefined;
  const cancel = () => {
    if (pid !== undefined) void pool.query('SELECT pg_catalog.pg_cancel_backend($1)', [pid]).catch(() => undefined);
  };
  signal.addEventListener('abort', cancel, { once: true });
  try {
    client = await acquire(pool, signal);
    const c = client;
    const r = await withDeadline(c, responseTimeoutMs, 'the partition index', () =>
      c.query<{ ddl: string; present: boolean; valid: boolean; pid: number }>(`SELECT s.*, pg_catalog.pg_backend_pid() AS pid FROM ${groupSql(schema).indexState} s`, [partitions]),
    );
    const state = r.rows[0]!;
    if (state.present) {
      if (!state.valid) throw new Error(`the index events_partition_${partitions} is invalid (a build that did not finish): drop it, and a member creates it again`);
      return false;
    }
    pid = state.pid;
    signal.throwIfAborted();
    await c.query(state.ddl);
    return true;
  } catch (err) {
    client?.release(true);
    client = undefined;
    throw err;
  } finally {
    signal.removeEventListener('abort', cancel);
    client?.release();
  }
}

/**
 * A page of one partition, as a member runs it: the same two messages as a
 * consumer's own page (PROTOCOL §6, §6.4), with read_partition_page,
 * partition_page_info and advance_partition.
 */
export function partitionPageSql(base: PageSql, schema: string, consumer: string, stream: string, partition: number, member: string): PageSql {
  const s = quoteIdent(schema);
  const names = `${sqlText(consumer)}, ${sqlText(stream)}, ${Math.trunc(partition)}`;
  const read = (_c: string, _s: string, limit: number) =>
    `SELECT ${EVENT_COLUMNS('p')} FROM ${s}.read_partition_page(${names}, ${sqlText(member)}, ${Math.trunc(limit)}) p; SELECT * FROM ${s}.partition_page_info(${names})`;
  const refuse = () => {
    throw new InvalidOptionsError('partition', 'a partition page reads no events ahead');
  };
  return {
    ...base,
    open: (c, st, limit, lockTimeoutMs) => `${base.begin(lockTimeoutMs)}; ${read(c, st, limit)}`,
    openAhead: refuse,
    read,
    // A dead letter of the partition, and the partition's replays
    // (migration 0016): the same parameters as a consumer's own.
    recordDeadLetter: `SELECT ${s}.record_partition_dead_letter($1, $2, ${Math.trunc(partition)}, ${sqlText(member)}, $3, $4, $5)::text AS id`,
    nextReplay: `SELECT r.id::text AS id, r.attempts, ${EVENT_COLUMNS('r')} FROM ${s}.partition_replay($1, $2, ${Math.trunc(partition)}, ${sqlText(member)}, $3::pg_catalog.int8[]) r`,
    anyReplay: `SELECT 1 FROM ${s}.dead_letters d WHERE d.consumer = $1 AND d.stream = $2 AND d.partition = ${Math.trunc(partition)} AND d.replay_requested_at IS NOT NULL
   AND d.seq <= (SELECT pc.seq FROM ${s}.partition_cursors pc WHERE pc.consumer = $1 AND pc.stream = $2 AND pc.partition = ${Math.trunc(partition)}) LIMIT 1`,
    commit: (_c, _s, seq) => (seq === undefined ? 'COMMIT' : `SELECT ${s}.advance_partition(${names}, ${sqlText(member)}, ${seq.toString()}); COMMIT`),
    // The partition's cursor and the stream's horizon when the horizon is
    // above it ($1 consumer, $2 stream, as for a consumer's own).
    noteResync: `SELECT pc.seq::text AS cursor, h.pruned_through_seq::text AS pruned_through
  FROM ${s}.partition_cursors pc JOIN ${s}.horizons h ON h.stream = pc.stream
 WHERE pc.consumer = $1 AND pc.stream = $2 AND pc.partition = ${Math.trunc(partition)} AND h.pruned_through_seq > pc.seq`,
  };
}

/** A FIFO counting semaphore: at most `size` holders at once. */
export class Semaphore {
  private free: number;
  private readonly waiters: (() => void)[] = [];

  constructor(size: number) {
    this.free = size;
  }

  /** Resolves once a slot is this caller's; rejects with the abort reason (holding nothing). */
  acquire(signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    if (this.free > 0) {
      this.free -= 1;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const grant = () => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(grant);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
      };
      this.waiters.push(grant);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free += 1;
  }
}
