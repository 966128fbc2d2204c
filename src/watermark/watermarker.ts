import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import type pg from 'pg';
import { ClosedError, OwnerInUseError, SQLSTATE, sqlState } from '../errors.js';
import { poolOption } from '../options.js';
import { cancellableQuery } from '../db/cancellable.js';
import { quoteIdent } from '../db/queryable.js';
import { acquireLease, claimOwner, claimTtlMs, leaseSql, type LeaseSql, type OwnerClaim } from './lease.js';
import { leaderUntil, LoopConnection } from './loop.js';
import { boundedQuery, withDeadline } from '../db/deadline.js';
import { resolveWatermarkerOptions, type ResolvedWatermarkerOptions, type WatermarkerOptions } from './options.js';
import type { HeartbeatOutcome, HolderPath, StepOutcome, WatermarkerEvent, WatermarkProgress, WatermarkRunSummary } from './progress.js';
import { notifyObserver, reportError } from '../callbacks.js';
import { backoffMs } from '../backoff.js';

interface StepRow {
  outcome: StepOutcome;
  safe_seq: string;
  prior_seq: string;
  last_seq: string | null;
  holders: number | null;
  pending: number;
  holder_path: HolderPath | null;
  holder_read_us: number | null;
  oldest_pending_at: Date | null;
  lease_owner: string | null;
  lease_expires_at: Date | null;
  step_ms: number;
  received_at: Date;
}

/** Options for a single {@link Watermarker.step}. */
export interface StepOptions {
  /** Cancels the post-commit heartbeat. The step itself never waits for writers and always completes or aborts on its own. */
  signal?: AbortSignal;
}

/**
 * The leased singleton that advances safe_seq. Run one per deployment (or
 * several: the lease makes one active and the others standbys).
 *
 * `run()` supervises the step loop that runs inside PostgreSQL
 * (`CALL run_watermarker`): it calls it again after each summary, and
 * again after a failure with a capped, jittered back-off. `step()` is one
 * step from here. Neither ever blocks a writer: a step observes the writers
 * in flight and publishes what they can no longer change.
 *
 * @example
 * const watermarker = new Watermarker(pool, { schema: 'tidemark' });
 * const stop = new AbortController();
 * const running = watermarker.run(stop.signal);
 * // ... on shutdown:
 * stop.abort();
 * await running;
 * await watermarker.close(); // releases the lease: a standby takes over at once
 */
export class Watermarker {
  /** The validated, frozen options in force. */
  readonly options: ResolvedWatermarkerOptions;
  /**
   * This process's id, `host:pid:random`, the same for every Watermarker
   * of the process. It claims `options.owner` under it before it runs the
   * loop or takes the lease: one live process per owner (another one is
   * refused with `OwnerInUseError`).
   */
  readonly instance = PROCESS_INSTANCE;
  private readonly pool: pg.Pool;
  private readonly lease: LeaseSql;
  private readonly sql: { step: string; beat: string };
  private leader = false;
  private leaderUntil: Date | null = null;
  private renewDueAt = 0;
  private lastBeatAt = Number.NEGATIVE_INFINITY;
  private closed = false;

  constructor(pool: pg.Pool, options: WatermarkerOptions = {}) {
    this.pool = poolOption(pool);
    this.options = resolveWatermarkerOptions(options);
    const s = quoteIdent(this.options.schema);
    this.lease = leaseSql(this.options.schema);
    this.sql = {
      step: `${s}.watermark_step`,
      beat: `SELECT ${s}.beat('watermarker', $1, $2, $3)`,
    };
  }

  /**
   * True while this instance holds the lease as far as it can know: the
   * last step or loop summary said so, and the lease it reported has not
   * expired yet by this process's clock (`leaderUntil`, measured from when
   * that statement was sent, so never later than the real expiry). A
   * watermarker that stops hearing from the server (a dead connection)
   * stops believing it leads before a standby can take the lease. Every
   * publication checks the lease again in the database.
   */
  get isLeader(): boolean {
    return this.leader && this.leaderUntil !== null && Date.now() < this.leaderUntil.getTime();
  }

