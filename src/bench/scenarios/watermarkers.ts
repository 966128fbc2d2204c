import { fenceKey } from '../../db/queryable.js';
import { Watermarker } from '../../watermark/watermarker.js';
import { benchPool } from '../db.js';
import { Histogram } from '../histogram.js';
import { runReferenceWatermarker } from '../contenders/baselines.js';

/** The table the reference-style watermarker publishes to when it runs against tidemark's own events and fence. */
export const REFERENCE_SAFE_TABLE = 'bench_ref_safe';

export const WATERMARKER_APP = 'tidemark-bench-watermarker';

/**
 * Runs one watermarker in this (child) process until `signal` aborts and
 * returns the exclusive-fence hold of each step that took the fence:
 * `tidemark` (its Watermarker, at its defaults or a fixed `stepMs`), or
 * `reference` (blocking, one statement per round trip, synchronous commit)
 * on tidemark's own fence and events table.
 */
export async function runWatermarkerChild(kind: string, url: string, step: string, signal: AbortSignal): Promise<Histogram> {
  const hold = new Histogram();
  const pool = benchPool(url, 3, WATERMARKER_APP);
  try {
    if (kind === 'tidemark') {
      const stepMs = step === 'default' ? {} : { pollMinMs: Number(step), pollMaxMs: Number(step) };
      const wm = new Watermarker(pool, {
        owner: 'bench',
        ...stepMs,
        observer: (p) => {
          if (p.fenceHoldMs > 0) hold.recordMs(p.fenceHoldMs);
        },
      });
      process.send?.({ type: 'ready' });
      await wm.run(signal).catch(() => undefined);
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
