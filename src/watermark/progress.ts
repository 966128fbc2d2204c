/**
 * What a watermark step did.
 * - `advanced`: published a higher safe_seq.
 * - `idle`: nothing committed above safe_seq; the fence was not touched.
 * - `fence_busy`: writers held the fence (a try-lock missed, or a bounded
 *   wait timed out); retry later. Never an error.
 * - `row_locked`: the fence was taken, but another session held the
 *   watermark row for longer than `lockTimeoutMs`; nothing was published
 *   and the error went to `onError`. Retry later.
 * - `not_leader`: another owner holds the lease; this instance is a standby.
 */
export type StepOutcome = 'advanced' | 'idle' | 'fence_busy' | 'row_locked' | 'not_leader';

/** What happened to the durable heartbeat after a step's commit. */
export type HeartbeatOutcome = 'written' | 'throttled' | 'failed' | 'cancelled';

/** The result of one {@link Watermarker.step}; also passed to the observer. */
export interface WatermarkProgress {
  /** What the step did. */
  outcome: StepOutcome;
  /** True when this step published a higher safe_seq. */
  advanced: boolean;
  /** safe_seq after the step, as last seen by this instance. */
  safeSeq: bigint;
  /** safe_seq before the step. */
  priorSeq: bigint;
  /** The highest committed seq the step saw, or null if it did not look. */
  maxSeq: bigint | null;
  /** True when this step waited for the fence (after `fenceTryLimit` misses). */
  blocking: boolean;
  /** True when the bounded wait for the fence timed out. */
  fenceTimedOut: boolean;
  /** The bound of this step's wait for the fence (its lock_timeout, escalating from `lockTimeoutMs` to `lockTimeoutMaxMs`), or null when it did not wait. */
  fenceWaitLimitMs: number | null;
  /** Time spent acquiring the exclusive fence, measured on the server. */
  fenceWaitMs: number;
  /** Time the exclusive fence was held before commit, measured on the server. */
  fenceHoldMs: number;
  /** This instance holds the lease. */
  leader: boolean;
  /** The lease holder and expiry as last seen. */
  leaseOwner: string | null;
  /** When the lease expires, by the database clock (null when nobody holds it). */
  leaseExpiresAt: Date | null;
  /** What happened to the durable heartbeat after this step. */
  heartbeat: HeartbeatOutcome;
}
