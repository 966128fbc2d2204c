import type pg from 'pg';
import { quoteIdent, wakeChannel } from '../db/queryable.js';
import { cancelBackend } from '../db/cancellable.js';
import { withDeadline } from '../db/deadline.js';
import type { ResolvedWatermarkerOptions } from './options.js';
import { claimOwner, claimTtlMs, leaseSql, type LeaseSql, type OwnerClaim } from './lease.js';
import type { RunEndReason, WakeCause, WatermarkRunSummary } from './progress.js';

/** The application_name of the loop's connection, so operators can find it in pg_stat_activity. */
export const LOOP_APPLICATION_NAME = 'tidemark-watermarker';

/** lock_timeout of the loop's session: the longest a run waits for a row lock (the lease renewal's). */
const LOOP_LOCK_TIMEOUT_MS = 5000;

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

/** What one `runOnce` did: ran the loop, or was refused by another instance's live claim of the owner. */
export type RunOnceResult = { summary: WatermarkRunSummary; refused?: undefined } | { summary?: undefined; refused: OwnerClaim };

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
  private readonly call: (client: pg.PoolClient, resume: boolean) => string;
  private readonly channel: string;
  private readonly lease: LeaseSql;
  /** A writer's wake-up arrived since the last run began. */
  private woken = false;
  /** Ends a `sleep()` under way, saying why. */
  private wake: ((cause: WakeCause) => void) | undefined;
  /** The last run ended asleep: the next one resumes its lease. */
  private asleep = false;
  /**
   * The owner's claim, made while the loop slept (`sleep`), for the run
   * that follows: the run a writer wakes starts without that round trip.
   * Or its error: the next run fails with it.
   */
  private claimedAhead: { claim: OwnerClaim; sentAt: number; at: number } | { failed: unknown } | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly options: ResolvedWatermarkerOptions,
    /** This process's instance id: it claims the owner before each run. */
    private readonly instance: string,
  ) {
    const o = options;
    this.channel = wakeChannel(o.schema);
    this.lease = leaseSql(o.schema);
    this.call = (client, resume) =>
      `CALL ${quoteIdent(o.schema)}.run_watermarker(p_owner => ${client.escapeLiteral(o.owner)}, ` +
      `p_run_ms => ${o.summaryIntervalMs}, p_lease_ttl_ms => ${o.leaseTtlMs}, p_lease_renew_ms => ${o.leaseRenewMs}, ` +
      `p_poll_min_ms => ${o.pollMinMs}, p_poll_max_ms => ${o.pollMaxMs}, p_idle_grace_ms => ${o.idleGraceMs}, ` +
      `p_synchronous_commit => ${o.synchronousCommit}, p_try_lock => ${o.tryLockFirst}, p_max_steps_per_second => ${o.maxStepsPerSecond}, ` +
      `p_sleep => true, p_resume => ${resume})`;
  }

  /**
   * Claims the owner (or renews the claim), then runs the loop once; on
   * abort, cancels it on the server. Resolves with its summary, or with
   * the claim of another live instance that refused this one (nothing
   * run). A run that does not answer within `summaryIntervalMs +
   * responseTimeoutMs` has its connection destroyed (`NoResponseError`).
   */
  async runOnce(signal: AbortSignal): Promise<RunOnceResult> {
    signal.throwIfAborted();
    const o = this.options;
    const client = this.client ?? (await this.open());
    let cancelling: Promise<void> | undefined;
    const onAbort = () => {
      cancelling = this.cancel(client);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    const started = performance.now();
    try {
      // The owner's claim, renewed before every run (and by the run's lease
      // renewals): refused, nothing runs. Were it to lapse all the same (a
      // run stalled past it), the fence refuses this session's writes once
      // another process has claimed the owner. (A procedure that commits
      // cannot share a message with another statement, hence a statement
      // of its own, one round trip.) A run after a sleep uses the claim
      // made as the sleep began, no older than one run: answered, a claim
      // has at least three quarters of its TTL (leaseTtlMs +
      // summaryIntervalMs) left, and summaryIntervalMs is below half of
      // leaseTtlMs, so it outlives this run as well. Older (a process that
      // stalled, a host suspended), it is made again.
      const ahead = this.claimedAhead;
      this.claimedAhead = undefined;
      if (ahead && 'failed' in ahead) throw ahead.failed;
      // Young by both clocks: the wall clock also counts a suspended host.
      const fresh = ahead !== undefined && performance.now() - ahead.at <= o.summaryIntervalMs && Date.now() - ahead.sentAt <= o.summaryIntervalMs;
      const { claim, sentAt } = fresh ? ahead : await this.claim(client);
      if (!claim.claimed) return { refused: claim };
      // Wake-ups that arrived before now are answered by this run's own
      // looks; those that arrive during it are delivered when it returns.
      this.woken = false;
      const resume = this.asleep;
      this.asleep = false;
      // A run may also wait up to the session's lock_timeout (5 s) for the watermark row (an operator's lock).
      const result = await withDeadline(client, o.summaryIntervalMs + LOOP_LOCK_TIMEOUT_MS + o.responseTimeoutMs, 'the watermark loop', () =>
        client.query<RunRow>(this.call(client, resume)),
      );
      const row = result.rows[0]!;
      this.asleep = row.reason === 'asleep';
      return { summary: toSummary(row, performance.now() - started, leaderUntil(row.leader, row.lease_expires_at, claim.now, sentAt)) };
    } catch (err) {
      this.destroy(err);
      throw err;
    } finally {
      signal.removeEventListener('abort', onAbort);
      if (cancelling) await cancelling;
    }
  }

  /**
   * After a run that ended `asleep`: waits for a writer's wake-up (a
   * NOTIFY on the wake channel, docs/PROTOCOL.md §3.13) until `untilMs`
   * (a `performance.now()` instant: the run's return plus
   * `summaryIntervalMs`, within the instant the run armed), then returns
   * how the sleep ended. A wake-up that arrived while the run was
   * returning ends it at once; so do the connection's end (the next run
   * fails and is retried) and `signal`.
   */
  async sleep(signal: AbortSignal, untilMs: number): Promise<WakeCause> {
    const ended = (): WakeCause | undefined =>
      this.woken ? 'notified' : this.client === undefined ? 'closed' : signal.aborted || performance.now() >= untilMs ? 'timeout' : undefined;
    const before = ended();
    if (before) return before;
    // The next run's claim, now: idle time, not the woken run's. A claim
    // that fails ends the sleep: the next run throws its error (reported,
    // then retried after a back-off on a new connection), instead of
    // sleeping on a connection that may be gone.
    const client = this.client!;
    const onAbort = () => void this.cancel(client);
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      this.claimedAhead = { ...(await this.claim(client)), at: performance.now() };
    } catch (err) {
      this.claimedAhead = { failed: err };
      return 'closed';
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
    const after = ended();
    if (after) return after;
    return new Promise<WakeCause>((resolve) => {
      const finish = (cause: WakeCause) => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        this.wake = undefined;
        resolve(cause);
      };
      const onAbort = () => finish('timeout');
      const timer = setTimeout(() => finish('timeout'), untilMs - performance.now());
      signal.addEventListener('abort', onAbort, { once: true });
      this.wake = finish;
    });
  }

  /** Ends the session (destroying the connection). Idempotent. */
  close(): void {
    this.destroy(new Error('tidemark watermarker loop closed'));
  }

  /**
   * Claims the owner (or renews the claim). The statement pairs a server
   * instant with a local one that precedes it: the lease's expiry measured
   * from that server instant, added to the local one, can only undershoot
   * the real expiry.
   */
  private async claim(client: pg.PoolClient): Promise<{ claim: OwnerClaim; sentAt: number }> {
    const sentAt = Date.now();
    const claim = await withDeadline(client, this.options.responseTimeoutMs, 'the watermark loop', () =>
      claimOwner(client, this.lease, this.options.owner, this.instance, claimTtlMs(this.options)),
    );
    return { claim, sentAt };
  }

  /** Cancels what runs on the loop's connection `client`, from another connection. */
  private cancel(client: pg.PoolClient): Promise<void> {
    return cancelBackend(this.pool, (client as unknown as { processID: number }).processID);
  }

  private async open(): Promise<pg.PoolClient> {
    const client = await this.pool.connect();
    // A terminated backend also emits 'error' on the client; the query's own
    // rejection carries it. A sleep ends with the connection.
    client.on('error', () => this.wake?.('closed'));
    client.on('end', () => this.wake?.('closed'));
    client.on('notification', (message) => {
      if (message.channel !== this.channel) return;
      this.woken = true;
      this.wake?.('notified');
    });
    try {
      // client_connection_check_interval (PostgreSQL 14+): a run whose client
      // is gone (its socket closed, or timed out by keepalive) ends within a
      // second instead of renewing the lease to the end of the run.
      await withDeadline(client, this.options.responseTimeoutMs, 'the watermark loop', () =>
        client.query(
          `SET application_name = '${LOOP_APPLICATION_NAME}'; SET default_transaction_isolation = 'read committed'; ` +
            `SET statement_timeout = ${this.options.summaryIntervalMs + 30_000}; SET lock_timeout = ${LOOP_LOCK_TIMEOUT_MS}; ` +
            // Names this process to the owner-claim fence: its writes of the watermark row fail while another live process claims the owner.
            `SELECT pg_catalog.set_config('tidemark.instance', ${client.escapeLiteral(this.instance)}, false); ` +
            `SELECT pg_catalog.set_config('client_connection_check_interval', '1000', false) ` +
            `WHERE pg_catalog.current_setting('server_version_num')::int >= 140000; ` +
            `LISTEN ${quoteIdent(this.channel)}`,
        ),
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
    this.asleep = false;
    this.claimedAhead = undefined;
    this.wake?.('closed');
    client?.release(err instanceof Error ? err : new Error(String(err)));
  }
}

/**
 * Until when this process may act as the lease holder: `sentAt` (local)
 * plus the lease's expiry measured from `serverAt`, a server instant that
 * came after `sentAt` (the receipt of a statement sent then). So never
 * later than the lease's real expiry (clock rates aside). Null when not
 * the leader.
 */
export function leaderUntil(leader: boolean, expiresAt: Date | null, serverAt: Date, sentAt: number): Date | null {
  if (!leader || expiresAt === null) return null;
  return new Date(sentAt + (expiresAt.getTime() - serverAt.getTime()));
}

function toSummary(row: RunRow, elapsedMs: number, until: Date | null): WatermarkRunSummary {
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
    leaderUntil: until,
    oldestPendingAt: row.oldest_pending_at,
    elapsedMs,
  };
}
