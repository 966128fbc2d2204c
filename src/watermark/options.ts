import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, integerOption, ownerOption, retryOptions } from '../options.js';
import type { WatermarkerEvent } from './progress.js';

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
  /** Delay between steps while events flow. Default 1. */
  pollMinMs?: number;
  /** Cap of the idle back-off (the delay doubles on each idle step), and of the delay while writers hold safe_seq back. Default 100. */
  pollMaxMs?: number;
  /**
   * After a publication, idle steps keep the `pollMinMs` cadence for this
   * long before backing off, so sparse traffic is not published at the
   * back-off cap. Default 1000.
   */
  idleGraceMs?: number;
  /**
   * At most this many steps a second on average (bursts of 10). When events
   * flow faster, each step publishes more of them: the loop's CPU use stays
   * bounded, and the delay it adds stays below 1000 / maxStepsPerSecond ms.
   * Looks at the sequence between steps (`pollMinMs`) cost far less. Default 100.
   */
  maxStepsPerSecond?: number;
  /**
   * How long each run of the in-database loop (`CALL run_watermarker`)
   * lasts before it returns its summary to `run()`: how fresh metrics and
   * health are. At most `leaseRenewMs`. Default 1000 (or `leaseRenewMs`, if lower).
   */
  summaryIntervalMs?: number;
  /**
   * Learn that no writer is in flight from an exclusive try-lock, released
   * in the same expression, before reading pg_locks (which briefly holds
   * every lock-manager partition). A granted try-lock makes writers that
   * arrive in those microseconds wait for them. Default true.
   */
  tryLockFirst?: boolean;
  /** First delay before `run()` runs the loop again after a failure; it doubles, with jitter, up to `retryMaxMs`. Default 100. */
  retryMinMs?: number;
  /** Cap of the retry delay. Default 5000. */
  retryMaxMs?: number;
  /**
   * How long a statement of the watermarker's may go unanswered beyond its
   * own bound before its connection is treated as dead, destroyed and the
   * loop retried: the loop's `CALL` gets `summaryIntervalMs +
   * responseTimeoutMs`, the lease, step and heartbeat statements
   * `responseTimeoutMs` (plus their lock waits). Default 10000.
   */
  responseTimeoutMs?: number;
  /** Minimum interval between durable heartbeats. Default 1000. */
  heartbeatIntervalMs?: number;
  /** Bound on the heartbeat's wait for its row lock. Default 5000. */
  heartbeatTimeoutMs?: number;
  /**
   * Commit publications with `synchronous_commit = on`. Default false: a
   * publication lost in a crash only hides events (docs/PROTOCOL.md,
   * "Asynchronous commit of the publication").
   */
  synchronousCommit?: boolean;
  /** Receives each `step()` result, each loop summary, and each retry. Errors it throws go to `onError`. */
  observer?: (event: WatermarkerEvent) => void;
  /** Receives errors that do not stop the watermarker: failed loop runs (retried), heartbeat and observer errors. */
  onError?: (err: unknown) => void;
}

/** Resolved, validated and frozen watermarker options. */
export type ResolvedWatermarkerOptions = Readonly<
  Required<Omit<WatermarkerOptions, 'observer' | 'onError'>> & Pick<WatermarkerOptions, 'observer' | 'onError'>
>;

/** Options of earlier versions, refused with the reason they went away (the CLI refuses their flags with it too). */
export const REMOVED_WATERMARKER_OPTIONS: Readonly<Record<string, string>> = {
  lockTimeoutMs: 'the watermark step no longer waits for the fence; it observes the writers in flight instead (docs/PROTOCOL.md §3)',
  lockTimeoutMaxMs: 'the watermark step no longer waits for the fence, so there is no wait to escalate (docs/PROTOCOL.md §3)',
  fenceTryLimit: 'the watermark step no longer takes the exclusive fence, so there are no try-lock misses to count (docs/PROTOCOL.md §3)',
};

