import { InvalidOptionsError } from '../errors.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { checkCallbacks, checkKnownOptions, integerOption, ownerOption } from '../options.js';

/** What one `prune()` pass deleted. */
export interface PruneResult {
  /** Events deleted. */
  deleted: number;
  /** Statements run (each deletes at most `batchSize`). */
  batches: number;
  /** Horizons advanced by this pass: per stream, the greatest seq removed so far. */
  horizons: { stream: string; prunedThroughSeq: bigint }[];
  /** The safe_seq the last batch read; nothing above it was touched. */
  safeSeq: bigint;
}

/** Default retention: 7 days. */
export const DEFAULT_RETENTION_MS = 7 * 24 * 3_600_000;

/**
 * The shortest retention accepted without `allowShortRetention`: 1 hour.
 * Retention shorter than a consumer's longest pause forces it to resync, and
 * a retention in the milliseconds is almost always a unit mistake.
 */
export const MIN_RETENTION_MS = 3_600_000;

/** The longest retention accepted: 100 years. */
export const MAX_RETENTION_MS = 100 * 365 * 24 * 3_600_000;

/** Bounds of `intervalMs` (the CLI's `--prune-interval` checks them in its own terms). */
export const PRUNE_INTERVAL_BOUNDS = { min: 1, max: 24 * 3_600_000 } as const;

/** Options for {@link Pruner}. Every duration is in milliseconds. */
export interface PrunerOptions {
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /** Events older than this (by `occurred_at`) are deleted. Default 604800000 (7 days); at least {@link MIN_RETENTION_MS}. */
  retentionMs?: number;
  /** Accept a `retentionMs` below {@link MIN_RETENTION_MS} (down to 0). Default false. */
  allowShortRetention?: boolean;
  /** Events deleted per statement (one short transaction each). Default 1000. */
  batchSize?: number;
  /** Pause between passes of `run`. Default 60000. */
  intervalMs?: number;
  /** Name in the `heartbeats` table. Default `<hostname>:<pid>:<random>`. */
  owner?: string;
  /** Called after every pass of `run` with what it deleted. Errors it throws go to `onError`. */
  observer?: (result: PruneResult) => void;
  /** Receives errors that do not stop `run`. */
  onError?: (err: unknown) => void;
}

/** Resolved, validated and frozen pruner options. */
export type ResolvedPrunerOptions = Readonly<Required<Omit<PrunerOptions, 'observer' | 'onError'>> & Pick<PrunerOptions, 'observer' | 'onError'>>;

/**
 * Applies defaults and validates; throws {@link InvalidOptionsError} naming
 * the first bad option, or an option it does not know.
 */
export function resolvePrunerOptions(options: PrunerOptions = {}): ResolvedPrunerOptions {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
  if (options.allowShortRetention !== undefined && typeof options.allowShortRetention !== 'boolean') {
    throw new InvalidOptionsError('allowShortRetention', 'expected a boolean');
  }
  const allowShortRetention = options.allowShortRetention ?? false;
  const retentionMs = integerOption(options, 'retentionMs', DEFAULT_RETENTION_MS, 0, MAX_RETENTION_MS);
  if (retentionMs < MIN_RETENTION_MS && !allowShortRetention) {
    throw new InvalidOptionsError(
      'retentionMs',
      `${retentionMs} ms is below the floor of ${MIN_RETENTION_MS} ms (1 hour); set allowShortRetention to accept it`,
    );
  }
  const owner = ownerOption(options.owner);
  checkCallbacks(options);
  const resolved: ResolvedPrunerOptions = Object.freeze({
    schema: validateSchema(options.schema ?? DEFAULT_SCHEMA),
    retentionMs,
    allowShortRetention,
    batchSize: integerOption(options, 'batchSize', 1000, 1, 100_000),
    intervalMs: integerOption(options, 'intervalMs', 60_000, PRUNE_INTERVAL_BOUNDS.min, PRUNE_INTERVAL_BOUNDS.max),
    owner,
    observer: options.observer,
    onError: options.onError,
  });
  checkKnownOptions(options, resolved, 'Pruner');
  return resolved;
}
