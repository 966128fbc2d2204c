import { POLL_INTERVAL_BOUNDS } from '../consumer/options.js';
import { echoValue } from '../options.js';
import { MAX_RETENTION_MS, PRUNE_INTERVAL_BOUNDS } from '../retention/options.js';
import { CliError } from './cli-error.js';

const DAY = 86_400_000;
const UNITS = { d: DAY, h: 3_600_000, m: 60_000, s: 1000, ms: 1 } as const;

/** How to write a duration: the units a flag accepts, for help texts and messages. */
export const DURATION_SYNTAX = 'a number and its unit (ms, s, m, h or d): 500ms, 10s, 1.5m, 2h, 7d';

/**
 * The bounds of each duration flag, in milliseconds: those of the library
 * option it sets, checked here so the message speaks the flag's terms
 * (`--poll: must be at least 1ms, got "0s"`) rather than the option's.
 * `--lease-ttl` and `--lease-renew` mirror resolveWatermarkerOptions.
 */
const BOUNDS: Record<string, { min: number; max: number }> = {
  '--poll': POLL_INTERVAL_BOUNDS,
  '--prune-interval': PRUNE_INTERVAL_BOUNDS,
  '--retention': { min: 0, max: MAX_RETENTION_MS },
  '--lease-ttl': { min: 20, max: DAY },
  '--lease-renew': { min: 1, max: DAY },
};

/**
 * Parses `500ms`, `10s`, `1.5m`, `2h`, `7d` into milliseconds. A number
 * needs its unit (only `0` may go without): a bare `5` could mean seconds as
 * well as milliseconds, so it is refused with both readings offered. Throws
 * a one-line `CliError` naming `flag` and quoting the text as given, also
 * when the value is outside the bounds of the option the flag sets.
 */
export function parseDuration(text: string, flag: string): number {
  const given = echoValue(text);
  const trimmed = text.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed) && Number(trimmed) !== 0) {
    throw new CliError(`${flag}: ${given} has no unit; write ${trimmed}ms or ${trimmed}s (units: ms, s, m, h, d)`);
  }
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(trimmed);
  if (!match) throw new CliError(`${flag}: expected a duration, ${DURATION_SYNTAX}; got ${given}`);
  const ms = Math.round(Number(match[1]) * UNITS[(match[2] ?? 'ms') as keyof typeof UNITS]);
  if (!Number.isSafeInteger(ms)) throw new CliError(`${flag}: ${given} is too large`);
  const bounds = BOUNDS[flag];
  if (bounds && ms < bounds.min) throw new CliError(`${flag}: must be at least ${formatDuration(bounds.min)}, got ${given}`);
  if (bounds && ms > bounds.max) throw new CliError(`${flag}: must be at most ${formatDuration(bounds.max)}, got ${given}`);
  return ms;
}

/** Milliseconds as the largest unit that divides them evenly: `1ms`, `1500ms`, `10s`, `1h`, `7d`. */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  for (const [unit, size] of Object.entries(UNITS)) {
    if (ms % size === 0) return `${ms / size}${unit}`;
  }
  return `${ms}ms`;
}
