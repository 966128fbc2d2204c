import type pg from 'pg';
import { installChecker } from './checker.js';
import { benchPool, type BenchServer } from './db.js';
import type { Progress } from './progress.js';
import type { Contender } from './contenders/types.js';

/** What every scenario gets: the server, the run's mode and the contenders that could be loaded. */
export interface BenchContext {
  server: BenchServer;
  quick: boolean;
  contenders: Contender[];
  /** The reference rows asked for (run.ts REFERENCE_IDS): all, unless --contenders names some. */
  references: string[];
  progress: Progress;
  /** Scale a duration: the quick value or the full one. */
  pick<T>(quick: T, full: T): T;
}

/** Runs `fn` over `items`, at most `limit` at a time, keeping order. */
export async function inWaves<T, R>(items: T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < items.length; i += limit) {
    out.push(...(await Promise.all(items.slice(i, i + limit).map(fn))));
  }
  return out;
}

/** Polls `read` until it returns true or `progress()` stops changing for `quietMs`. */
export async function settle(read: () => Promise<{ done: boolean; progress: number }>, quietMs: number, maxMs: number): Promise<boolean> {
  const start = performance.now();
  let last = -1;
  let changed = performance.now();
  for (;;) {
    const { done, progress } = await read();
    if (done) return true;
    if (progress !== last) {
      last = progress;
      changed = performance.now();
    }
    if (performance.now() - changed > quietMs || performance.now() - start > maxMs) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A fresh database with the contender's schema and the gap checker's tables; the pool is ended if installing fails. */
export async function installedDatabase(server: BenchServer, contender: Contender, name: string): Promise<{ url: string; pool: pg.Pool }> {
  const url = await server.freshDatabase(name);
  const pool = benchPool(url, 2);
  try {
    await contender.install(pool);
    await installChecker(pool);
  } catch (err) {
    await pool.end();
    throw err;
  }
  return { url, pool };
}
