import { setTimeout as delay } from 'node:timers/promises';
import type pg from 'pg';
import { ClosedError, InvalidOptionsError, SQLSTATE, sqlState } from '../errors.js';
import { cancellableQuery } from '../db/cancellable.js';
import { notifyChannel, quoteIdent } from '../db/queryable.js';
import { acquireLease, acquireLeaseSql, releaseLeaseSql } from './lease.js';
import { resolveWatermarkerOptions, type ResolvedWatermarkerOptions, type WatermarkerOptions } from './options.js';
import type { HeartbeatOutcome, WatermarkProgress } from './progress.js';
import { notifyObserver, reportError } from '../observability/callbacks.js';

interface StepRow {
  outcome: 'advanced' | 'idle' | 'busy' | 'timeout' | 'not_leader';
  safe_seq: string;
  prior_seq: string;
  max_seq: string | null;
  wait_us: number;
  hold_us: number;
  lease_owner: string | null;
  lease_expires_at: Date | null;
}

/** Options for a single {@link Watermarker.step}. */
export interface StepOptions {
  /** Cancels the post-commit heartbeat. The fenced section itself is bounded by its lock wait (`lockTimeoutMs`, escalating to `lockTimeoutMaxMs`) and always completes or aborts on its own. */
  signal?: AbortSignal;
}

/**
 * The leased singleton that advances safe_seq. Run one per deployment (or
 * several: the lease makes one active and the others standbys).
 *
 * @example
 * const watermarker = new Watermarker(pool, { schema: 'tidemark' });
 * const stop = new AbortController();
 * const running = watermarker.run(stop.signal);
 * // ... on shutdown:
 * stop.abort();
 * await running;
 * await watermarker.close();
 */
export class Watermarker {
  /** The validated, frozen options in force. */
  readonly options: ResolvedWatermarkerOptions;
  private readonly pool: pg.Pool;
  private readonly sql: { lease: string; release: string; stepFunction: string; watermarkTable: string; beat: string };
  private leader = false;
  private leaseOwner: string | null = null;
  private leaseExpiresAt: Date | null = null;
  private renewDueAt = 0;
  private safeSeq = 0n;
  private busyStreak = 0;
  /** Try-lock misses before the next bounded wait; doubles after each timed-out wait. */
  private blockAfter: number;
  /** The next bounded wait's lock_timeout; doubles after each timed-out wait, up to lockTimeoutMaxMs. */
  private waitMs: number;
  /** The bound of the current step's wait, for its progress (null: no wait). */
  private stepLimit: number | null = null;
  private lastBeatAt = Number.NEGATIVE_INFINITY;
  private closed = false;

  constructor(pool: pg.Pool, options: WatermarkerOptions = {}) {
    if (!pool || typeof (pool as { connect?: unknown }).connect !== 'function') {
      throw new InvalidOptionsError('pool', 'expected a pg Pool');
    }
    this.pool = pool;
    this.options = resolveWatermarkerOptions(options);
    this.blockAfter = this.options.fenceTryLimit;
    this.waitMs = this.options.lockTimeoutMs;
    const s = quoteIdent(this.options.schema);
    this.sql = {
      lease: acquireLeaseSql(this.options.schema),
      release: releaseLeaseSql(this.options.schema),
      stepFunction: `${s}.watermark_step`,
      watermarkTable: `${s}.watermark`,
      beat: `SELECT ${s}.beat('watermarker', $1, $2, $3)`,
    };
  }

  /** True while this instance believes it holds the lease (validated again by every publication). */
  get isLeader(): boolean {
    return this.leader;
  }

  /**
   * One step: renew the lease if due (outside the fence), run the fenced
   * section in one round trip, then, after its commit, NOTIFY consumers on
   * advancement, call the observer and write the throttled heartbeat.
   * A busy fence or a lost lease is an outcome, not an error.
   */
  async step(options: StepOptions = {}): Promise<WatermarkProgress> {
    if (this.closed) throw new ClosedError('Watermarker');
    const o = this.options;
    if (!this.leader || Date.now() >= this.renewDueAt) {
      const lease = await acquireLease(this.pool, this.sql.lease, o.owner, o.leaseTtlMs);
      this.leader = lease.held;
      this.leaseOwner = lease.owner;
      this.leaseExpiresAt = lease.expiresAt;
      if (lease.held) this.renewDueAt = Date.now() + o.leaseRenewMs;
    }

    const priorSeq = this.safeSeq;
    let progress: WatermarkProgress;
    if (!this.leader) {
      this.stepLimit = null;
      progress = this.progress('not_leader', priorSeq, null, false, false, 0, 0);
    } else {
      const blocking = this.busyStreak >= this.blockAfter;
      this.stepLimit = blocking ? this.waitMs : null;
      try {
        // The row lock of the publication is bounded by lockTimeoutMs, not
        // by the (escalated) fence wait: the fence is held meanwhile.
        // The step's NOTIFY rides in the same round trip (fencedStep).
        progress = this.fromRow(await this.fencedStep(blocking, priorSeq), blocking);
      } catch (err) {
        if (sqlState(err) === SQLSTATE.lockNotAvailable && insideStepFunction(err)) {
          // Holding the fence, the publishing UPDATE waited longer than
          // lockTimeoutMs for the watermark row: some session holds it (an
          // operator's SELECT ... FOR UPDATE?). Nothing was published. The
          // fence itself was granted, so this says nothing about writers:
          // no escalation, and the next step starts afresh (busyStreak 0).
          this.report(err);
          this.busyStreak = 0;
          progress = this.progress('row_locked', priorSeq, null, blocking, false, 0, 0);
        } else {
          // The failure may have come after the COMMIT (the NOTIFY, or the
          // connection dying in between): a publication must not be hidden.
          const published = await this.readSafeSeq().catch(() => null);
          if (published === null || published <= priorSeq) throw err;
          this.report(err);
          progress = this.fromRow(
            {
              outcome: 'advanced',
              safe_seq: published.toString(),
              prior_seq: priorSeq.toString(),
              max_seq: published.toString(),
              wait_us: 0,
              hold_us: 0,
              lease_owner: this.leaseOwner,
              lease_expires_at: this.leaseExpiresAt,
            },
            blocking,
          );
        }
      }
    }

    // Everything below runs after the fenced transaction committed.
    this.observe(progress);
    progress.heartbeat = await this.heartbeat(progress, options.signal);
    return progress;
  }

