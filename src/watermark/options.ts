import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, integerOption, ownerOption } from '../options.js';
import type { WatermarkProgress } from './progress.js';

/** Options for {@link Watermarker}. Every duration is in milliseconds. */
export interface WatermarkerOptions {
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /** Lease owner name; unique per process. Default `<hostname>:<pid>:<random>`. */
  owner?: string;
  /** How long a lease lasts without renewal; a standby takes over after it. Default 10000. */
  leaseTtlMs?: number;
  /** How often the active watermarker renews its lease; below half of `leaseTtlMs`. Default `leaseTtlMs / 3`. */
  leaseRenewMs?: number;
  /**
   * Bound on the first blocking wait for the exclusive fence (`lock_timeout`),
   * and on the publishing UPDATE's wait for the watermark row. Default 5:
   * long enough for short writers holding the fence to commit. New writers
   * queue behind a waiting step, so each wait can hold them back for up to
   * its bound: this value at first, doubling (see `lockTimeoutMaxMs`) while
   * waits time out behind longer writers (bench: `npx tidemark bench --only
   * e2e-latency,writer-latency`).
   */
  lockTimeoutMs?: number;
  /**
   * Cap of the bounded wait, which doubles after each wait that timed out
   * and halves after each publication (never below `lockTimeoutMs`). While
   * writers overlap without pause, a wait succeeds once it outlasts the
   * writers already holding the fence; so safe_seq keeps advancing as long
   * as writer transactions are shorter than this. The price: one wait can
   * keep new writers waiting for up to this long. Waits that time out at
   * the cap are spaced up to 1024 misses apart. At most
   * `leaseTtlMs - leaseRenewMs`. Default 2000 (or that bound, if lower).
   */
  lockTimeoutMaxMs?: number;
  /**
   * Consecutive try-lock misses before a step waits (bounded by
   * `lockTimeoutMs`, escalating to `lockTimeoutMaxMs`) for the fence. Try-locks never queue ahead of writers;
   * the bounded wait guarantees progress under constant writer overlap.
   * After a wait times out, the number of misses before the next wait
   * doubles (capped at 64, or 1024 once waits time out at
   * `lockTimeoutMaxMs`) until a step is not busy, so one long writer does
   * not make every new writer queue again and again. 0 means a busy step
   * waits at once (after its own try-lock). Default 0: with writers
   * overlapping, a free instant is rare and waiting right away publishes
   * sooner (commit -> handler p50 halved in the bench), at the cost of new
   * writers queuing behind more waits (each up to its current bound).
   */
  fenceTryLimit?: number;
  /** Delay between steps while events flow. Default 5. */
  pollMinMs?: number;
  /** Cap of the idle back-off (the delay doubles on each idle step). Default 100. */
  pollMaxMs?: number;
  /**
   * After a publication, idle steps keep the `pollMinMs` cadence for this
   * long before backing off, so sparse traffic (an event every few
   * milliseconds) is not published at the back-off cap. Default 1000.
   */
  idleGraceMs?: number;
  /** Minimum interval between durable heartbeats. Default 1000. */
  heartbeatIntervalMs?: number;
  /** Bound on the heartbeat's wait for its row lock. Default 5000. */
  heartbeatTimeoutMs?: number;
  /**
   * Commit the fenced transaction with `synchronous_commit = on`. Default
   * false: the fence is released without waiting for the WAL flush, which is
   * safe (docs/PROTOCOL.md, "Asynchronous commit of the publication").
   */
  synchronousCommit?: boolean;
  /** Called after every step, after commit, with the step's progress. Errors it throws are reported to `onError` and otherwise ignored. */
  observer?: (progress: WatermarkProgress) => void;
  /** Receives errors that do not stop the loop: step failures in `run`, heartbeat, notify and observer errors. */
  onError?: (err: unknown) => void;
}

/** Resolved, validated and frozen watermarker options. */
export type ResolvedWatermarkerOptions = Readonly<
  Required<Omit<WatermarkerOptions, 'observer' | 'onError'>> & Pick<WatermarkerOptions, 'observer' | 'onError'>
>;

/** Every watermarker duration is at most a day unless stated. */
const DAY = 86_400_000;

/** Applies defaults and validates; throws {@link InvalidOptionsError} naming the first bad option. */
export function resolveWatermarkerOptions(options: WatermarkerOptions = {}): ResolvedWatermarkerOptions {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidOptionsError('options', 'expected an object');
  }
  const schema = validateSchema(options.schema ?? DEFAULT_SCHEMA);
  const owner = ownerOption(options.owner);
  const leaseTtlMs = integerOption(options, 'leaseTtlMs', 10_000, 20, DAY);
  const leaseRenewMs = integerOption(options, 'leaseRenewMs', Math.floor(leaseTtlMs / 3), 1, DAY);
  if (leaseRenewMs * 2 >= leaseTtlMs) {
    throw new InvalidOptionsError('leaseRenewMs', `must be below half of leaseTtlMs (${leaseTtlMs}), got ${leaseRenewMs}`);
  }
  const lockTimeoutMs = integerOption(options, 'lockTimeoutMs', 5, 1, 60_000);
  // A wait must end while the lease is still valid: it can start up to
  // leaseRenewMs after the last renewal, and the lease lasts leaseTtlMs.
  const leaseRoom = leaseTtlMs - leaseRenewMs;
  const lockTimeoutMaxMs = integerOption(options, 'lockTimeoutMaxMs', Math.max(lockTimeoutMs, Math.min(2000, leaseRoom)), 1, 600_000);
  if (lockTimeoutMaxMs < lockTimeoutMs) {
    throw new InvalidOptionsError('lockTimeoutMaxMs', `must be at least lockTimeoutMs (${lockTimeoutMs}), got ${lockTimeoutMaxMs}`);
  }
  if (options.lockTimeoutMaxMs !== undefined && lockTimeoutMaxMs > leaseRoom) {
    throw new InvalidOptionsError(
      'lockTimeoutMaxMs',
      `must not exceed leaseTtlMs - leaseRenewMs (${leaseRoom}), or a long wait outlives the lease; got ${lockTimeoutMaxMs}`,
    );
  }
  const pollMinMs = integerOption(options, 'pollMinMs', 5, 0, DAY);
  const pollMaxMs = integerOption(options, 'pollMaxMs', 100, 0, DAY);
  if (pollMaxMs < pollMinMs) {
    throw new InvalidOptionsError('pollMaxMs', `must be at least pollMinMs (${pollMinMs}), got ${pollMaxMs}`);
  }
  checkCallbacks(options);
  if (options.synchronousCommit !== undefined && typeof options.synchronousCommit !== 'boolean') {
    throw new InvalidOptionsError('synchronousCommit', 'expected a boolean');
  }
  return Object.freeze({
    schema,
    owner,
    leaseTtlMs,
    leaseRenewMs,
    lockTimeoutMs,
    lockTimeoutMaxMs,
    fenceTryLimit: integerOption(options, 'fenceTryLimit', 0, 0, 1_000_000),
    pollMinMs,
    pollMaxMs,
    idleGraceMs: integerOption(options, 'idleGraceMs', 1000, 0, DAY),
    heartbeatIntervalMs: integerOption(options, 'heartbeatIntervalMs', 1000, 0, DAY),
    heartbeatTimeoutMs: integerOption(options, 'heartbeatTimeoutMs', 5000, 1, 600_000),
    synchronousCommit: options.synchronousCommit ?? false,
    observer: options.observer,
    onError: options.onError,
  });
}
