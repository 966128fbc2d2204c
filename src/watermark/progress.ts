/**
 * What a watermark step did.
 * - `advanced`: published a higher safe_seq.
 * - `pending`: events above safe_seq wait for writers still in flight (the
 *   step remembered what it saw; a later step publishes once they end).
 * - `idle`: nothing was drawn above safe_seq; no lock read, nothing written.
 * - `rewound`: the identity sequence was set back since an earlier step
 *   (setval, RESTART): the remembered observations were dropped and nothing
 *   was published. Someone rewound it; see docs/PROTOCOL.md §5.
 * - `not_leader`: another owner holds the lease; this instance is a standby.
 */
export type StepOutcome = 'advanced' | 'pending' | 'idle' | 'rewound' | 'not_leader';

/**
 * How a step learned which writers are in flight: `try_lock` (an exclusive
 * try-lock, released at once, proved there are none) or `pg_locks`.
 */
export type HolderPath = 'try_lock' | 'pg_locks';

/** What happened to the durable heartbeat after a step's commit. */
export type HeartbeatOutcome = 'written' | 'throttled' | 'failed' | 'cancelled';

/** The result of one {@link Watermarker.step}. */
export interface WatermarkProgress {
  /** What the step did. */
  outcome: StepOutcome;
  /** True when this step published a higher safe_seq. */
  advanced: boolean;
  /** safe_seq after the step (the watermark row's value). */
  safeSeq: bigint;
  /** safe_seq before the step. */
  priorSeq: bigint;
  /**
   * The identity's last value the step read (S), or null when it did not
   * look (`not_leader`). While the sequence has handed out no number since
   * it was last set (`ALTER SEQUENCE ... RESTART`, `setval(..., false)`),
   * the highest value a step saw before.
   */
  lastSeq: bigint | null;
  /** Writers holding the shared fence at this step, or null when the step did not look. */
  holders: number | null;
  /** How the holders were learned, or null when the step did not need them. */
  holderPath: HolderPath | null;
  /** How long the pg_locks read took, on the server, when the step read it. */
  holderReadMs: number | null;
  /** Remembered observations still waiting for their writers after this step. */
  pending: number;
  /** When the oldest of them was taken (null when none waits). */
  oldestPendingAt: Date | null;
  /** Time of the step's statement, measured on the server, in milliseconds. */
  stepMs: number;
  /** This instance holds the lease. */
  leader: boolean;
  /** The lease holder as last seen. */
  leaseOwner: string | null;
  /** When the lease expires, by the database clock (null when nobody holds it). */
  leaseExpiresAt: Date | null;
  /**
   * Until when, by this process's clock, this instance may act as the lease
   * holder (null when it is not the leader): the instant the statement was
   * sent plus the lease's remaining time as the server saw it on receipt,
   * so never later than the lease's real expiry.
   */
  leaderUntil: Date | null;
  /** What happened to the durable heartbeat after this step. */
  heartbeat: HeartbeatOutcome;
}

/**
 * Why one run of the in-database loop (`CALL run_watermarker`) returned:
 * `timeout` (it ran its allotted time and is called again), `standby`
 * (another owner held the lease all along), `released` (the lease was
 * released: the stop request), `lease_lost` (another owner took it),
 * `asleep` (idle: it waits for a writer's wake-up, docs/PROTOCOL.md §3.13).
 */
export type RunEndReason = 'timeout' | 'standby' | 'released' | 'lease_lost' | 'asleep';

/**
 * How a sleep of the loop ended: `notified` (a writer's wake-up), `timeout`
 * (`summaryIntervalMs` after the run returned, without one), `closed` (the
 * loop's connection ended; the next run reconnects).
 */
export type WakeCause = 'notified' | 'timeout' | 'closed';

/** The summary of one run of the in-database loop, as {@link Watermarker.run} receives it. */
export interface WatermarkRunSummary {
  /** Why the run returned. */
  reason: RunEndReason;
  /** Steps taken, and how many ended in each outcome. */
  steps: number;
  /** Looks at the sequence that found nothing to step for (no step, no commit). */
  polls: number;
  advanced: number;
  pending: number;
  idle: number;
  /** Steps that learned the in-flight writers by the try-lock, and by reading pg_locks. */
  tryLockReads: number;
  pgLocksReads: number;
  /** Server time of those pg_locks reads, in milliseconds. */
  pgLocksReadMsTotal: number;
  /** Server time of the steps (each from its start to its COMMIT), in milliseconds. */
  stepMsTotal: number;
  stepMsMax: number;
  /** Step times as log buckets: `stepHistogram[i]` counts steps of t microseconds with floor(20 ln t) = i. */
  stepHistogram: number[];
  /** safe_seq when the run returned. */
  safeSeq: bigint;
  /** This instance held the lease when the run returned. */
  leader: boolean;
  leaseOwner: string | null;
  leaseExpiresAt: Date | null;
  /** Until when, by this process's clock, this instance may act as the lease holder (null when not leader); see {@link WatermarkProgress.leaderUntil}. */
  leaderUntil: Date | null;
  /** When the oldest observation still waiting for writers was taken (null when none waits). */
  oldestPendingAt: Date | null;
  /** Wall time of the run, measured by the client, in milliseconds. */
  elapsedMs: number;
}

/**
 * What a {@link Watermarker} reports to its `observer`:
 * - `step`: one `step()` finished (after its commit);
 * - `run`: one run of the in-database loop returned its summary;
 * - `retry`: the loop failed (`error`, also passed to `onError`) and runs again after `delayMs`;
 * - `wake`: the loop, asleep after a run that ended `asleep`, runs again: woken by a writer, or after `summaryIntervalMs`.
 */
export type WatermarkerEvent =
  | { type: 'step'; progress: WatermarkProgress }
  | { type: 'run'; summary: WatermarkRunSummary }
  | { type: 'retry'; error: unknown; delayMs: number }
  | { type: 'wake'; cause: WakeCause; sleptMs: number };

/** The lower bound, in milliseconds, of step histogram bucket `i` (see {@link WatermarkRunSummary.stepHistogram}). */
export function stepBucketLowerMs(i: number): number {
  return i === 0 ? 0 : Math.exp(i / 20) / 1000;
}

/** A representative time, in milliseconds, for step histogram bucket `i`: its geometric middle. */
export function stepBucketMs(i: number): number {
  return Math.exp((i + 0.5) / 20) / 1000;
}
