import type pg from 'pg';
import { backoffMs } from '../backoff.js';
import { sleep } from '../db/acquire.js';
import { poolOption } from '../options.js';
import { boundedQuery } from '../db/deadline.js';
import { quoteIdent } from '../db/queryable.js';
import { resolvePrunerOptions, type PruneResult, type PrunerOptions, type ResolvedPrunerOptions } from './options.js';
import { notifyObserver, reportError } from '../callbacks.js';

/** A prune batch (an index range scan of at most `batchSize` events) that gets no answer within this long has its connection dropped. */
const BATCH_BOUND_MS = 60_000;
/** Bound on the heartbeat beyond its own 5 s lock wait. */
const BEAT_BOUND_MS = 10_000;
/** Back-off of `run()` after a failed pass. */
const RETRY_MIN_MS = 100;
const RETRY_MAX_MS = 10_000;

interface BatchRow {
  scanned: string;
  deleted: string;
  safe_seq: string;
  horizons: { stream: string; through: string }[];
}

/**
 * One batch in one statement, so in one snapshot and one transaction: take
 * the oldest `$2` events at or below safe_seq, delete the longest seq prefix
 * of them older than the retention age, and advance the horizon of each
 * stream touched in the same statement. Deleting a contiguous prefix keeps
 * the horizon exact (every event of a stream at or below its horizon is
 * gone) and each batch an index range scan, even when nothing is old.
 */
function batchSql(schema: string): string {
  const s = quoteIdent(schema);
  return `WITH w AS (
  SELECT safe_seq FROM ${s}.watermark
), candidates AS (
  SELECT e.seq, e.occurred_at FROM ${s}.events e
   WHERE e.seq <= (SELECT safe_seq FROM w)
   ORDER BY e.seq
   LIMIT $2
), boundary AS (
  SELECT min(c.seq) AS young FROM candidates c
   WHERE c.occurred_at > pg_catalog.now() - pg_catalog.make_interval(secs => $1::float8 / 1000::float8)
), victims AS (
  SELECT c.seq FROM candidates c, boundary b WHERE b.young IS NULL OR c.seq < b.young
), deleted AS (
  DELETE FROM ${s}.events e USING victims v WHERE e.seq = v.seq
  RETURNING e.seq, e.stream
), advanced AS (
  INSERT INTO ${s}.horizons AS h (stream, pruned_through_seq, updated_at)
  SELECT d.stream, max(d.seq), now() FROM deleted d GROUP BY d.stream
  ON CONFLICT (stream) DO UPDATE
    SET pruned_through_seq = greatest(h.pruned_through_seq, excluded.pruned_through_seq),
        updated_at = excluded.updated_at
  RETURNING h.stream, h.pruned_through_seq
)
SELECT (SELECT count(*) FROM candidates)::text AS scanned,
       (SELECT count(*) FROM deleted)::text AS deleted,
       (SELECT safe_seq FROM w)::text AS safe_seq,
       (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object('stream'::text, a.stream, 'through'::text, a.pruned_through_seq::text)), '[]'::json)
          FROM advanced a) AS horizons`;
}

/**
 * Deletes events older than the retention age, independently of consumers:
 * it never reads cursors. It deletes only `seq <= safe_seq` and advances each
 * stream's horizon in the same statement as the delete, so a consumer whose
 * cursor falls below a horizon gets `ResyncRequiredError`, never a silent
 * skip. Safe to run in several processes at once (they delete disjoint rows
 * or wait for each other's row locks).
 *
 * @example
 * const pruner = new Pruner(pool, { retentionMs: 3 * 24 * 3600_000 });
 * const { deleted } = await pruner.prune();
 */
export class Pruner {
  /** The validated, frozen options in force. */
  readonly options: ResolvedPrunerOptions;
  private readonly pool: pg.Pool;
  private readonly sql: { batch: string; beat: string };

  constructor(pool: pg.Pool, options: PrunerOptions = {}) {
    this.pool = poolOption(pool);
    this.options = resolvePrunerOptions(options);
    this.sql = {
      batch: batchSql(this.options.schema),
      beat: `SELECT ${quoteIdent(this.options.schema)}.beat('pruner', $1, $2, $3)`,
    };
  }

  /** One pass: batches until a batch finds nothing more to delete, or `signal` aborts (then rejects with its reason). */
  async prune(options: { signal?: AbortSignal } = {}): Promise<PruneResult> {
    const { signal } = options;
    const result: PruneResult = { deleted: 0, batches: 0, horizons: [], safeSeq: 0n };
    const horizons = new Map<string, bigint>();
    for (;;) {
      signal?.throwIfAborted();
      const row = (await boundedQuery<BatchRow>(this.pool, BATCH_BOUND_MS, 'a prune batch', this.sql.batch, [this.options.retentionMs, this.options.batchSize])).rows[0]!;
      result.batches += 1;
      const deleted = Number(row.deleted);
      result.deleted += deleted;
      result.safeSeq = BigInt(row.safe_seq);
      for (const h of row.horizons) horizons.set(h.stream, BigInt(h.through));
      // Done when the batch was short or stopped at a young event.
      if (deleted < this.options.batchSize || Number(row.scanned) > deleted) break;
    }
    result.horizons = [...horizons].map(([stream, prunedThroughSeq]) => ({ stream, prunedThroughSeq }));
    return result;
  }

  /**
   * Prunes every `intervalMs` until `signal` aborts, writing a `pruner`
   * heartbeat after each pass. Errors go to `onError` and the loop goes on:
   * a failed pass is tried again after a back-off (100 ms doubling, with
   * jitter, up to 10 s, never longer than `intervalMs`), so a database that
   * comes back is pruned, and reported healthy, within seconds rather than
   * at the next interval. Resolves (does not reject) when the signal aborts.
   */
  async run(signal: AbortSignal): Promise<void> {
    const o = this.options;
    let failures = 0;
    while (!signal.aborted) {
      let pauseMs = o.intervalMs;
      try {
        const result = await this.prune({ signal });
        failures = 0;
        this.observe(result);
        const details = { deleted: result.deleted, safeSeq: result.safeSeq.toString() };
        await boundedQuery(this.pool, 5000 + BEAT_BOUND_MS, 'the pruner heartbeat', this.sql.beat, [o.owner, details, 5000]);
      } catch (err) {
        if (signal.aborted) break;
        this.report(err);
        failures += 1;
        pauseMs = backoffMs(failures, RETRY_MIN_MS, Math.min(o.intervalMs, RETRY_MAX_MS));
      }
      await sleep(pauseMs, signal).catch(() => undefined);
    }
  }

  private observe(result: PruneResult): void {
    notifyObserver(this.options.observer, result, this.options.onError);
  }

  private report(err: unknown): void {
    reportError(this.options.onError, err);
  }
}