  /**
   * One step from this process: renew the lease if due (its own
   * statement), run `watermark_step` in a transaction of its own (it
   * publishes and NOTIFYs in that commit), then tell the observer and write
   * the throttled heartbeat. Observations of writers still in flight are
   * kept in the watermark row, so repeated steps (from any process) advance
   * safe_seq even while writers overlap without pause. A lease held by
   * another owner, a pending publication or a sequence found set back are
   * outcomes, not errors; a watermark row held by another session for more
   * than 200 ms is an error (55P03), with nothing written.
   */
  async step(options: StepOptions = {}): Promise<WatermarkProgress> {
    if (this.closed) throw new ClosedError('Watermarker');
    const o = this.options;
    if (!this.leader || Date.now() >= this.renewDueAt) {
      const bounded = { query: (text: string, values?: unknown[]) => boundedQuery(this.pool, o.responseTimeoutMs, 'the watermarker lease', text, values) };
      const claim = await claimOwner(bounded, this.lease, o.owner, this.instance, claimTtlMs(o));
      if (!claim.claimed) {
        this.leader = false;
        this.leaderUntil = null;
        throw ownerInUse(o.owner, claim);
      }
      this.leader = await acquireLease(bounded, this.lease, o.owner, this.instance, o.leaseTtlMs);
      if (this.leader) this.renewDueAt = Date.now() + o.leaseRenewMs;
    }
    const row = await this.stepOnce().catch((err: unknown) => {
      // The fence (55006): another process claimed the owner since this one
      // did. The next step claims again, and is refused.
      if (sqlState(err) === SQLSTATE.objectInUse) {
        this.leader = false;
        this.leaderUntil = null;
      }
      throw err;
    });
    const progress = this.fromRow(row);
    this.emit({ type: 'step', progress: { ...progress } });
    progress.heartbeat = await this.heartbeat(
      { leader: progress.leader, outcome: progress.outcome, safeSeq: progress.safeSeq.toString(), pending: progress.pending },
      options.signal,
    );
    return progress;
  }