  /**
   * Steps until `signal` aborts: every `pollMinMs` while events flow (and
   * for `idleGraceMs` after the last publication), backing off to
   * `pollMaxMs` while idle, and at the lease renewal interval as a
   * standby. Step errors go to `onError` and the loop goes on. Resolves (does
   * not reject) when the signal aborts.
   */
  async run(signal: AbortSignal): Promise<void> {
    const o = this.options;
    let wait = o.pollMinMs;
    let lastAdvanceAt = Number.NEGATIVE_INFINITY;
    while (!signal.aborted && !this.closed) {
      try {
        const progress = await this.step({ signal });
        if (progress.advanced) lastAdvanceAt = performance.now();
        if (progress.outcome === 'idle') {
          // Idle right after a publication: events are likely still flowing.
          wait = performance.now() - lastAdvanceAt < o.idleGraceMs ? o.pollMinMs : Math.min(Math.max(wait * 2, 1), o.pollMaxMs);
        } else if (progress.outcome === 'not_leader') wait = o.leaseRenewMs;
        else wait = o.pollMinMs;
      } catch (err) {
        if (signal.aborted) break;
        this.report(err);
        wait = Math.min(Math.max(wait * 2, o.pollMinMs, 10), Math.max(o.pollMaxMs, 1000));
      }
      await delay(wait, undefined, { signal }).catch(() => undefined);
    }
  }

  /** Releases the lease (so a standby takes over at once) and stops stepping. Idempotent; does not end the pool. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.leader) {
      this.leader = false;
      await this.pool.query(this.sql.release, [this.options.owner]);
    }
  }

  /**
   * The fenced transaction and the consumers' wake-up in one round trip:
   * one simple-protocol message runs BEGIN, watermark_step and COMMIT, then,
   * in a transaction of its own after that commit, a NOTIFY carrying
   * safe_seq when it is now above what this instance had seen. (A NOTIFY
   * inside the fenced transaction would take PostgreSQL's cluster-wide
   * notify lock while the fence is held.) After an error the connection is
   * rolled back, or destroyed if that fails.
   */
  private async fencedStep(blocking: boolean, priorSeq: bigint): Promise<StepRow> {
    const o = this.options;
    const client = await this.pool.connect();
    // A terminated backend also emits 'error' on the client; the query's own rejection carries it.
    const ignore = () => undefined;
    client.on('error', ignore);
    let broken: Error | undefined;
    try {
      // On a connection returned to the pool inside a transaction, BEGIN only
      // warns; the check fails the step (all statements of one message share
      // statement_timestamp, a fresh transaction starts at it), so that
      // transaction is rolled back below instead of committed with the step.
      const text =
        `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE; ${OPEN_TRANSACTION_CHECK}; ` +
        `SELECT * FROM ${this.sql.stepFunction}(${client.escapeLiteral(o.owner)}, ${blocking}, ${Math.trunc(this.waitMs)}, ${o.synchronousCommit}, ${o.lockTimeoutMs}); ` +
        `COMMIT; ` +
        `SELECT pg_catalog.pg_notify(${client.escapeLiteral(notifyChannel(o.schema))}, w.safe_seq::text) ` +
        `FROM ${this.sql.watermarkTable} w WHERE w.safe_seq > ${priorSeq.toString()}`;
      const results = (await client.query(text)) as unknown as pg.QueryResult<StepRow>[];
      return results[2]!.rows[0]!; // BEGIN, check, step, COMMIT, NOTIFY
    } catch (err) {
      await client.query('ROLLBACK').catch((rollbackErr: Error) => (broken = rollbackErr));
      throw err;
    } finally {
      client.off('error', ignore);
      client.release(broken);
    }
  }

