import { spawn } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { StreamClient, Watermarker } from 'tidemark';
import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';

const BATCHES = [100, 1000, 5000];

/** The batch size at which the SQL consumer (psql) is measured against the TypeScript client. */
const SQL_BATCH = 1000;

/**
 * A preloaded backlog, drained by a consumer whose handler writes one row
 * per event, against raw `ORDER BY seq LIMIT n` paging of the same rows
 * with the same sink write in the same transaction shape. Each run starts a
 * fresh cursor at the beginning of the backlog and stops after `take`
 * events; runs alternate (raw, tidemark, tidemark, raw, ...). At batch
 * 1,000 a consumer written in SQL (read_page and advance_cursor, run by
 * psql) drains the same events, writing the same sink rows.
 */
export async function backlogDrain(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const backlog = ctx.pick(10_000, 1_000_000);
  const take = ctx.pick(3_000, 50_000);
  const rounds = ctx.pick(1, 2);
  const url = await ctx.server.freshDatabase('drain');
  const pool = benchPool(url, 4);
  const rows: (string | number)[][] = [];
  const goals: Goal[] = [];
  const perSec = (x: { events: number; ms: number }) => (x.events / x.ms) * 1000;
  let sqlRow: (string | number)[] | undefined;
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
    // A logged sink, as an application's table would be: with an unlogged
    // one, raw paging would commit without a WAL flush, which tidemark's
    // durable cursor always needs.
    await pool.query('CREATE TABLE IF NOT EXISTS sink (id bigint)');
    await pool.query('CREATE TABLE IF NOT EXISTS raw_cursor (id integer PRIMARY KEY, seq bigint NOT NULL)');
    await new Watermarker(pool, { owner: 'bench' }).step();
    let run = 0;
    for (const batch of BATCHES) {
      const rate = { raw: { events: 0, ms: 0 }, tidemark: { events: 0, ms: 0 }, durable: { events: 0, ms: 0 } };
      for (let r = 0; r < rounds * 2; r += 1) {
        for (const side of r % 2 === 0 ? (['raw', 'tidemark', 'durable'] as const) : (['durable', 'tidemark', 'raw'] as const)) {
          ctx.progress.step(`backlog drain: batch ${batch}, ${side}`);
          await pool.query('TRUNCATE sink');
          run += 1;
          const start = performance.now();
          let delivered = 0;
          if (side !== 'tidemark') {
            // Raw paging; `durable` also keeps its cursor in a table, in the
            // page's transaction, as an exactly-once consumer written by
            // hand must (one more round trip a page).
            const c = await pool.connect();
            try {
              let cursor = '0';
              if (side === 'durable') await c.query(`INSERT INTO raw_cursor VALUES ($1, 0)`, [run]);
              while (delivered < take) {
                await c.query('BEGIN');
                const page = await c.query(
                  `SELECT seq, stream, kind, key, payload, headers, occurred_at FROM tidemark.events WHERE stream = 'bench' AND seq > $1 ORDER BY seq LIMIT $2`,
                  [cursor, Math.min(batch, take - delivered)],
                );
                for (const row of page.rows) await c.query('INSERT INTO sink VALUES ($1)', [row.payload.id]);
                if (side === 'durable' && page.rows.length > 0) {
                  await c.query('UPDATE raw_cursor SET seq = $2 WHERE id = $1', [run, page.rows[page.rows.length - 1].seq]);
                }
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
      const ratio = perSec(rate.tidemark) / perSec(rate.raw);
      rows.push([batch, perSec(rate.tidemark), perSec(rate.raw), ratio, perSec(rate.durable), perSec(rate.tidemark) / perSec(rate.durable)]);
      goals.push({ goal: `backlog drain: tidemark / raw paging at batch ${batch.toLocaleString('en-US')}`, target: '>= 1.0', measured: ratioText(ratio, 1), met: ratio >= 1 });
      if (batch === SQL_BATCH) {
        const sql = { events: 0, ms: 0 };
        for (let r = 0; r < rounds * 2; r += 1) {
          ctx.progress.step(`backlog drain: batch ${batch}, SQL consumer (psql)`);
          await pool.query('TRUNCATE sink');
          run += 1;
          const measured = await psqlDrain(url, pool, `drain-${run}`, take, batch);
          if (!measured) break;
          sql.events += measured.events;
          sql.ms += measured.ms;
        }
        if (sql.events > 0) {
          const ratio = perSec(sql) / perSec(rate.tidemark);
          sqlRow = [batch, perSec(sql), perSec(rate.tidemark), ratio];
          goals.push({ goal: `backlog drain: SQL consumer (psql) / TypeScript client at batch ${batch.toLocaleString('en-US')}`, target: '>= 0.9', measured: ratioText(ratio, 0.9), met: ratio >= 0.9 });
        } else {
          goals.push({ goal: `backlog drain: SQL consumer (psql) / TypeScript client at batch ${batch.toLocaleString('en-US')}`, target: '>= 0.9', measured: 'psql not found', met: null });
        }
      }
    }
  } finally {
    await pool.end();
  }
  return {
    id: 'drain',
    title: '6. Backlog drain',
    method:
      `${backlog.toLocaleString('en-US')} events preloaded, then VACUUM ANALYZE, CHECKPOINT and one untimed read of the measured rows; each run drains the first ${take.toLocaleString('en-US')} from a fresh cursor, the handler inserting one row per event ` +
      `into a (logged) sink table; runs alternate raw, tidemark, durable, then durable, tidemark, raw per batch size, ${rounds * 2} runs of each. Raw paging is \`SELECT <the same columns> ... WHERE seq > $cursor ORDER BY seq LIMIT n\` with the same inserts, one transaction per page, its cursor kept in memory only (3 round trips a page, besides the inserts; tidemark's page is 2, its cursor durable); \`raw + durable cursor\` also updates a cursor row in the page's transaction, as a hand-written exactly-once consumer must.`,
    columns: ['batch', 'tidemark events/s', 'raw paging events/s', 'ratio', 'raw + durable cursor events/s', 'ratio'],
    rows,
    notes: sqlRow
      ? [
          `SQL consumer (psql, read_page and advance_cursor, one statement per page) at batch ${SQL_BATCH.toLocaleString('en-US')}: ` +
            `${Math.round(Number(sqlRow[1])).toLocaleString('en-US')} events/s against the TypeScript client's ${Math.round(Number(sqlRow[2])).toLocaleString('en-US')}, ratio ${Number(sqlRow[3]).toFixed(2)}. ` +
            'It writes the same sink rows, set-based (one INSERT ... SELECT per page), as SQL would; the TypeScript handler inserts one row per event.',
        ]
      : [],
    goals,
    elapsedMs: performance.now() - t0,
  };
}

/**
 * Drains `take` events as `consumer` with psql running a script of one
 * statement per page (read_page, the sink rows, advance_cursor), each its
 * own REPEATABLE READ transaction. Undefined when psql is not installed.
 */
async function psqlDrain(url: string, pool: pg.Pool, consumer: string, take: number, batch: number): Promise<{ events: number; ms: number } | undefined> {
  const page =
    `WITH page AS (SELECT * FROM tidemark.read_page('${consumer}', 'bench', ${batch})), ` +
    `applied AS (INSERT INTO sink SELECT (payload->>'id')::bigint FROM page) ` +
    `SELECT tidemark.advance_cursor('${consumer}', 'bench', max(seq)) FROM page;\n`;
  const file = join(tmpdir(), `tidemark-bench-${process.pid}-${consumer}.sql`);
  await writeFile(file, `SET default_transaction_isolation = 'repeatable read';\n${page.repeat(Math.ceil(take / batch))}`);
  try {
    const start = performance.now();
    const code = await new Promise<number | string>((resolve) => {
      const child = spawn('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', url, '-f', file], { stdio: ['ignore', 'ignore', 'inherit'] });
      child.on('error', () => resolve('not found'));
      child.on('exit', (c, signal) => resolve(c ?? signal ?? -1));
    });
    const ms = performance.now() - start;
    if (code === 'not found') return undefined;
    if (code !== 0) throw new Error(`psql exited with ${code} while draining`);
    const r = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM sink');
    return { events: r.rows[0]!.n, ms };
  } finally {
    await rm(file, { force: true });
  }
}