  /**
   * Supervises the in-database step loop until `signal` aborts: runs
   * `CALL run_watermarker(...)` on a connection of its own
   * (application_name `tidemark-watermarker`), which steps, commits, renews
   * the lease and sleeps between steps for `summaryIntervalMs`, then returns
   * a summary (passed to the observer as a `run` event); and runs it again.
   * A failed run is reported to `onError` and retried after a back-off
   * doubling from `retryMinMs` to `retryMaxMs`, with jitter. When the lease
   * was lost or released, it waits `leaseRenewMs` before trying for it again,
   * so a standby can take over. On abort it cancels the running loop on the
   * server and resolves (it does not reject). Holds one pooled connection
   * while it runs; call `close()` afterwards to release the lease.
   *
   * Before each run it claims its owner (see `instance`; after a run that
   * ended asleep, as the sleep begins, so a writer's wake-up is answered
   * without that round trip). Another
   * instance's claim refuses it: it waits, and takes the claim over once
   * that expires (the other process died, e.g. this one's predecessor),
   * but rejects with `OwnerInUseError` as soon as it sees the other claim
   * renewed (a live process has the same owner), within `leaseRenewMs`.
   */
  async run(signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('Watermarker');
    const o = this.options;
    const loop = new LoopConnection(this.pool, o, this.instance);
    let failures = 0; // in a row, since the last run that answered
    /**
     * The other process's claim that refused this one: as first seen, and
     * as seen once a run that process's client left behind has surely
     * ended on the server (its deadline, or the 1 s connection check),
     * since such a run still extends the claim.
     */
    let refusedBy: { first: OwnerClaim; settledAt: number; settled?: OwnerClaim } | undefined;
    let inUse: OwnerInUseError | undefined;
    try {
      while (!signal.aborted && !this.closed) {
        let pauseMs = 0;
        try {
          const result = await loop.runOnce(signal);
          if (result.refused) {
            const other = result.refused;
            this.leader = false;
            this.leaderUntil = null;
            if (refusedBy?.first.instance !== other.instance) {
              refusedBy = { first: other, settledAt: performance.now() + o.summaryIntervalMs + 1000 };
            } else if (refusedBy.settled === undefined) {
              if (performance.now() >= refusedBy.settledAt) refusedBy.settled = other;
            } else if (other.expiresAt.getTime() > refusedBy.settled.expiresAt.getTime()) {
              // Renewed since: the other process lives.
              inUse = ownerInUse(o.owner, other);
              break;
            }
            // Until the claim expires, or the other instance has had time to renew it.
            pauseMs = Math.min(o.leaseRenewMs, Math.max(10, other.expiresAt.getTime() - other.now.getTime() + 10));
          } else {
            refusedBy = undefined;
            pauseMs = await this.afterRun(result.summary, loop, signal);
            failures = 0;
          }
        } catch (err) {
          if (signal.aborted) break;
          this.leader = false;
          this.leaderUntil = null;
          failures += 1;
          pauseMs = backoffMs(failures, o.retryMinMs, o.retryMaxMs);
          this.report(err);
          this.emit({ type: 'retry', error: err, delayMs: pauseMs });
        }
        if (pauseMs > 0 && !this.closed) await delay(pauseMs, undefined, { signal }).catch(() => undefined);
      }
    } finally {
      loop.close();
      this.leader = false;
      this.leaderUntil = null;
    }
    // close() came while a run was starting: that run may have claimed the
    // owner and taken the lease after close() gave them up.
    if (this.closed && !inUse) await this.release().catch((err: unknown) => this.report(err));
    if (inUse) throw inUse;
  }

  /** Reports a run, and sleeps after one that ended asleep. Returns the pause before the next run. */
  private async afterRun(summary: WatermarkRunSummary, loop: LoopConnection, signal: AbortSignal): Promise<number> {
    // Asleep, the next run is due this long after the return, whatever the heartbeat takes.
    const wakeBy = performance.now() + this.options.summaryIntervalMs;
    // close() released the lease while this summary was on its way: it no longer holds.
    if (this.closed) Object.assign(summary, { leader: false, leaderUntil: null });
    this.leader = summary.leader;
    this.leaderUntil = summary.leaderUntil;
    this.emit({ type: 'run', summary });
    await this.heartbeat({ leader: summary.leader, reason: summary.reason, safeSeq: summary.safeSeq.toString(), steps: summary.steps }, signal);
    if (summary.reason === 'asleep' && !this.closed) {
      const sleptAt = performance.now();
      const cause = await loop.sleep(signal, wakeBy);
      if (!signal.aborted) this.emit({ type: 'wake', cause, sleptMs: performance.now() - sleptAt });
    }
    return summary.reason === 'released' || summary.reason === 'lease_lost' ? this.options.leaseRenewMs : 0;
  }

  /**
   * Releases the lease (so a standby takes over at once) and refuses further
   * steps. A running `run()` loop takes the release as its stop request: it
   * returns its summary within `pollMaxMs`, and `run()` resolves. Idempotent;
   * does not end the pool.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.leader = false;
    this.leaderUntil = null;
    await this.release();
  }

  /** Gives up this process's claim of the owner and the owner's lease; leaves both when another process claims the owner. */
  private async release(): Promise<void> {
    await boundedQuery(this.pool, this.options.responseTimeoutMs, 'the watermarker lease', this.lease.release, [this.options.owner, this.instance]);
  }

