import type pg from 'pg';
import { quoteIdent } from '../db/queryable.js';
import { cancelBackend } from '../db/cancellable.js';
import type { ResolvedWatermarkerOptions } from './options.js';
import type { RunEndReason, WatermarkRunSummary } from './progress.js';

/** The application_name of the loop's connection, so operators can find it in pg_stat_activity. */
export const LOOP_APPLICATION_NAME = 'tidemark-watermarker';

interface RunRow {
  reason: RunEndReason;
  steps: string;
  polls: string;
  advanced: string;
  pending: string;
  idle: string;
  try_lock_reads: string;
  pg_locks_reads: string;
  pg_locks_read_us_total: number;
  step_us_total: number;
  step_us_max: number;
  step_us_hist: (number | null)[] | null;
  safe_seq: string | null;
  leader: boolean;
  lease_owner: string | null;
  lease_expires_at: Date | null;
  oldest_pending_at: Date | null;
}

/**
 * One connection that runs `CALL run_watermarker(...)` again and again.
 * The session is set up for it once: a name in pg_stat_activity, READ
 * COMMITTED whatever the role's default, a statement_timeout 30 s above
 * one run (so a run that hangs ends), and a lock_timeout for DDL it may meet.
 * After any failure the connection is destroyed, never reused: ending the
 * session is what releases a session-level lock an interrupted step might
 * hold (the try-lock is taken and released in one expression).
 */
export class LoopConnection {
  private client: pg.PoolClient | undefined;
  private readonly call: (client: pg.PoolClient) => string;

  constructor(
    private readonly pool: pg.Pool,
    private readonly options: ResolvedWatermarkerOptions,
  ) {
    const o = options;
    this.call = (client) =>
      `CALL ${quoteIdent(o.schema)}.run_watermarker(p_owner => ${client.escapeLiteral(o.owner)}, ` +
      `p_run_ms => ${o.summaryIntervalMs}, p_lease_ttl_ms => ${o.leaseTtlMs}, p_lease_renew_ms => ${o.leaseRenewMs}, ` +
      `p_poll_min_ms => ${o.pollMinMs}, p_poll_max_ms => ${o.pollMaxMs}, p_idle_grace_ms => ${o.idleGraceMs}, ` +
      `p_synchronous_commit => ${o.synchronousCommit}, p_try_lock => ${o.tryLockFirst}, p_max_steps_per_second => ${o.maxStepsPerSecond})`;
  }

  /** Runs the loop once; on abort, cancels it on the server. Resolves with its summary. */
  async runOnce(signal: AbortSignal): Promise<WatermarkRunSummary> {
    signal.throwIfAborted();
    const client = this.client ?? (await this.open());
    let cancelling: Promise<void> | undefined;
    const onAbort = () => {
      cancelling = cancelBackend(this.pool, (client as unknown as { processID: number }).processID);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    const started = performance.now();
    try {
      const result = await client.query<RunRow>(this.call(client));
      return toSummary(result.rows[0]!, performance.now() - started);
    } catch (err) {
      this.destroy(err);
      throw err;
    } finally {
      signal.removeEventListener('abort', onAbort);
      if (cancelling) await cancelling;
    }
  }

  /** Ends the session (destroying the connection). Idempotent. */
  close(): void {
    this.destroy(new Error('tidemark watermarker loop closed'));
  }

  private async open(): Promise<pg.PoolClient> {
    const client = await this.pool.connect();
    // A terminated backend also emits 'error' on the client; the query's own rejection carries it.
    client.on('error', () => undefined);
    try {
      await client.query(
        `SET application_name = '${LOOP_APPLICATION_NAME}'; SET default_transaction_isolation = 'read committed'; ` +
          `SET statement_timeout = ${this.options.summaryIntervalMs + 30_000}; SET lock_timeout = 5000`,
      );
    } catch (err) {
      client.release(err as Error);
      throw err;
    }
    this.client = client;
    return client;
  }

  private destroy(err: unknown): void {
    const client = this.client;
    this.client = undefined;
    client?.release(err instanceof Error ? err : new Error(String(err)));
  }
}

function toSummary(row: RunRow, elapsedMs: number): WatermarkRunSummary {
  return {
    reason: row.reason,
    steps: Number(row.steps),
    polls: Number(row.polls),
    advanced: Number(row.advanced),
    pending: Number(row.pending),
    idle: Number(row.idle),
    tryLockReads: Number(row.try_lock_reads),
    pgLocksReads: Number(row.pg_locks_reads),
    pgLocksReadMsTotal: row.pg_locks_read_us_total / 1000,
    stepMsTotal: row.step_us_total / 1000,
    stepMsMax: row.step_us_max / 1000,
    stepHistogram: (row.step_us_hist ?? []).map((n) => n ?? 0),
    safeSeq: BigInt(row.safe_seq ?? '0'),
    leader: row.leader,
    leaseOwner: row.lease_owner,
    leaseExpiresAt: row.lease_expires_at,
    oldestPendingAt: row.oldest_pending_at,
    elapsedMs,
  };
}
