import { readFile } from 'node:fs/promises';
import type pg from 'pg';

const TICKS_PER_SECOND = 100;

/** CPU seconds (user + system) a local process has used, or null when /proc cannot tell (another host, another OS). */
export async function cpuSeconds(pid: number): Promise<number | null> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND;
  } catch {
    return null;
  }
}

/** Sum over processes; null if any could not be read. */
export async function cpuSecondsOf(pids: number[]): Promise<number | null> {
  let total = 0;
  for (const pid of pids) {
    const s = await cpuSeconds(pid);
    if (s === null) return null;
    total += s;
  }
  return total;
}

/** CPU used so far by this process and by a database's backends, each backend with its application_name. */
export interface CpuSample {
  /** performance.now() when taken. */
  at: number;
  /** This process's user + system seconds. */
  own: number;
  /** Per backend: its application_name and CPU seconds; null when /proc cannot tell (a server on another host). */
  backends: Map<number, { app: string; seconds: number }> | null;
}

/** The CPU of this process and of every backend of `pool`'s database but its own and those whose application_name is in `exclude`. */
export async function sampleCpu(pool: pg.Pool, exclude: readonly string[]): Promise<CpuSample> {
  const { rows } = await pool.query<{ pid: number; app: string }>(
    `SELECT pid, application_name AS app FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND application_name <> ALL ($1)`,
    [exclude],
  );
  const own = process.cpuUsage();
  // No /proc here: nothing can be told.
  if ((await cpuSeconds(process.pid)) === null) return { at: performance.now(), own: (own.user + own.system) / 1e6, backends: null };
  const backends = new Map<number, { app: string; seconds: number }>();
  for (const { pid, app } of rows) {
    const seconds = await cpuSeconds(pid);
    // Gone since the query (a pool let it go): not counted.
    if (seconds !== null) backends.set(pid, { app, seconds });
  }
  return { at: performance.now(), own: (own.user + own.system) / 1e6, backends };
}

/**
 * CPU between two samples in % of one core: this process (unless
 * `backendsOnly`) plus the backends `pick` accepts, each counted from its
 * first sample (a backend that connected meanwhile, from zero; one that
 * left meanwhile is not counted). Null when /proc could not tell.
 */
export function cpuPercent(a: CpuSample, b: CpuSample, options: { pick?: (app: string) => boolean; backendsOnly?: boolean } = {}): number | null {
  if (a.backends === null || b.backends === null || b.at <= a.at) return null;
  let seconds = options.backendsOnly ? 0 : b.own - a.own;
  for (const [pid, { app, seconds: s }] of b.backends) {
    if (options.pick && !options.pick(app)) continue;
    seconds += s - (a.backends.get(pid)?.seconds ?? 0);
  }
  return (seconds / ((b.at - a.at) / 1000)) * 100;
}
