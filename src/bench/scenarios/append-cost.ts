import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { runLoad } from '../load.js';
import { ratioText, type Goal, type ScenarioResult } from '../report.js';
import { clientWriter } from '../contenders/common.js';

const SIZES = [1, 100];
/** Contenders whose writer path is the same as another's (the shared baseline table) are measured once. */
const SAME_WRITER_AS: Record<string, string> = { 'xid-position': 'naive', 'xid-compound': 'naive' };

/**
 * Writer-path throughput: 8 connections back to back, 1 or 100 events per
 * transaction, through the contender's own append, against a plain INSERT
 * of the same rows into an identical table with no fence, triggers or
 * locks. Windows alternate (plain, contender, contender, plain, ...) so
 * drift on a shared machine falls on both sides. No watermarker runs: its
 * effect on writers is scenario 4.
 */
export async function appendCost(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const windowMs = ctx.pick(400, 2000);
  const rounds = 1;
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
        let firstError: string | undefined;
        for (let r = 0; r < rounds * 2; r += 1) {
          const order: ('plain' | 'contender')[] = r % 2 === 0 ? ['plain', 'contender'] : ['contender', 'plain'];
          for (const side of order) {
            const result = await runLoad(contender, url, {
              writers: 8,
              durationMs: windowMs,
              eventsPerTx: () => size,
              writer: side === 'plain' ? (u) => clientWriter(u, plain) : undefined,
            });
            totals[side].events += result.committedEvents;
            totals[side].ms += result.elapsedMs;
            totals[side].errors += result.errors;
            firstError ??= result.firstError && `${contender.title}, ${side}, ${size}/tx: ${result.firstError}`;
          }
        }
        const rate = (t: { events: number; ms: number }) => (t.events / t.ms) * 1000;
        const ratio = rate(totals.contender) / rate(totals.plain);
        const title = contender.id === 'naive' ? 'baseline table (naive and both xid horizons)' : contender.title;
        rows.push([title, size, rate(totals.contender), rate(totals.plain), ratio, totals.contender.errors + totals.plain.errors]);
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
      `8 connections back to back, ${rounds * 2} alternating windows of ${windowMs / 1000} s per side; ratio = contender events/s over plain INSERT events/s ` +
      'into an identical copy of the contender\'s own table (same columns, defaults and indexes, no fence, triggers or locks). No watermarker runs.',
    columns: ['contender', 'events/tx', 'events/s', 'plain events/s', 'ratio', 'errors'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}
