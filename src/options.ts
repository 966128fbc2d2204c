import type pg from 'pg';
/**
 * The validators every option resolver shares: each throws
 * InvalidOptionsError naming the option and the bad value.
 */
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { InvalidOptionsError, MissingPackageError } from './errors.js';

/**
 * A URL with its credentials hidden, for messages: what lies between `//`
 * and the last `@` (a password may hold `@`, `/` or `:`) keeps only the
 * user before its first `:`; a bare token (`nats://TOKEN@host`) is hidden
 * whole. Works on text that does not parse as a URL too.
 */
export function redactUrl(url: string): string {
  const start = url.indexOf('//');
  const at = url.lastIndexOf('@');
  if (start < 0 || at < start) return url;
  const credentials = url.slice(start + 2, at);
  const colon = credentials.indexOf(':');
  const shown = colon < 0 ? '***' : `${credentials.slice(0, colon)}:***`;
  return `${url.slice(0, start + 2)}${shown}${url.slice(at)}`;
}

/**
 * Imports an optional peer dependency: a package only some features need,
 * which a library user installs when they use that feature. Missing, it is
 * a MissingPackageError naming the package and the feature; any other
 * failure to load it is thrown as it is.
 */
export async function importOptional<T>(packageName: string, feature: string, load: () => Promise<T> = () => import(packageName) as Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    const missing = (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && (err as Error).message.includes(`'${packageName}'`);
    if (missing) throw new MissingPackageError(packageName, feature);
    throw err;
  }
}

/**
 * What {@link loadOnce} returns: `load()` resolves to the value, loading it
 * the first time (and again after a failed attempt); `get()` is the value
 * once a load has resolved, and throws before (a caller that uses it must
 * have awaited `load()` on the way: a sink's connection does).
 */
export interface LoadedOnce<T> {
  load(): Promise<T>;
  get(): T;
}

/** Loads a value (optional packages: see {@link importOptional}) on first use and keeps it. `what` names it in `get()`'s error. */
export function loadOnce<T>(what: string, load: () => Promise<T>): LoadedOnce<T> {
  let value: { loaded: T } | undefined;
  let loading: Promise<T> | undefined;
  return {
    load: () => {
      if (value) return Promise.resolve(value.loaded);
      loading ??= load().then(
        (loaded) => (value = { loaded }).loaded,
        (err: unknown) => {
          loading = undefined;
          throw err;
        },
      );
      return loading;
    },
    get: () => {
      if (!value) throw new Error(`tidemark: ${what} used before it was loaded`);
      return value.loaded;
    },
  };
}

/** How many characters of a rejected value an error message quotes. */
export const ECHO_LIMIT = 80;

/**
 * A rejected value as an error message quotes it: JSON, cut to `max`
 * characters with an ellipsis, and its full length when cut, so a
 * 20,000-character mistake costs one line, not a screenful.
 */
export function echoValue(value: unknown, max = ECHO_LIMIT): string {
  if (typeof value === 'string' && value.length > max) return `${JSON.stringify(`${value.slice(0, max)}…`)} (${value.length} characters)`;
  let text: string;
  try {
    // NaN and the infinities as JavaScript writes them: JSON would say null.
    text =
      typeof value === 'bigint' ? `${value}n`
      : typeof value === 'function' ? 'a function'
      : typeof value === 'number' && !Number.isFinite(value) ? String(value)
      : (JSON.stringify(value) ?? String(value));
  } catch {
    text = Object.prototype.toString.call(value); // cyclic
  }
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** `options[name]`, or `fallback` when unset; an integer in [min, max]. */
export function integerOption<T extends object>(options: T, name: keyof T & string, fallback: number, min: number, max: number): number {
  const value = options[name] ?? fallback;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(name, `expected an integer between ${min} and ${max}, got ${echoValue(value)}`);
  }
  return value;
}

/**
 * `retryMinMs` and `retryMaxMs` of a loop that retries with a back-off
 * (src/backoff.ts): integers in [1, `limit`], the maximum at least the
 * minimum; `maxMs` gives the maximum's default from the minimum.
 */
export function retryOptions(
  options: { retryMinMs?: number; retryMaxMs?: number },
  defaults: { minMs: number; maxMs: (retryMinMs: number) => number },
  limit: number,
): { retryMinMs: number; retryMaxMs: number } {
  const retryMinMs = integerOption(options, 'retryMinMs', defaults.minMs, 1, limit);
  const retryMaxMs = integerOption(options, 'retryMaxMs', defaults.maxMs(retryMinMs), 1, limit);
  if (retryMaxMs < retryMinMs) throw new InvalidOptionsError('retryMaxMs', `must be at least retryMinMs (${retryMinMs}), got ${retryMaxMs}`);
  return { retryMinMs, retryMaxMs };
}

/** A name stored in tidemark's tables (owner, consumer, stream): non-empty, at most 200 characters, no NUL. */
export function nameOption(value: unknown, option: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 200 || value.includes('\u0000')) {
    throw new InvalidOptionsError(option, `expected a non-empty string of at most 200 characters without NUL, got ${echoValue(value)}`);
  }
  return value;
}

/** A lease or heartbeat owner: the given name, or `<hostname>:<pid>:<random>`. */
export function ownerOption(value: unknown): string {
  return nameOption(value ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`, 'owner');
}

/** The `observer` and `onError` callbacks, when given, are functions. */
export function checkCallbacks(options: { observer?: unknown; onError?: unknown }): void {
  for (const name of ['observer', 'onError'] as const) {
    if (options[name] !== undefined && typeof options[name] !== 'function') throw new InvalidOptionsError(name, 'expected a function');
  }
}

/**
 * Refuses options the resolver does not know: a misspelt `pollIntervalMS`
 * or an option of another class would otherwise be ignored without a word.
 * `known` is the resolved object, so every option it resolves is accepted.
 */
export function checkKnownOptions(options: object, known: object, owner: string): void {
  for (const name of Object.keys(options)) {
    if (!Object.hasOwn(known, name)) {
      throw new InvalidOptionsError(name, `is not a ${owner} option (known: ${Object.keys(known).join(', ')})`);
    }
  }
}

/** `pool`, refused by name unless it is a pool (a pg Pool, or anything with its connect()). */
export function poolOption(pool: unknown): pg.Pool {
  if (!pool || typeof (pool as { connect?: unknown }).connect !== 'function') throw new InvalidOptionsError('pool', 'expected a pg Pool');
  return pool as pg.Pool;
}

/** A boolean option, or `fallback` when absent. */
export function booleanOption<T extends object>(options: T, name: keyof T & string, fallback: boolean): boolean {
  const value = options[name] ?? fallback;
  if (typeof value !== 'boolean') throw new InvalidOptionsError(name, `expected a boolean, got ${echoValue(value)}`);
  return value;
}
