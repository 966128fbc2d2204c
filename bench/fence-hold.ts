/**
 * Exclusive-fence hold and wait times of the watermarker under a concurrent
 * writer load. Hold is measured on the server inside watermark_step, from
 * the moment the exclusive lock is granted to the end of the function (the
 * commit that releases it follows at once, with synchronous_commit off).
 *
 *   npm run bench:fence -- [--writers 8] [--steps 2000] [--batch 1]
 *
 * Uses DATABASE_URL, else an embedded PostgreSQL. A benchmark, not a test.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { appendMany, createPool, migrate, Watermarker, type WatermarkProgress } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/db/embedded.js';

const { values } = parseArgs({
  options: {
    writers: { type: 'string', default: '8' },
    steps: { type: 'string', default: '2000' },
    batch: { type: 'string', default: '1' },
  },
});
const writers = Number(values.writers);
const wantSteps = Number(values.steps);
const batch = Number(values.batch);

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

async function main(): Promise<void> {
  let url = process.env.DATABASE_URL;
  let stopEmbedded: (() => Promise<void>) | undefined;
  let dataDir: string | undefined;
  if (!url) {
    dataDir = await mkdtemp(join(tmpdir(), 'tidemark-bench-'));
    const embedded = await startEmbeddedPostgres({ dataDir, ephemeral: true });
    url = embedded.url;
    stopEmbedded = embedded.stop;
  }
  const database = `tidemark_bench_${Date.now().toString(36)}`;
  const admin = new pg.Client(url);
  await admin.connect();
  const version = (await admin.query('SHOW server_version')).rows[0].server_version;
  await admin.query(`CREATE DATABASE ${database}`);
  const dbUrl = new URL(url);
  dbUrl.pathname = `/${database}`;
  const pool = createPool({ connectionString: dbUrl.toString(), max: writers + 4 });
  try {
    await migrate(pool);
    const holds: number[] = [];
    const waits: number[] = [];
    const outcomes = new Map<string, number>();
    let appended = 0;
    const stop = new AbortController();
    const wm = new Watermarker(pool, {
      observer: (p: WatermarkProgress) => {
        outcomes.set(p.outcome, (outcomes.get(p.outcome) ?? 0) + 1);
        if (p.fenceHoldMs > 0) {
          holds.push(p.fenceHoldMs);
          waits.push(p.fenceWaitMs);
          if (holds.length >= wantSteps) stop.abort();
        }
      },
    });
    const events = Array.from({ length: batch }, (_, i) => ({ stream: 'bench', kind: 'tick', key: `k${i}`, payload: { i } }));
    const writerLoops = Array.from({ length: writers }, async () => {
      while (!stop.signal.aborted) {
        await appendMany(pool, events);
        appended += batch;
      }
    });
    const started = Date.now();
    const cpuBefore = process.cpuUsage();
    await wm.run(stop.signal);
    await Promise.all(writerLoops);
    const elapsed = (Date.now() - started) / 1000;
    const cpu = process.cpuUsage(cpuBefore);
    await wm.close();

    holds.sort((a, b) => a - b);
    waits.sort((a, b) => a - b);
    const fmt = (ms: number) => `${(ms * 1000).toFixed(0)} µs`;
    console.log(`PostgreSQL ${version}; ${writers} writers, ${batch} event(s) per transaction; ${elapsed.toFixed(1)} s; ${appended} events appended`);
    console.log(`steps by outcome: ${[...outcomes].map(([k, v]) => `${k} ${v}`).join(', ')}`);
    console.log(`fenced steps: ${holds.length}`);
    console.log(`exclusive hold: median ${fmt(percentile(holds, 50))}, p99 ${fmt(percentile(holds, 99))}, max ${fmt(holds.at(-1) ?? Number.NaN)}`);
    console.log(`exclusive wait: median ${fmt(percentile(waits, 50))}, p99 ${fmt(percentile(waits, 99))}, max ${fmt(waits.at(-1) ?? Number.NaN)}`);
    console.log(`bench process CPU (writers + watermarker): ${((cpu.user + cpu.system) / 1e6).toFixed(1)} s`);
  } finally {
    await pool.end();
    await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await admin.end();
    await stopEmbedded?.();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  }
}

await main();
