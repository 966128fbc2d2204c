import type pg from 'pg';
import { sleep } from '../db/acquire.js';
import { quoteIdent } from '../db/queryable.js';
import { InvalidOptionsError, sqlState, SQLSTATE } from '../errors.js';
import { checkKnownOptions, integerOption, nameOption, poolOption } from '../options.js';
import { buildPartitionIndex } from './group.js';

/** Where a group's re-partition stands (migration 0017, PROTOCOL §6.6). */
export interface RepartitionState {
  consumer: string;
  stream: string;
  /** The group's partition count now. */
  partitions: number;
  /** The count asked for; null when nothing is pending (switched, or never asked). */
  nextPartitions: number | null;
  /** The old split's pages read up to here while a re-partition is pending. */
  barrier: bigint | null;
  /** Where the current split began: 0, or the barrier of the last switch. */
  sinceSeq: bigint;
  /** Old partitions that still have events to apply up to the barrier (null: not counted yet). */
  behind: number | null;
}

/** Options of {@link repartitionGroup}. */
export interface RepartitionOptions {
  /** The tidemark schema; default `tidemark`. */
  schema?: string;
  /**
   * Wait for the switch: true (default) checks every `pollIntervalMs` until
   * the old split drained to the barrier and switches; false records the
   * barrier and returns (call again, waiting, to switch).
   */
  wait?: boolean;
  /** How often a waiting call tries the switch. Default 200. */
  pollIntervalMs?: number;
  /** How long one try waits for the pages open on the group. Default 5000. */
  lockTimeoutMs?: number;
  /**
   * Create the new count's partition index first (CONCURRENTLY), and drop
   * the old count's once no group uses it. Default true.
   */
  partitionIndex?: boolean;
  /** Stops a waiting call (the re-partition stays pending; call again to finish it). */
  signal?: AbortSignal;
  /** Called with the state after each try that did not switch. */
  onProgress?: (state: RepartitionState) => void;
}

/** What {@link repartitionGroup} did. */
export interface RepartitionResult extends RepartitionState {
  /** The count before. */
  from: number;
  /** A pending re-partition was cancelled (asked with the current count). */
  cancelled: boolean;
  /** The partition index it created, and the one it dropped. */
  indexCreated: string | null;
  indexDropped: string | null;
}

interface StateRow {
  partitions: number;
  next_partitions: number | null;
  barrier: string | null;
  since_seq: string;
  behind: number | null;
}

const OPTION_NAMES = { schema: true, wait: true, pollIntervalMs: true, lockTimeoutMs: true, partitionIndex: true, signal: true, onProgress: true } as const;

/**
 * Changes the partition count of `consumer`'s group on `stream` (PROTOCOL
 * §6.6): records the count and a barrier (safe_seq now), after which the
 * old split reads nothing above the barrier; then, once every old
 * partition has applied its events up to the barrier, switches: every
 * partition of the new split starts at the barrier. Each event is applied
 * once, each key in order. Running members follow the new count; a member
 * started later must give it. The schema owner's call (it builds and drops
 * the partition index). Asked with the current count while a re-partition
 * is pending, it cancels it.
 */
export async function repartitionGroup(pool: pg.Pool, consumer: string, stream: string, partitions: number, options: RepartitionOptions = {}): Promise<RepartitionResult> {
  checkKnownOptions(options, OPTION_NAMES satisfies Record<keyof RepartitionOptions, true>, 'repartitionGroup');
  poolOption(pool);
  nameOption(consumer, 'consumer');
  nameOption(stream, 'stream');
  integerOption({ partitions }, 'partitions', Number.NaN, 1, 1024);
  const pollIntervalMs = integerOption(options, 'pollIntervalMs', 200, 10, 60_000);
  const lockTimeoutMs = integerOption(options, 'lockTimeoutMs', 5000, 10, 600_000);
  if (options.onProgress !== undefined && typeof options.onProgress !== 'function') throw new InvalidOptionsError('onProgress', 'expected a function');
  const schema = options.schema ?? 'tidemark';
  const s = quoteIdent(schema);
  const signal = options.signal ?? new AbortController().signal;
  const state = (row: StateRow): RepartitionState => ({
    consumer,
    stream,
    partitions: row.partitions,
    nextPartitions: row.next_partitions,
    barrier: row.barrier === null ? null : BigInt(row.barrier),
    sinceSeq: BigInt(row.since_seq),
    behind: row.behind,
  });

  const before = (await pool.query<{ partitions: number; next_partitions: number | null }>(`SELECT g.partitions, g.next_partitions FROM ${s}.groups g WHERE g.consumer = $1 AND g.stream = $2`, [consumer, stream])).rows[0];
  if (!before) {
    throw new InvalidOptionsError('consumer', `${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)} is not a group: its first member creates it (tail --partitions N, StreamClient.tailGroup)`);
  }
  // The new count's index before the barrier: the new split's pages are
  // range scans from their first.
  const index = options.partitionIndex !== false && partitions !== before.partitions;
  const indexCreated = index && (await buildPartitionIndex(pool, schema, partitions, signal, 60_000)) ? `events_partition_${partitions}` : null;

  let now = state((await pool.query<StateRow>(`SELECT * FROM ${s}.repartition_group($1, $2, $3)`, [consumer, stream, partitions])).rows[0]!);
  const cancelled = before.next_partitions !== null && partitions === before.partitions;
  const result = (): RepartitionResult => ({ ...now, from: before.partitions, cancelled, indexCreated, indexDropped: null });
  if (now.nextPartitions === null || options.wait === false) return result();

  for (;;) {
    signal.throwIfAborted();
    const client = await pool.connect();
    try {
      await client.query(`SET lock_timeout = ${lockTimeoutMs}`);
      now = state((await client.query<StateRow>(`SELECT * FROM ${s}.finish_repartition($1, $2)`, [consumer, stream])).rows[0]!);
    } catch (err) {
      // A page still open when the lock wait ended, or a holder whose lease
      // ended as the switch committed (the fence): try again.
      if (sqlState(err) !== '55P03' && sqlState(err) !== SQLSTATE.partitionNotHeld) throw err;
    } finally {
      await client.query('RESET lock_timeout').then(() => client.release(), (err: Error) => client.release(err));
    }
    if (now.nextPartitions === null) break;
    options.onProgress?.(now);
    await sleep(pollIntervalMs, signal);
  }
  // The old count's index, once no group of the schema uses it.
  let indexDropped: string | null = null;
  if (options.partitionIndex !== false && now.partitions !== before.partitions) {
    const used = await pool.query(`SELECT 1 FROM ${s}.groups g WHERE g.partitions = $1 OR g.next_partitions = $1`, [before.partitions]);
    if (used.rowCount === 0) {
      const name = `events_partition_${before.partitions}`;
      const dropped = await pool.query<{ existed: boolean }>(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relname = $1 AND c.relnamespace = $2::pg_catalog.regnamespace) AS existed`, [name, schema]);
      if (dropped.rows[0]!.existed) {
        await pool.query(`DROP INDEX CONCURRENTLY IF EXISTS ${s}.${quoteIdent(name)}`);
        indexDropped = name;
      }
    }
  }
  return { ...result(), indexDropped };
}
