import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, checkKnownOptions, integerOption, retryOptions } from '../options.js';
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
  /**
   * `tail` recovers by itself from every retryable error (`isRetryable`:
   * connection lost, server shutdown or restart, too many connections,
   * serialization failures and deadlocks in the page): it backs off, takes
   * the cursor again and goes on from the durable cursor. Each retry is an
   * observer event `{ type: 'retry' }`. Cursor contention on the first
   * acquisition still rejects at once (another tailer runs); after a lost
   * connection it is retried (the old session may linger until the server
   * notices it is gone). `false`: `tail` rejects with the first error, as
   * `drain` always does. Default true.
   */
  retry?: boolean;
  /** First delay before `tail` retries; it doubles, with jitter, up to `retryMaxMs`. Default 100. */
  retryMinMs?: number;
  /** Cap of the retry delay. Default 10000. */
  retryMaxMs?: number;
  /**
   * How long a statement of tidemark's own (a page's reads, its cursor
   * advance and COMMIT, the cursor lock; never a handler's statements) may go
   * unanswered beyond `lockTimeoutMs` before the connection is treated as
   * dead: it is destroyed and the tail fails with `CONNECTION_LOST` (and
   * retries). With TCP keepalive this bounds how long a half-open
   * connection goes unnoticed: `lockTimeoutMs + responseTimeoutMs`. Default 10000.
   */
  responseTimeoutMs?: number;
  /**
   * While a full page's `beforeCommit` and COMMIT run, read the next page's
   * events on a second pooled connection, so the next page only locks the
   * cursor and checks it (the read ahead is used only when the cursor did
   * not move meanwhile and nothing above it was pruned; otherwise the page
   * reads as usual). Pays off when `beforeCommit` waits on something
   * outside the database, as the relay's broker acknowledgements do. Uses
   * one more connection per tailer while it reads. Default false.
   */
  prefetch?: boolean;
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

/** Bounds of `pollIntervalMs` (the CLI's `--poll` checks them in its own terms). */
export const POLL_INTERVAL_BOUNDS = { min: 1, max: HOUR } as const;

/**
 * Applies defaults and validates; throws {@link InvalidOptionsError} naming
 * the first bad option, or an option it does not know.
 */
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
  const { retryMinMs, retryMaxMs } = retryOptions(options, { minMs: 100, maxMs: () => 10_000 }, HOUR);
  if (options.prefetch !== undefined && typeof options.prefetch !== 'boolean') {
    throw new InvalidOptionsError('prefetch', 'expected a boolean');
  }
  if (options.retry !== undefined && typeof options.retry !== 'boolean') {
    throw new InvalidOptionsError('retry', 'expected a boolean');
  }
  checkCallbacks(options);
  const resolved: ResolvedStreamClientOptions = Object.freeze({
    schema: validateSchema(options.schema ?? DEFAULT_SCHEMA),
    batchSize: integerOption(options, 'batchSize', 500, 1, 100_000),
    pollIntervalMs: integerOption(options, 'pollIntervalMs', 1000, POLL_INTERVAL_BOUNDS.min, POLL_INTERVAL_BOUNDS.max),
    listen: options.listen ?? true,
    listenerBackoffMinMs,
    listenerBackoffMaxMs,
    listenerAcquireTimeoutMs: integerOption(options, 'listenerAcquireTimeoutMs', 1000, 1, HOUR),
    lockTimeoutMs: integerOption(options, 'lockTimeoutMs', 5000, 1, HOUR),
    fenceLockTimeoutMs: integerOption(options, 'fenceLockTimeoutMs', 50, 1, 60_000),
    bootstrapFenceTimeoutMs: integerOption(options, 'bootstrapFenceTimeoutMs', 30_000, 0, HOUR),
    retry: options.retry ?? true,
    retryMinMs,
    retryMaxMs,
    responseTimeoutMs: integerOption(options, 'responseTimeoutMs', 10_000, 1, HOUR),
    prefetch: options.prefetch ?? false,
    observer: options.observer,
    onError: options.onError,
  });
  checkKnownOptions(options, resolved, 'StreamClient');
  return resolved;
}
