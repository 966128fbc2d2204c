/**
 * The validators every option resolver shares: each throws
 * InvalidOptionsError naming the option and the bad value.
 */
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { InvalidOptionsError } from './errors.js';

/** `options[name]`, or `fallback` when unset; an integer in [min, max]. */
export function integerOption<T extends object>(options: T, name: keyof T & string, fallback: number, min: number, max: number): number {
  const value = options[name] ?? fallback;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(name, `expected an integer between ${min} and ${max}, got ${JSON.stringify(value)}`);
  }
  return value;
}

/** A name stored in tidemark's tables (owner, consumer, stream): non-empty, at most 200 characters, no NUL. */
export function nameOption(value: unknown, option: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 200 || value.includes('\u0000')) {
    throw new InvalidOptionsError(option, `expected a non-empty string of at most 200 characters without NUL, got ${JSON.stringify(value)}`);
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
