import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, integerOption } from '../options.js';
import type { ConsumerEvent } from './events.js';

/** Options for {@link StreamClient}. Every duration is in milliseconds. */
export interface StreamClientOptions {
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /** Events per page (one transaction). Default 500. */
  batchSize?: number;
  /**
   * How long a tailer waits after a short page before it pages again when no
   * notification arrives. Notifications (LISTEN) usually wake it sooner; this
   * is the latency while the listener is down. Default 1000.
   */
  pollIntervalMs?: number;
  /** LISTEN for the watermarker's notifications on one shared connection. Default true. */
  listen?: boolean;
  /** First delay before the listener reconnects after a failure. Default 100. */
  listenerBackoffMinMs?: number;
  /** Cap of the listener's reconnect delay, which doubles after each failure. Default 10000. */
  listenerBackoffMaxMs?: number;
  /** How long the listener waits for a pooled connection before it counts a failure and backs off. Default 1000. */
  listenerAcquireTimeoutMs?: number;
  /**
   * `lock_timeout` of every page transaction: bounds the wait for the cursor
   * row lock (held only by foreign sessions; then `CursorContentionError`)
   * and every lock wait of the handler's own statements (then a
   * `HandlerError` over SQLSTATE 55P03, which is retryable). Default 5000.
   */
  lockTimeoutMs?: number;
  /** Each bounded wait for the exclusive fence while `bootstrap` takes its snapshot. Default 50. */
  fenceLockTimeoutMs?: number;
  /** Total time `bootstrap` tries for the fence before `FenceBusyError`. Default 30000. */
  bootstrapFenceTimeoutMs?: number;
  /** Receives pages, resyncs and listener state changes. Errors it throws go to `onError`. */
  observer?: (event: ConsumerEvent) => void;
  /** Receives errors that do not end a tail: listener failures and observer errors. */
  onError?: (err: unknown) => void;
}

/** Resolved, validated and frozen stream client options. */
export type ResolvedStreamClientOptions = Readonly<
  Required<Omit<StreamClientOptions, 'observer' | 'onError'>> & Pick<StreamClientOptions, 'observer' | 'onError'>
>;

const HOUR = 3_600_000;

/** Applies defaults and validates; throws {@link InvalidOptionsError} naming the first bad option. */
export function resolveStreamClientOptions(options: StreamClientOptions = {}): ResolvedStreamClientOptions {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidOptionsError('options', 'expected an object');
  }
  const listenerBackoffMinMs = integerOption(options, 'listenerBackoffMinMs', 100, 1, HOUR);
  const listenerBackoffMaxMs = integerOption(options, 'listenerBackoffMaxMs', 10_000, 1, HOUR);
  if (listenerBackoffMaxMs < listenerBackoffMinMs) {
    throw new InvalidOptionsError(
      'listenerBackoffMaxMs',
      `must be at least listenerBackoffMinMs (${listenerBackoffMinMs}), got ${listenerBackoffMaxMs}`,
    );
  }
  if (options.listen !== undefined && typeof options.listen !== 'boolean') {
    throw new InvalidOptionsError('listen', 'expected a boolean');
  }
  checkCallbacks(options);
  return Object.freeze({
    schema: validateSchema(options.schema ?? DEFAULT_SCHEMA),
    batchSize: integerOption(options, 'batchSize', 500, 1, 100_000),
    pollIntervalMs: integerOption(options, 'pollIntervalMs', 1000, 1, HOUR),
    listen: options.listen ?? true,
    listenerBackoffMinMs,
    listenerBackoffMaxMs,
    listenerAcquireTimeoutMs: integerOption(options, 'listenerAcquireTimeoutMs', 1000, 1, HOUR),
    lockTimeoutMs: integerOption(options, 'lockTimeoutMs', 5000, 1, HOUR),
    fenceLockTimeoutMs: integerOption(options, 'fenceLockTimeoutMs', 50, 1, 60_000),
    bootstrapFenceTimeoutMs: integerOption(options, 'bootstrapFenceTimeoutMs', 30_000, 0, HOUR),
    observer: options.observer,
    onError: options.onError,
  });
}
