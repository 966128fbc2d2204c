/**
 * The retry back-off every loop of tidemark uses (the watermarker, the
 * pruner, a consumer's tail, the relay, the listener): a ceiling that
 * doubles with each failure in a row, from `minMs` to `maxMs`.
 */

/** The ceiling before retry number `attempt` (1 for the first retry): `minMs`, doubling, at most `maxMs`. */
export function backoffCeilingMs(attempt: number, minMs: number, maxMs: number): number {
  return Math.min(maxMs, minMs * 2 ** Math.min(Math.max(attempt, 1) - 1, 30));
}

/**
 * The pause before retry number `attempt`: drawn between half the ceiling
 * and the ceiling ("equal jitter"), so processes that failed together do
 * not all retry at the same instant, and none retries sooner than half of it.
 */
export function backoffMs(attempt: number, minMs: number, maxMs: number, random: () => number = Math.random): number {
  const ceiling = backoffCeilingMs(attempt, minMs, maxMs);
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}