  private async readSafeSeq(): Promise<bigint> {
    const r = await this.pool.query<{ safe_seq: string }>(`SELECT safe_seq FROM ${this.sql.watermarkTable}`);
    return BigInt(r.rows[0]!.safe_seq);
  }

  private fromRow(row: StepRow, blocking: boolean): WatermarkProgress {
    const o = this.options;
    const safeSeq = BigInt(row.safe_seq);
    if (safeSeq > this.safeSeq) this.safeSeq = safeSeq;
    this.leaseOwner = row.lease_owner;
    this.leaseExpiresAt = row.lease_expires_at;
    if (row.outcome === 'not_leader') {
      this.leader = false;
    }
    const maxSeq = row.max_seq === null ? null : BigInt(row.max_seq);
    if (row.outcome === 'timeout') {
      // The bounded fence wait expired: nothing was published, and the
      // queued exclusive request is gone. Writers that outlast one wait may
      // outlast the next: space the waits out (each one briefly queues new
      // writers) and make the next one longer, so that one finally outlasts
      // the writers holding the fence. A wait that times out at the cap
      // means a writer longer than the cap (a leaked transaction, say):
      // nothing can publish until it ends, so waits become rare (up to 1024
      // misses apart) instead of queueing writers for the full cap again.
      const atCap = this.waitMs >= o.lockTimeoutMaxMs;
      this.busyStreak = 0;
      this.blockAfter = Math.max(o.fenceTryLimit, Math.min(this.blockAfter * 2 + 1, atCap ? 1024 : 64));
      this.waitMs = Math.min(this.waitMs * 2, o.lockTimeoutMaxMs);
      return this.progress('fence_busy', BigInt(row.prior_seq), maxSeq, true, true, row.wait_us / 1000, 0);
    }
    this.busyStreak = row.outcome === 'busy' ? this.busyStreak + 1 : 0;
    if (row.outcome !== 'busy') this.blockAfter = o.fenceTryLimit;
    // After a publication the wait halves rather than resetting, so under
    // sustained overlap it stays near the level that last succeeded instead
    // of climbing the whole ladder of timed-out waits again. Other outcomes
    // (idle, not_leader) say nothing about writers and leave it alone.
    if (row.outcome === 'advanced') this.waitMs = Math.max(o.lockTimeoutMs, Math.floor(this.waitMs / 2));
    return this.progress(
      row.outcome === 'busy' ? 'fence_busy' : row.outcome,
      BigInt(row.prior_seq),
      maxSeq,
      blocking,
      false,
      row.wait_us / 1000,
      row.hold_us / 1000,
    );
  }

  private progress(
    outcome: WatermarkProgress['outcome'],
    priorSeq: bigint,
    maxSeq: bigint | null,
    blocking: boolean,
    fenceTimedOut: boolean,
    fenceWaitMs: number,
    fenceHoldMs: number,
  ): WatermarkProgress {
    return {
      outcome,
      advanced: outcome === 'advanced',
      safeSeq: this.safeSeq,
      priorSeq,
      maxSeq,
      blocking,
      fenceTimedOut,
      fenceWaitLimitMs: this.stepLimit,
      fenceWaitMs,
      fenceHoldMs,
      leader: this.leader,
      leaseOwner: this.leaseOwner,
      leaseExpiresAt: this.leaseExpiresAt,
      heartbeat: 'throttled',
    };
  }

  private observe(progress: WatermarkProgress): void {
    notifyObserver(this.options.observer, { ...progress }, this.options.onError);
  }

  private async heartbeat(progress: WatermarkProgress, signal?: AbortSignal): Promise<HeartbeatOutcome> {
    const o = this.options;
    if (Date.now() - this.lastBeatAt < o.heartbeatIntervalMs) return 'throttled';
    if (signal?.aborted) return 'cancelled';
    this.lastBeatAt = Date.now();
    const details = {
      leader: progress.leader,
      outcome: progress.outcome,
      safeSeq: progress.safeSeq.toString(),
      maxSeq: progress.maxSeq?.toString() ?? null,
    };
    try {
      await cancellableQuery(this.pool, this.sql.beat, [o.owner, details, o.heartbeatTimeoutMs], signal);
      return 'written';
    } catch (err) {
      if (signal?.aborted) return 'cancelled';
      this.report(err);
      return 'failed';
    }
  }

  private report(err: unknown): void {
    reportError(this.options.onError, err);
  }
}

const OPEN_TRANSACTION_CHECK =
  `DO $$ BEGIN IF pg_catalog.transaction_timestamp() <> pg_catalog.statement_timestamp() THEN ` +
  `RAISE EXCEPTION 'tidemark watermarker: its pooled connection was inside a transaction already; rolling it back' USING ERRCODE = '25001'; ` +
  `END IF; END $$`;

/** True when a PostgreSQL error was raised inside watermark_step (its context names the function). */
function insideStepFunction(err: unknown): boolean {
  const where = (err as { where?: unknown }).where;
  return typeof where === 'string' && where.includes('watermark_step');
}
