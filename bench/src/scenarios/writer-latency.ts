import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { cpuSecondsOf } from '../cpu.js';
import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { Histogram } from '../histogram.js';
import { runLoad } from '../load.js';
import { ratioText, type Goal, type ScenarioResult } from '../report.js';
import { spawnWorker } from '../worker.js';
import { tidemarkContender } from '../contenders/tidemark.js';
import { REFERENCE_SAFE_TABLE, WATERMARKER_APPS } from './watermarkers.js';

interface Config {
  id: string;
  label: string;
  args?: [kind: string, step: string];
}

const CONFIGS: Config[] = [
  { id: 'none', label: 'no watermarker' },
  { id: 'defaults', label: 'tidemark watermarker, defaults (try-lock, then pg_locks)', args: ['tidemark', 'default'] },
  { id: 'pglocks', label: 'tidemark watermarker, pg_locks on every step', args: ['tidemark', 'pg_locks'] },
  { id: 'reference10', label: 'reference-style watermarker, 10 ms step', args: ['reference', '10'] },
];

interface Tally {
  writers: Histogram;
  hold: Histogram;
  cpuSeconds: number | null;
  ms: number;
  committed: number;
}

async function startWatermarker(url: string, args: [string, string]): Promise<ChildProcess> {
  const child = spawnWorker(['watermark', args[0], url, args[1]]);
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`watermarker worker exited with ${code}`)));
    child.on('message', (m: { type?: string }) => m.type === 'ready' && resolve());
  });
  return child;
}

async function stopWatermarker(child: ChildProcess): Promise<Histogram> {
  const result = new Promise<Histogram>((resolve) => {
    child.on('message', (m: { type?: string; hold?: ReturnType<Histogram['toJSON']> }) => {
      if (m.type === 'watermark' && m.hold) resolve(Histogram.fromJSON(m.hold));
    });
  });
  const exited = once(child, 'exit');
  child.send('stop');
  const hold = await result;
  await exited;
  return hold;
}

/**
 * The same writers (tidemark's append, 8 connections, open loop, one event
 * per transaction) with no watermarker, with tidemark's at its defaults
 * (the try-lock first, then pg_locks) and reading pg_locks on every step
 * (both paths' costs, side by side), and with a reference-style
 * watermarker (blocking exclusive acquisition, one statement per round
 * trip, synchronous commit) at 10 ms on the same fence and table. Windows
 * rotate through the four configurations so drift falls on all of them.
 * The watermarker runs in its own process; its CPU is that process plus
 * its server backends.
 */
export async function writerLatency(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const contender = tidemarkContender();
  const url = await ctx.server.freshDatabase('writer_latency');
  const pool = benchPool(url, 2);
  await contender.install(pool);
  await pool.query(`CREATE TABLE ${REFERENCE_SAFE_TABLE} (id int PRIMARY KEY, safe_seq bigint NOT NULL); INSERT INTO ${REFERENCE_SAFE_TABLE} VALUES (1, 0)`);
  const windowMs = ctx.pick(800, 3000);
  const rounds = ctx.pick(1, 8);
  const txPerSec = ctx.pick(400, 800);
  const tallies = new Map(CONFIGS.map((c) => [c.id, { writers: new Histogram(), hold: new Histogram(), cpuSeconds: 0, ms: 0, committed: 0 } as Tally]));
  try {
    for (let round = 0; round < rounds; round += 1) {
      const order = CONFIGS.map((_, i) => CONFIGS[(i + round) % CONFIGS.length]!);
      for (const config of order) {
        ctx.progress.step(`writer latency: ${config.label} (round ${round + 1}/${rounds})`);
        const tally = tallies.get(config.id)!;
        const child = config.args ? await startWatermarker(url, config.args) : undefined;
        await new Promise((r) => setTimeout(r, 300));
        const backends = child
          ? (
              await pool.query('SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = ANY ($1)', [WATERMARKER_APPS])
            ).rows.map((r) => r.pid as number)
          : [];
        const pids = child ? [child.pid!, ...backends] : [];
        const cpu0 = await cpuSecondsOf(pids);
        const load = await runLoad(contender, url, { writers: 8, durationMs: windowMs, txPerSec });
        const cpu1 = await cpuSecondsOf(pids);
        tally.cpuSeconds = tally.cpuSeconds === null || cpu0 === null || cpu1 === null ? null : tally.cpuSeconds + (cpu1 - cpu0);
        tally.ms += load.elapsedMs;
        tally.committed += load.committedTx;
        tally.writers.merge(load.latency);
        if (child) tally.hold.merge(await stopWatermarker(child));
      }
    }
  } finally {
    await pool.end();
  }
  const cpu = (id: string) => {
    const t = tallies.get(id)!;
    return t.cpuSeconds === null ? null : (t.cpuSeconds / (t.ms / 1000)) * 100;
  };
  const none = tallies.get('none')!.writers.summary();
  const p99 = (id: string) => tallies.get(id)!.writers.summary().p99;
  const rows = CONFIGS.map((c) => {
    const t = tallies.get(c.id)!;
    const w = t.writers.summary();
    const h = t.hold.summary();
    return [
      c.label,
      w.p50,
      w.p99,
      w.p99 / none.p99,
      c.args ? h.p50 : null,
      c.args ? h.p99 : null,
      c.args ? h.count : null,
      c.args ? cpu(c.id) : null,
      (t.committed / t.ms) * 1000,
    ];
  });
  const cpuDefaults = cpu('defaults');
  const goals: Goal[] = [
    {
      goal: 'writer latency: p99 with tidemark watermarker at defaults / none',
      target: '<= 1.10',
      measured: ratioText(p99('defaults') / none.p99, 1.1),
      met: p99('defaults') / none.p99 <= 1.1,
    },
    {
      goal: `watermarker CPU at ${txPerSec} tx/s (process + backends, % of one core)`,
      target: '<= 5%',
      measured: cpuDefaults === null ? 'not measured (no /proc)' : `${cpuDefaults.toFixed(1)}%`,
      met: cpuDefaults === null ? null : cpuDefaults <= 5,
    },
  ];
  return {
    id: 'writer-latency',
    title: '4. Writer latency under the watermarker',
    method:
      `8 writers, open loop at ${txPerSec} transactions/s in all, one event each, latency from each transaction's scheduled start to COMMIT returning; ` +
      `${rounds} round(s) of ${windowMs / 1000} s windows rotating through the configurations. Step time: tidemark's is measured on the server, from the start ` +
      'of a step to its COMMIT, read off the loop\'s log buckets (about 5% wide); the reference\'s on the client, from its lock statement to COMMIT returning (its exclusive hold). ' +
      'Watermarker CPU is its process plus its server backends, in % of one core.',
    columns: ['configuration', 'writer p50 ms', 'writer p99 ms', 'p99 / none', 'step p50 ms', 'step p99 ms', 'steps', 'watermarker CPU %', 'tx/s'],
    rows,
    notes: [],
    goals,
    elapsedMs: performance.now() - t0,
  };
}
