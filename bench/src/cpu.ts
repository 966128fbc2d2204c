import { readFile } from 'node:fs/promises';

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
