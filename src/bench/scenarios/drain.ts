import { StreamClient } from '../../consumer/stream-client.js';
import { Watermarker } from '../../watermark/watermarker.js';
import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';

const BATCHES = [100, 1000, 5000];

/**
 * A preloaded backlog, drained by a consumer whose handler writes one row
 * per event, against raw `ORDER BY seq LIMIT n` paging of the same rows
 * with the same sink write in the same transaction shape. Each run starts a
 * fresh cursor at the beginning of the backlog and stops after `take`
 * events; runs alternate (raw, tidemark, tidemark, raw).
 */
export async function backlogDrain(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const backlog = ctx.pick(10_000, 1_000_000);
  const take = ctx.pick(3_000, 50_000);
  const rounds = 1;
  const url = await ctx.server.freshDatabase('drain');
  const pool = benchPool(url, 4);
  const rows: (string | number)[][] = [];
  const goals: Goal[] = [];
  try {
    await tidemarkContender().install(pool);
    ctx.progress.step(`backlog drain: preloading ${backlog.toLocaleString('en-US')} events`);
    for (let done = 0; done < backlog; done += 100_000) {
      await pool.query(
        `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 'bench', 'e', 'k' || (g % 64), jsonb_build_object('id', g) FROM generate_series($1::bigint, $2::bigint) g`,
        [done + 1, Math.min(backlog, done + 100_000)],
      );
    }
    await pool.query('VACUUM ANALYZE tidemark.events');
    // The preload leaves the cluster with a checkpoint's worth of dirty
    // buffers and the measured rows cold: flush (where the role may) and
    // read them once, so neither side pays for that in its timed run.
    await pool.query('CHECKPOINT').catch(() => undefined);
    await pool.query(`SELECT count(*), sum(length(payload::text)) FROM (SELECT payload FROM tidemark.events ORDER BY seq LIMIT $1) w`, [take]);
    await pool.query('CREATE UNLOGGED TABLE IF NOT EXISTS sink (id bigint)');
    await new Watermarker(pool, { owner: 'bench' }).step();
    let run = 0;
    for (const batch of BATCHES) {
      const rate = { raw: { events: 0, ms: 0 }, tidemark: { events: 0, ms: 0 } };
      for (let r = 0; r < rounds * 2; r += 1) {
        for (const side of r % 2 === 0 ? (['raw', 'tidemark'] as const) : (['tidemark', 'raw'] as const)) {
          ctx.progress.step(`backlog drain: batch ${batch}, ${side}`);
          await pool.query('TRUNCATE sink');
          run += 1;
          const start = performance.now();
          let delivered = 0;
          if (side === 'raw') {
            const c = await pool.connect();
            try {
              let cursor = '0';
              while (delivered < take) {
                await c.query('BEGIN');
                const page = await c.query(
                  `SELECT seq, stream, kind, key, payload, headers, occurred_at FROM tidemark.events WHERE stream = 'bench' AND seq > $1 ORDER BY seq LIMIT $2`,
                  [
                  cursor,
                    Math.min(batch, take - delivered),
                  ],
                );
                for (const row of page.rows) await c.query('INSERT INTO sink VALUES ($1)', [row.payload.id]);
                await c.query('COMMIT');
                if (page.rows.length === 0) break;
                delivered += page.rows.length;
                cursor = String(page.rows[page.rows.length - 1].seq);
              }
            } finally {
              c.release();
            }
          } else {
            const client = new StreamClient(pool, { batchSize: batch, listen: false });
            try {
              const res = await client.drain(`drain-${run}`, 'bench', async (e, tx) => {
                await tx.query('INSERT INTO sink VALUES ($1)', [e.payload.id]);
              }, { maxEvents: take });
              delivered = res.delivered;
            } finally {
              await client.close();
            }
          }
          rate[side].events += delivered;
          rate[side].ms += performance.now() - start;
        }
      }
      const perSec = (x: { events: number; ms: number }) => (x.events / x.ms) * 1000;
      const ratio = perSec(rate.tidemark) / perSec(rate.raw);
      rows.push([batch, perSec(rate.tidemark), perSec(rate.raw), ratio]);
      goals.push({ goal: `backlog drain: tidemark / raw paging at batch ${batch.toLocaleString('en-US')}`, target: '>= 0.8', measured: ratioText(ratio, 0.8), met: ratio >= 0.8 });
    }
  } finally {
    await pool.end();
  }
  return {
    id: 'drain',
    title: '6. Backlog drain',
    method:
      `${backlog.toLocaleString('en-US')} events preloaded, then VACUUM ANALYZE, CHECKPOINT and one untimed read of the measured rows; each run drains the first ${take.toLocaleString('en-US')} from a fresh cursor, the handler inserting one row per event ` +
      `into an unlogged sink; runs alternate raw, tidemark, tidemark, raw per batch size. Raw paging is \`SELECT <the same columns> ... WHERE seq > $cursor ORDER BY seq LIMIT n\` with the same inserts, one transaction per page.`,
    columns: ['batch', 'tidemark events/s', 'raw paging events/s', 'ratio'],
    rows,
    notes: [],
    goals,
    elapsedMs: performance.now() - t0,
  };
}