  /**
   * The step in one simple-protocol message: BEGIN, a check that the
   * pooled connection was not inside a transaction already, the step, and
   * COMMIT, run by the server back to back. After an error the connection
   * is rolled back, or destroyed if that fails, and the error is thrown:
   * nothing was published, unless the connection died after the COMMIT (the
   * watermark row then says what was).
   */
  private async stepOnce(): Promise<StepRow & { sentAt: number }> {
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
        `SELECT pg_catalog.set_config('tidemark.instance', ${client.escapeLiteral(this.instance)}, true); ` +
        `SELECT s.*, extract(epoch FROM pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp())::float8 * 1000::float8 AS step_ms, ` +
        `pg_catalog.statement_timestamp() AS received_at ` +
        `FROM ${this.sql.step}(${client.escapeLiteral(o.owner)}, ${o.synchronousCommit}, ${o.tryLockFirst}) s; COMMIT`;
      const sentAt = Date.now();
      // The step waits at most 200 ms for the watermark row, on top of which
      // the server must answer within responseTimeoutMs.
      const results = (await withDeadline(client, 200 + o.responseTimeoutMs, 'the watermark step', () => client.query(text))) as unknown as pg.QueryResult<StepRow>[];
      const row = results[3]!.rows[0]!; // BEGIN, check, instance, step, COMMIT
      return { ...row, sentAt };
    } catch (err) {
      await client.query('ROLLBACK').catch((rollbackErr: Error) => (broken = rollbackErr));
      throw err;
    } finally {
      client.off('error', ignore);
      client.release(broken);
    }
  }

  private fromRow(row: StepRow & { sentAt: number }): WatermarkProgress {
    this.leader = row.outcome !== 'not_leader' && !this.closed;
    this.leaderUntil = leaderUntil(this.leader, row.lease_expires_at, row.received_at, row.sentAt);
    return {
      outcome: row.outcome,
      advanced: row.outcome === 'advanced',
      safeSeq: BigInt(row.safe_seq),
      priorSeq: BigInt(row.prior_seq),
      lastSeq: row.last_seq === null ? null : BigInt(row.last_seq),
      holders: row.holders,
      holderPath: row.holder_path,
      holderReadMs: row.holder_read_us === null ? null : row.holder_read_us / 1000,
      pending: row.pending,
      oldestPendingAt: row.oldest_pending_at,
      stepMs: Math.round(row.step_ms * 1000) / 1000, // microseconds: the server's float arithmetic adds noise below them
      leader: this.leader,
      leaseOwner: row.lease_owner,
      leaseExpiresAt: row.lease_expires_at,
      leaderUntil: this.leaderUntil,
      heartbeat: 'throttled',
    };
  }

  private emit(event: WatermarkerEvent): void {
    notifyObserver(this.options.observer, event, this.options.onError);
  }

  private async heartbeat(details: Record<string, unknown>, signal?: AbortSignal): Promise<HeartbeatOutcome> {
    const o = this.options;
    if (Date.now() - this.lastBeatAt < o.heartbeatIntervalMs) return 'throttled';
    if (signal?.aborted) return 'cancelled';
    this.lastBeatAt = Date.now();
    try {
      await cancellableQuery(this.pool, this.sql.beat, [o.owner, details, o.heartbeatTimeoutMs], signal, o.heartbeatTimeoutMs + o.responseTimeoutMs);
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

/** This process's instance id (docs/PROTOCOL.md section 4, "Owner claim"). */
const PROCESS_INSTANCE = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;

function ownerInUse(owner: string, claim: OwnerClaim): OwnerInUseError {
  return new OwnerInUseError(owner, claim.instance, claim.claimedAt, claim.expiresAt);
}

const OPEN_TRANSACTION_CHECK =
  `DO $$ BEGIN IF pg_catalog.transaction_timestamp() <> pg_catalog.statement_timestamp() THEN ` +
  `RAISE EXCEPTION 'tidemark watermarker: its pooled connection was inside a transaction already; rolling it back' USING ERRCODE = '25001'; ` +
  `END IF; END $$`;