const KNOWN = new Set<string>([
  'schema',
  'owner',
  'leaseTtlMs',
  'leaseRenewMs',
  'pollMinMs',
  'pollMaxMs',
  'idleGraceMs',
  'summaryIntervalMs',
  'maxStepsPerSecond',
  'tryLockFirst',
  'retryMinMs',
  'retryMaxMs',
  'responseTimeoutMs',
  'heartbeatIntervalMs',
  'heartbeatTimeoutMs',
  'synchronousCommit',
  'observer',
  'onError',
]);

/** Every watermarker duration is at most a day unless stated. */
const DAY = 86_400_000;

function booleanOption(options: WatermarkerOptions, name: 'tryLockFirst' | 'synchronousCommit', fallback: boolean): boolean {
  const value = options[name] ?? fallback;
  if (typeof value !== 'boolean') throw new InvalidOptionsError(name, `expected a boolean, got ${JSON.stringify(value)}`);
  return value;
}

/** Applies defaults and validates; throws {@link InvalidOptionsError} naming the first bad option. */
export function resolveWatermarkerOptions(options: WatermarkerOptions = {}): ResolvedWatermarkerOptions {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidOptionsError('options', 'expected an object');
  }
  for (const name of Object.keys(options)) {
    if (name in REMOVED_WATERMARKER_OPTIONS) throw new InvalidOptionsError(name, `was removed: ${REMOVED_WATERMARKER_OPTIONS[name]}`);
    if (!KNOWN.has(name)) throw new InvalidOptionsError(name, `is not a Watermarker option (known: ${[...KNOWN].join(', ')})`);
  }
  const schema = validateSchema(options.schema ?? DEFAULT_SCHEMA);
  const owner = ownerOption(options.owner);
  const leaseTtlMs = integerOption(options, 'leaseTtlMs', 10_000, 20, DAY);
  const leaseRenewMs = integerOption(options, 'leaseRenewMs', Math.floor(leaseTtlMs / 3), 1, DAY);
  if (leaseRenewMs * 2 >= leaseTtlMs) {
    throw new InvalidOptionsError('leaseRenewMs', `must be below half of leaseTtlMs (${leaseTtlMs}), got ${leaseRenewMs}`);
  }
  const pollMinMs = integerOption(options, 'pollMinMs', 1, 1, 60_000);
  const pollMaxMs = integerOption(options, 'pollMaxMs', Math.max(100, pollMinMs), 1, 60_000);
  if (pollMaxMs < pollMinMs) {
    throw new InvalidOptionsError('pollMaxMs', `must be at least pollMinMs (${pollMinMs}), got ${pollMaxMs}`);
  }
  // A run must return (and so be retried, or its summary seen) well within the lease.
  const summaryIntervalMs = integerOption(options, 'summaryIntervalMs', Math.min(1000, leaseRenewMs), 1, DAY);
  if (summaryIntervalMs > leaseRenewMs) {
    throw new InvalidOptionsError('summaryIntervalMs', `must not exceed leaseRenewMs (${leaseRenewMs}), got ${summaryIntervalMs}`);
  }
  const { retryMinMs, retryMaxMs } = retryOptions(options, { minMs: 100, maxMs: (min) => Math.max(5000, min) }, DAY);
  checkCallbacks(options);
  return Object.freeze({
    schema,
    owner,
    leaseTtlMs,
    leaseRenewMs,
    pollMinMs,
    pollMaxMs,
    idleGraceMs: integerOption(options, 'idleGraceMs', 1000, 0, DAY),
    summaryIntervalMs,
    maxStepsPerSecond: integerOption(options, 'maxStepsPerSecond', 100, 1, 100_000),
    tryLockFirst: booleanOption(options, 'tryLockFirst', true),
    retryMinMs,
    retryMaxMs,
    responseTimeoutMs: integerOption(options, 'responseTimeoutMs', 10_000, 1, DAY),
    heartbeatIntervalMs: integerOption(options, 'heartbeatIntervalMs', 1000, 0, DAY),
    heartbeatTimeoutMs: integerOption(options, 'heartbeatTimeoutMs', 5000, 1, 600_000),
    synchronousCommit: booleanOption(options, 'synchronousCommit', false),
    observer: options.observer,
    onError: options.onError,
  });
}
