import { CliError } from './cli-error.js';

/** Parses `500ms`, `10s`, `5m`, `2h`, `7d` (or a bare number of milliseconds) into milliseconds. */
export function parseDuration(text: string, option: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(text.trim());
  if (!match) throw new CliError(`${option}: expected a duration such as 500ms, 10s, 5m, 2h or 7d, got ${JSON.stringify(text)}`);
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[match[2] ?? 'ms']!;
  const ms = Number(match[1]) * unit;
  if (!Number.isSafeInteger(Math.round(ms))) throw new CliError(`${option}: ${JSON.stringify(text)} is too large`);
  return Math.round(ms);
}
