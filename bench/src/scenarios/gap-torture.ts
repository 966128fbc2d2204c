import type { ChildProcess } from 'node:child_process';
import { check, committedCount, deliveredCount, type Verdict } from '../checker.js';
import { inWaves, installedDatabase, settle, type BenchContext } from '../context.js';
import { runLoad } from '../load.js';
import type { ScenarioResult } from '../report.js';
import { spawnWorker } from '../worker.js';
import type { Contender } from '../contenders/types.js';

const CURSOR = 'c1';

interface Row {
  contender: Contender;
  verdict: Verdict;
  rolledBack: number;
  writeErrors: number;
  kills: number;
  drained: boolean;
}

/**
 * Writers whose transactions stay open 0-200 ms (1% for 5 s), 2% rolling
 * back, 1-3 events each, while the consumer process is SIGKILLed at random
 * moments and restarted; then the consumer drains and the checker compares
 * what committed with what its cursor delivered.
 */
async function torture(ctx: BenchContext, contender: Contender): Promise<Row> {
  const { url, pool } = await installedDatabase(ctx.server, contender, `gap_${contender.id}`);
  let consumer: ChildProcess | undefined;
  let kills = 0;
  const stopKilling = new AbortController();
  const services = await contender.services?.(url);
  // Resolves once the new consumer process is up (or gone): a process
  // starts slowly on a loaded machine, and is only killed once it runs.
  let ready: Promise<void> = Promise.resolve();
  const start = () => {
    const child = spawnWorker(['consume', contender.id, url, CURSOR, '100']);
    child.on('error', () => undefined);
    ready = new Promise<void>((resolve) => {
      child.on('message', (m: { type?: string }) => m.type === 'ready' && resolve());
      child.once('exit', () => resolve());
    });
    consumer = child;
  };
  try {
    start();
    const killer = (async () => {
      while (!stopKilling.signal.aborted) {
        await ready;
        await new Promise((r) => setTimeout(r, ctx.pick(300, 500) + Math.random() * ctx.pick(1200, 2500)));
        if (stopKilling.signal.aborted) break;
        consumer?.kill('SIGKILL');
        kills += 1;
        start();
      }
    })();
    const load = await runLoad(contender, url, {
      writers: 8,
      durationMs: ctx.pick(2000, 20000),
      eventsPerTx: () => 1 + Math.floor(Math.random() * 3),
      holdMs: () => (Math.random() < 0.01 ? ctx.pick(2000, 5000) : Math.random() * 200),
      rollback: () => Math.random() < 0.02,
      record: true,
    });
    stopKilling.abort();
    await killer;
    await ready;
    const committed = await committedCount(pool);
    const drained = await settle(
      async () => {
        const n = await deliveredCount(pool, CURSOR);
        return { done: n >= committed, progress: n };
      },
      ctx.pick(4000, 6000),
      ctx.pick(15000, 60000),
    );
    const verdict = await check(pool, CURSOR);
    return { contender, verdict, rolledBack: load.rolledBack, writeErrors: load.errors, kills, drained };
  } finally {
    stopKilling.abort();
    consumer?.kill('SIGKILL');
    await services?.stop();
    await pool.end();
  }
}

export async function gapTorture(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  ctx.progress.step('gap torture');
  const rows = await inWaves(ctx.contenders, 4, (c) => torture(ctx, c));
  const tidemark = rows.find((r) => r.contender.id === 'tidemark');
  const defects = (v: Verdict) => v.missing + v.duplicated + v.outOfOrder + v.unexpected;
  return {
    id: 'gap-torture',
    title: '1. Gap torture (correctness)',
    method:
      `8 writers, ${ctx.pick(2, 20)} s: transactions of 1-3 events stay open 0-200 ms after their inserts (1% for ${ctx.pick(2, 5)} s), 2% roll back; ` +
      `the consumer process is SIGKILLed ${ctx.pick('0.3-1.5', '0.5-3')} s after each start and restarted, then drains. One cursor per contender; ` +
      'each delivery is recorded in the handler transaction. Out of order counts first deliveries that came after a later event of the same writer. ' +
      'Contenders run four at a time, each on its own database.',
    columns: ['contender', 'committed', 'delivered', 'missing', 'duplicated', 'out of order', 'unexpected', 'rolled back', 'consumer kills', 'drained'],
    rows: rows.map((r) => [
      r.contender.title,
      r.verdict.committed,
      r.verdict.delivered,
      r.verdict.missing,
      r.verdict.duplicated,
      r.verdict.outOfOrder,
      r.verdict.unexpected,
      r.rolledBack,
      r.kills,
      r.drained ? 'yes' : 'no (stalled)',
    ]),
    notes: rows.filter((r) => r.writeErrors > 0).map((r) => `${r.contender.title}: ${r.writeErrors} writer transactions failed.`),
    goals: [
      {
        goal: 'gap torture: tidemark defects (missing + duplicated + out of order + unexpected)',
        target: '0',
        measured: tidemark ? `${defects(tidemark.verdict)} of ${tidemark.verdict.committed} committed` : 'not run',
        met: tidemark ? defects(tidemark.verdict) === 0 && tidemark.verdict.committed > 0 : null,
      },
    ],
    elapsedMs: performance.now() - t0,
  };
}
