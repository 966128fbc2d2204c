import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, checkKnownOptions, echoValue, integerOption, nameOption, retryOptions } from '../options.js';
import type { RelayEvent } from './events.js';

/** Options for {@link Relay}. Every duration is in milliseconds. */
export interface RelayOptions {
  /** The consumer whose cursors record what was relayed (one cursor per stream). Required. */
  consumer: string;
  /** The streams to relay; each is followed by its own tailer, in seq order. Required, at least one. */
  streams: readonly string[];
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /**
   * Events per page: read in one transaction, published pipelined, and
   * committed once the broker acknowledged all of them. Default 500.
   */
  batchSize?: number;
  /** Polling interval while no watermark notification arrives. Default 1000. */
  pollIntervalMs?: number;
  /** LISTEN for the watermarker's notifications. Default true. */
  listen?: boolean;
  /** `lock_timeout` of each page (the cursor row lock). Default 5000. */
  lockTimeoutMs?: number;
  /** Bound on each of tidemark's own statements beyond `lockTimeoutMs`. Default 10000. */
  responseTimeoutMs?: number;
  /** First delay before retrying after a broker or database failure; doubles, with jitter. Default 100. */
  retryMinMs?: number;
  /** Cap of the retry delay. Default 10000. */
  retryMaxMs?: number;
  /**
   * How long a supervisor (systemd, Kubernetes, a shell loop) may take to
   * start the relay again after it crashed. Part of
   * {@link Relay.republishWithinMs}, the bound a broker's duplicate window
   * must exceed. Default 30000.
   */
  restartWithinMs?: number;
  /**
   * What an event the sink refuses for itself does (a `SinkError` that is
   * not retryable, with `seq`: too large, a 4xx answer). `'stop'`
   * (default): the relay stops with that error, the event not published.
   * `'dead-letter'`: the events before it are published and committed, the
   * event is recorded as a dead letter of `consumer` (its error text the
   * sink's) in the transaction that moves the cursor past it, and the relay
   * goes on. `tidemark dead-letters replay` then publishes it again: the
   * relay running with `'dead-letter'` sends it alone, after the later
   * events of its key, and deletes the dead letter once the broker took
   * it; refused again, it stays dead, one try more.
   */
  onRefused?: 'stop' | 'dead-letter';
  /** Receives what the relay does: pages published, retries, the sink opening. Errors it throws go to `onError`. */
  observer?: (event: RelayEvent) => void;
  /** Receives errors that do not stop the relay (listener failures, observer errors). */
  onError?: (err: unknown) => void;
}

/** Resolved, validated and frozen relay options. */
export type ResolvedRelayOptions = Readonly<
  Required<Omit<RelayOptions, 'observer' | 'onError'>> & Pick<RelayOptions, 'observer' | 'onError'>
>;

const HOUR = 3_600_000;

/**
 * How long the server may take to notice that a crashed relay's connection
 * is gone and end its session (releasing the cursor): tidemark's
 * `tcp_keepalives_idle` 10 s plus 3 probes 5 s apart
 * (`CONNECTION_DEFAULTS`). A relay killed on a live host closes its socket
 * and frees the cursor at once; this covers a host that vanished.
 */
export const SESSION_DEATH_DETECTION_MS = 25_000;

/** Applies defaults and validates; throws {@link InvalidOptionsError} naming the first bad option. */
export function resolveRelayOptions(options: RelayOptions): ResolvedRelayOptions {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
  const consumer = nameOption(options.consumer, 'consumer');
  if (!Array.isArray(options.streams) || options.streams.length === 0) {
    throw new InvalidOptionsError('streams', 'expected a non-empty array of stream names');
  }
  const streams = options.streams.map((s: unknown, i) => nameOption(s, `streams[${i}]`));
  const duplicate = streams.find((s, i) => streams.indexOf(s) !== i);
  if (duplicate !== undefined) throw new InvalidOptionsError('streams', `names ${JSON.stringify(duplicate)} twice`);
  if (options.listen !== undefined && typeof options.listen !== 'boolean') throw new InvalidOptionsError('listen', 'expected a boolean');
  const { retryMinMs, retryMaxMs } = retryOptions(options, { minMs: 100, maxMs: () => 10_000 }, HOUR);
  checkCallbacks(options);
  const onRefused = options.onRefused ?? 'stop';
  if (onRefused !== 'stop' && onRefused !== 'dead-letter') throw new InvalidOptionsError('onRefused', `expected 'stop' or 'dead-letter', got ${echoValue(onRefused)}`);
  const resolved: ResolvedRelayOptions = Object.freeze({
    consumer,
    streams: Object.freeze(streams),
    schema: validateSchema(options.schema ?? DEFAULT_SCHEMA),
    batchSize: integerOption(options, 'batchSize', 500, 1, 100_000),
    pollIntervalMs: integerOption(options, 'pollIntervalMs', 1000, 1, HOUR),
    listen: options.listen ?? true,
    lockTimeoutMs: integerOption(options, 'lockTimeoutMs', 5000, 1, HOUR),
    responseTimeoutMs: integerOption(options, 'responseTimeoutMs', 10_000, 1, HOUR),
    retryMinMs,
    retryMaxMs,
    restartWithinMs: integerOption(options, 'restartWithinMs', 30_000, 0, 24 * HOUR),
    onRefused,
    observer: options.observer,
    onError: options.onError,
  });
  checkKnownOptions(options, resolved, 'Relay');
  return resolved;
}
