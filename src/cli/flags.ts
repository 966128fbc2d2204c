/**
 * Checks of the flags a command was given, in the terms the user typed
 * them, before the command runs: every duration against the bounds of the
 * option it sets, and the rules that tie two flags together. The library
 * checks the same again; these only make the message speak the CLI's words
 * (`--lease-renew: must be below half of --lease-ttl "10s", got "5s"`
 * rather than milliseconds and option names).
 */
import type { InvalidOptionsError } from '../errors.js';
import { MIN_RETENTION_MS } from '../retention/options.js';
import { echoValue } from '../options.js';
import { CliError } from './cli-error.js';
import { formatDuration, parseDuration } from './duration.js';

/** Commander option keys that hold a duration, and the flag each comes from. */
const DURATION_KEYS: Record<string, string> = {
  poll: '--poll',
  leaseTtl: '--lease-ttl',
  leaseRenew: '--lease-renew',
  retention: '--retention',
  pruneInterval: '--prune-interval',
  shutdownTimeout: '--shutdown-timeout',
  duration: '--duration',
  ackTimeout: '--ack-timeout',
  restartWithin: '--restart-within',
};

/** Validates the duration flags in `options` (commander's parsed options) and the rules between them; throws `CliError`. */
export function checkFlags(options: Record<string, unknown>): void {
  const ms: Record<string, number> = {};
  for (const [key, flag] of Object.entries(DURATION_KEYS)) {
    const text = options[key];
    if (typeof text === 'string') ms[key] = parseDuration(text, flag);
  }
  // resolveWatermarkerOptions: the lease is renewed at least twice per TTL.
  if (ms.leaseRenew !== undefined && ms.leaseTtl !== undefined && ms.leaseRenew * 2 >= ms.leaseTtl) {
    throw new CliError(
      `--lease-renew: must be below half of --lease-ttl ${echoValue(options.leaseTtl)}, got ${echoValue(options.leaseRenew)}`,
    );
  }
  // resolvePrunerOptions: a retention in minutes is almost always a unit mistake.
  if (ms.retention !== undefined && ms.retention < MIN_RETENTION_MS && options.allowShortRetention !== true) {
    throw new CliError(
      `--retention: ${echoValue(options.retention)} is below the floor of ${formatDuration(MIN_RETENTION_MS)}; pass --allow-short-retention to accept a shorter retention`,
    );
  }
}

/** Library option names as the CLI spells them. */
const FLAGS: Record<string, string> = {
  leaseTtlMs: '--lease-ttl',
  leaseRenewMs: '--lease-renew',
  maxStepsPerSecond: '--max-steps-per-second',
  retentionMs: '--retention',
  allowShortRetention: '--allow-short-retention',
  intervalMs: '--prune-interval',
  batchSize: '--batch',
  pollIntervalMs: '--poll',
  owner: '--owner',
  schema: '--schema',
  url: '--to',
  subject: '--subject',
  exchange: '--exchange',
  routingKey: '--routing-key',
  createStream: '--create-stream',
  createExchange: '--create-exchange',
  ackTimeoutMs: '--ack-timeout',
  restartWithinMs: '--restart-within',
  streams: '--stream',
  format: '--format',
  ceSource: '--ce-source',
  ceType: '--ce-type',
};

/**
 * A library option's message in the CLI's words: the option names it
 * mentions become the flags that set them. A name is replaced only as a
 * whole word, outside the quoted value, and never inside a flag (the
 * `owner` of `--owner` stays as it is).
 */
export function inFlagTerms(err: InvalidOptionsError): string {
  const body = err.message.startsWith(`${err.option}: `) ? err.message.slice(err.option.length + 2) : err.message;
  const rename = (plain: string) =>
    Object.entries(FLAGS).reduce((text, [option, flag]) => text.replace(new RegExp(`(?<![\\w{-])${option}(?![\\w}-])`, 'g'), flag), plain);
  const text = body.replace(/("(?:[^"\\]|\\.)*")|[^"]+/g, (part, quoted?: string) => quoted ?? rename(part));
  return `${FLAGS[err.option] ?? err.option}: ${text}`;
}
