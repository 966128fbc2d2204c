import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { runLoad, startTogether } from '../load.js';
import { median, ratioText, type Goal, type ScenarioResult } from '../report.js';
import { clientWriter } from '../contenders/common.js';

const SIZES = [1, 100];
/** Contenders whose writer path is the same as another's (the shared baseline table) are measured once. */
const SAME_WRITER_AS: Record<string, string> = { 'xid-position': 'naive', 'xid-compound': 'naive' };

/**
 * Writer-path throughput: 8 connections back to back, 1 or 100 events per
 * transaction, through the contender's own append, against a plain INSERT
 * of the same rows into an identical table with no fence, triggers or
 * locks. No watermarker runs: its effect on writers is scenario 4.
 *
 * Both sides run at once, 8 connections each, in windows of equal length,
 * and a window's ratio is the contender's events/s over the plain side's in
 * it; the scenario reports the median of the windows' ratios and their
 * range. The machine's drift is as large as the effect measured: with
 * synchronous commit one 2 s window differs from the next by up to 15%, and
 * when the sides took turns, an A/A comparison (the baseline contender,
 * whose writer and plain side are the same statements into identical
 * tables) measured 0.89 to 1.12 across runs; side by side in one window,
 * drift and the shared WAL flush fall on both sides alike (A/A 0.99-1.01
 * with pgbench on this machine). The sides share the server's commit
 * capacity: a contender that serialises its writers cedes it to the plain
 * side, and its ratio is lower than taking turns would show.
 */
export async function appendCost(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const windowMs = ctx.pick(300, 1000);
  const windows = ctx.pick(1, 10);
  const measured = ctx.contenders.filter((c) => !SAME_WRITER_AS[c.id] || !ctx.contenders.some((o) => o.id === SAME_WRITER_AS[c.id]));
  const rows: (string | number)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  for (const contender of measured) {
    const url = await ctx.server.freshDatabase(`append_${contender.id}`);
    const pool = benchPool(url, 2);
    try {
      await contender.install(pool);
      const plain = await contender.plainTable(pool);
      for (const size of SIZES) {
        ctx.progress.step(`append cost: ${contender.id}, ${size} event${size > 1 ? "s" : ""}/tx`);
        const totals = { contender: { events: 0, ms: 0, errors: 0 }, plain: { events: 0, ms: 0, errors: 0 } };
        const ratios: number[] = [];
        let firstError: string | undefined;
        for (let w = 0; w < windows; w += 1) {
          const ready = startTogether(2);
          const load = (side: 'plain' | 'contender') =>
            runLoad(contender, url, {
              writers: 8,
              durationMs: windowMs,
              eventsPerTx: () => size,
              keyPrefix: side === 'plain' ? 'p' : 'w',
              writer: side === 'plain' ? (u) => clientWriter(u, plain) : undefined,
              ready,
            });
          const [plainResult, contenderResult] = await Promise.all([load('plain'), load('contender')]);
          const windowRate = { plain: 0, contender: 0 };
          for (const [side, result] of [['plain', plainResult], ['contender', contenderResult]] as const) {
            totals[side].events += result.committedEvents;
            totals[side].ms += result.elapsedMs;
            totals[side].errors += result.errors;
            windowRate[side] = result.committedEvents / result.elapsedMs;
            firstError ??= result.firstError && `${contender.title}, ${side}, ${size}/tx: ${result.firstError}`;
          }
          if (windowRate.plain > 0) ratios.push(windowRate.contender / windowRate.plain);
        }
        const rate = (t: { events: number; ms: number }) => (t.events / t.ms) * 1000;
        const ratio = ratios.length ? median(ratios) : 0;
        const range = ratios.length ? `${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}` : '-';
        const title = contender.id === 'naive' ? 'baseline table (naive and both xid horizons)' : contender.title;
        rows.push([title, size, rate(totals.contender), rate(totals.plain), ratio, range, totals.contender.errors + totals.plain.errors]);
        if (firstError) notes.push(`First error: ${firstError}`);
        if (contender.id === 'tidemark') {
          goals.push({
            goal: `append cost: tidemark / plain INSERT at ${size} event${size > 1 ? 's' : ''}/tx, 8 connections`,
            target: '>= 0.93',
            measured: ratioText(ratio, 0.93),
            met: ratio >= 0.93,
          });
        }
      }
    } finally {
      await pool.end();
    }
  }
  return {
    id: 'append-cost',
    title: '3. Append cost',
    method:
      `${windows} windows of ${windowMs / 1000} s, each with 8 connections back to back through the contender's append and, at the same time, 8 through a plain INSERT ` +
      'into an identical copy of the contender\'s own table (same columns, defaults, constraints and indexes, no fence, triggers or locks); ' +
      'ratio = the median over the windows of contender events/s over plain events/s, with the windows\' range; events/s are the sides\' totals. ' +
      'The baseline table\'s row compares identical statements on identical tables: its range is the noise of the method. The sides share the server\'s ' +
      'commit capacity, so a contender that serialises its writers cedes it to the plain side and shows a lower ratio than it would alone. No watermarker runs.',
    columns: ['contender', 'events/tx', 'events/s', 'plain events/s', 'ratio (median)', 'window ratios', 'errors'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}
