import { fenceKey, stepBucketMs, Watermarker } from 'tidemark';
import { benchPool } from '../db.js';
import { Histogram } from '../histogram.js';
import { runReferenceWatermarker } from '../contenders/baselines.js';

/** The table the reference-style watermarker publishes to when it runs against tidemark's own events and fence. */
export const REFERENCE_SAFE_TABLE = 'bench_ref_safe';

export const WATERMARKER_APP = 'tidemark-bench-watermarker';

/** The application names of a watermarker's backends: its pool's, and the in-database loop's. */
/** The in-database loop's session names itself so (README, Operations). */
const LOOP_APPLICATION_NAME = 'tidemark-watermarker';
export const WATERMARKER_APPS = [WATERMARKER_APP, LOOP_APPLICATION_NAME];

/**
 * Runs one watermarker in this (child) process until `signal` aborts and
 * returns the time of each of its steps: `tidemark` (its Watermarker at its
 * defaults, `default`, or reading pg_locks every time, `pg_locks`; step
 * times measured on the server, from the run summaries' log buckets), or
 * `reference` (blocking, one statement per round trip, synchronous commit,
 * every `step` ms; the time from its lock statement to its COMMIT
 * returning, measured here: its exclusive hold) on tidemark's own fence and
 * events table.
 */
export async function runWatermarkerChild(kind: string, url: string, step: string, signal: AbortSignal): Promise<Histogram> {
  const hold = new Histogram();
  const pool = benchPool(url, 3, WATERMARKER_APP);
  try {
    if (kind === 'tidemark') {
      const wm = new Watermarker(pool, {
        owner: 'bench',
        tryLockFirst: step !== 'pg_locks',
        observer: (event) => {
          if (event.type !== 'run') return;
          for (const [i, n] of event.summary.stepHistogram.entries()) hold.recordMs(stepBucketMs(i), n);
        },
      });
      // Stopped by close(), which releases the lease (the stop request): the
      // last run returns its summary instead of being cancelled, and run()
      // ends after it.
      const running = new AbortController();
      const done = wm.run(running.signal).catch(() => undefined);
      process.send?.({ type: 'ready' });
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      await wm.close();
      const stopped = setTimeout(() => running.abort(), 2000);
      await done;
      clearTimeout(stopped);
    } else if (kind === 'reference') {
      process.send?.({ type: 'ready' });
      await runReferenceWatermarker(
        pool,
        { key: fenceKey('tidemark'), events: 'tidemark.events', safe: REFERENCE_SAFE_TABLE, stepMs: Number(step), hold },
        signal,
      ).catch(() => undefined);
    } else {
      throw new Error(`unknown watermarker ${kind}`);
    }
  } finally {
    await pool.end();
  }
  return hold;
}
