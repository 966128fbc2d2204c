import { InvalidOptionsError, type HandlerError } from '../errors.js';
import type { Handler } from './events.js';
import { checkKnownOptions } from '../options.js';

/**
 * What a tail or drain does when a handler throws. The page rolls back, as
 * always; then the events before the failing one are delivered again and
 * committed, and the failing event is tried again alone after a back-off,
 * up to `maxAttempts` tries in all. After the last, `onExhausted` decides.
 */
export interface FailurePolicy {
  /** Tries of one event in all, the first included. Default 1: the first failure decides. */
  maxAttempts?: number;
  /** Back-off before the second try; it doubles with each try, with jitter (half to all of it), up to `backoffMaxMs`. Default 100. */
  backoffMinMs?: number;
  /** Cap of the back-off. Default 10000. */
  backoffMaxMs?: number;
  /**
   * After the last try: `'stop'` (default) ends the tail with the
   * `HandlerError`, the event not delivered; `'dead-letter'` records the
   * event as a dead letter of the consumer (its fields, the tries and the
   * last error) in the transaction that moves the cursor past it, and goes
   * on. Later events of the same key are then no longer behind it.
   */
  onExhausted?: 'stop' | 'dead-letter';
}

export type ResolvedFailurePolicy = Readonly<Required<FailurePolicy>>;

const HOUR = 3_600_000;
const KNOWN = { maxAttempts: true, backoffMinMs: true, backoffMaxMs: true, onExhausted: true } satisfies Record<keyof FailurePolicy, true>;

/** Defaults applied and checked; {@link InvalidOptionsError} names the first bad field as `failures.<field>`. */
export function resolveFailurePolicy(value: unknown): ResolvedFailurePolicy {
  if (value === undefined) return DEFAULT_POLICY;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InvalidOptionsError('failures', `expected an object, got ${JSON.stringify(value) ?? String(value)}`);
  }
  const policy = value as FailurePolicy;
  checkKnownOptions(policy, KNOWN, 'failures');
  const int = (name: 'maxAttempts' | 'backoffMinMs' | 'backoffMaxMs', fallback: number, min: number, max: number): number => {
    const v = policy[name] ?? fallback;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) {
      throw new InvalidOptionsError(`failures.${name}`, `expected an integer between ${min} and ${max}, got ${JSON.stringify(v) ?? String(v)}`);
    }
    return v;
  };
  const maxAttempts = int('maxAttempts', 1, 1, 1000);
  const backoffMinMs = int('backoffMinMs', 100, 1, HOUR);
  const backoffMaxMs = int('backoffMaxMs', Math.max(10_000, backoffMinMs), 1, HOUR);
  if (backoffMaxMs < backoffMinMs) {
    throw new InvalidOptionsError('failures.backoffMaxMs', `must be at least failures.backoffMinMs (${backoffMinMs}), got ${backoffMaxMs}`);
  }
  const onExhausted = policy.onExhausted ?? 'stop';
  if (onExhausted !== 'stop' && onExhausted !== 'dead-letter') {
    throw new InvalidOptionsError('failures.onExhausted', `expected 'stop' or 'dead-letter', got ${JSON.stringify(onExhausted)}`);
  }
  return Object.freeze({ maxAttempts, backoffMinMs, backoffMaxMs, onExhausted });
}

const DEFAULT_POLICY: ResolvedFailurePolicy = Object.freeze({ maxAttempts: 1, backoffMinMs: 100, backoffMaxMs: 10_000, onExhausted: 'stop' });

/**
 * The events a page handled before its handler failed (rolled back with
 * it), by the `HandlerError` it threw; absent for every other failure (a
 * `beforeCommit`, the connection, an abort). Internal to tidemark.
 */
export const handledBefore = new WeakMap<HandlerError, number>();

/** Where a consumer stands with a failing event: its seq, the tries so far, the events before it still to commit. */
export interface Tries {
  seq: bigint | undefined;
  attempts: number;
  /** Events to deliver and commit before the failing one is tried again. */
  before: number;
  /** The back-off to wait before the next try; 0 once waited. */
  delayMs: number;
  /** The last try's error. */
  last: HandlerError | undefined;
}

export function noTries(): Tries {
  return { seq: undefined, attempts: 0, before: 0, delayMs: 0, last: undefined };
}

/**
 * A tail option internal to tidemark (a symbol: no user option can name
 * it): the handler's stand-in for replays of its dead letters. A tail given
 * one may take `beforeCommit` with `onExhausted: 'dead-letter'`: a replay
 * commits outside any page, so it runs the stand-in instead, which must
 * have the event's effect outside the database itself before it returns
 * (the relay publishes the event and waits for the broker's acknowledgement).
 */
export const REPLAY_WITH = Symbol('tidemark.replayWith');

/** {@link REPLAY_WITH} as an option. */
export interface ReplayWith {
  [REPLAY_WITH]?: Handler;
}
