import { setTimeout as delay } from 'node:timers/promises';
import { appendMany } from '../../outbox/append.js';
import { StreamClient } from '../../consumer/stream-client.js';
import { quoteIdent } from '../../db/queryable.js';
import { migrate } from '../../schema/migrate.js';
import { Watermarker } from '../../watermark/watermarker.js';
import { readStatus } from '../../observability/status.js';
import type pg from 'pg';
import { sqlState, SQLSTATE } from '../../errors.js';
import { openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import { parseDuration } from '../duration.js';

export interface DemoCommandOptions extends GlobalOptions {
  duration: string;
  writers: string;
}

/** The outcome `demo` judges: every committed event delivered once, in order; nothing else delivered. */
export interface Verdict {
  committed: number;
  rolledBack: number;
  delivered: number;
  duplicates: number;
  outOfOrder: number;
  missing: number;
  unexpected: number;
}

/** Compares what writers committed with what the consumer received, in order. */
export function judge(committed: Set<bigint>, rolledBack: number, delivered: bigint[]): Verdict {
  const seen = new Set<bigint>();
  let duplicates = 0;
  let outOfOrder = 0;
  let unexpected = 0;
  for (const [i, seq] of delivered.entries()) {
    if (seen.has(seq)) duplicates += 1;
    seen.add(seq);
    if (i > 0 && seq <= delivered[i - 1]!) outOfOrder += 1;
    if (!committed.has(seq)) unexpected += 1;
  }
  let missing = 0;
  for (const seq of committed) if (!seen.has(seq)) missing += 1;
  return { committed: committed.size, rolledBack, delivered: delivered.length, duplicates, outOfOrder, missing, unexpected };
}

/** Connections the demo holds besides one per writer: the watermarker, the tailer's page and listener, status reads, and slack. */
const INFRA_CONNECTIONS = 6;

/**
 * Refuses up front, in one line, when the server has fewer free connection
 * slots than the demo needs: writers that cannot connect would otherwise
 * leave the watermarker and the consumer waiting for a slot, and the demo
 * would sit at `safe_seq 0` without saying why.
 */
async function checkConnectionSlots(pool: pg.Pool, writers: number): Promise<void> {
  const { rows } = await pool.query<{ max: number; reserved: number; used: number }>(
    `SELECT current_setting('max_connections')::int AS max,
            CASE WHEN (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN 0
                 ELSE current_setting('superuser_reserved_connections')::int
                      + coalesce(current_setting('reserved_connections', true), '0')::int END AS reserved,
            (SELECT count(*)::int FROM pg_catalog.pg_stat_activity
              WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()) AS used`,
  );
  const { max, reserved, used } = rows[0]!;
  const needed = writers + INFRA_CONNECTIONS;
  const free = max - reserved - used;
  if (needed <= free) return;
  const fewer = free - INFRA_CONNECTIONS >= 1 ? `use --writers ${free - INFRA_CONNECTIONS} or fewer` : 'close other connections';
  throw new CliError(
    `--writers ${writers}: the demo needs ${needed} connections (one per writer and ${INFRA_CONNECTIONS} more), but the server has ${Math.max(free, 0)} free ` +
      `(max_connections ${max}, ${reserved} reserved, ${used} in use); ${fewer}, or raise max_connections`,
  );
}

/**
 * `tidemark demo [--duration 10s] [--writers 4]`: a live run of the whole
 * protocol in its own schema (default `tidemark_demo`, recreated): a
 * watermarker, concurrent writers (some slow, holding a low seq open while
 * later ones commit: real gaps; some rolling back), and a consumer. Shows
 * progress live, then a verdict; exit 0 only when nothing was lost,
 * duplicated, reordered or invented.
 */
export async function demoCommand(options: DemoCommandOptions): Promise<number> {
  const durationMs = parseDuration(options.duration, '--duration');
  const writerCount = positiveInt(options.writers, '--writers');
  const schema = options.schema;
  const db = await openDatabase(options, writerCount + INFRA_CONNECTIONS);
  try {
    await checkConnectionSlots(db.pool, writerCount);
  } catch (err) {
    await db.close();
    throw err;
  }
  const say = (line: string) => console.log(line);
  say(`tidemark demo: ${db.embedded ? 'embedded PostgreSQL' : 'DATABASE_URL'}, schema ${schema}, ${writerCount} writers, ${durationMs / 1000}s`);
  const stopWriters = new AbortController();
  const onSignal = () => stopWriters.abort();
  process.once('SIGINT', onSignal);
  try {
    await db.pool.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`);
    await migrate(db.pool, { schema });

    const committed = new Set<bigint>();
    const delivered: bigint[] = [];
    let rolledBack = 0;
    let slowOpen = 0;
    let maxCommitted = 0n;
    let safeSeq = 0n;

    const stopInfra = new AbortController();
    const watermarker = new Watermarker(db.pool, { schema, owner: 'demo-watermarker' });
    const watermarking = watermarker.run(stopInfra.signal);
    // safe_seq, and the writer it waits for, as an operator would see them.
    let blocker = '';
    const watch = async () => {
      const status = await readStatus(db.pool, schema, { streamCounts: false });
      safeSeq = status.safeSeq;
      const oldest = status.blockingWriters[0];
      blocker = oldest ? `  waits for pid ${oldest.pid ?? '-'} (${(oldest.ageSeconds ?? 0).toFixed(2)}s)` : '';
    };
    const client = new StreamClient(db.pool, { schema, pollIntervalMs: 200 });
    const consuming = client
      .tail('demo-consumer', 'demo', (event) => void delivered.push(event.seq), { signal: stopInfra.signal })
      .catch((err: unknown) => {
        if (!stopInfra.signal.aborted) throw err;
      });

    const writer = async (id: number) => {
      for (let n = 0; !stopWriters.signal.aborted; n += 1) {
        const client = await db.pool.connect();
        const roll = Math.random();
        let seqs: bigint[] = [];
        try {
          await client.query('BEGIN');
          const count = 1 + Math.floor(Math.random() * 3);
          const events = Array.from({ length: count }, (_, i) => ({ stream: 'demo', kind: 'tick', key: `writer-${id}`, payload: { n, i } }));
          seqs = await appendMany(client, events, { schema });
          if (roll < 0.08) {
            // A slow transaction holds its low seqs open while others commit above them.
            slowOpen += 1;
            await delay(50 + Math.random() * 250);
            slowOpen -= 1;
          }
          if (roll > 0.95) {
            await client.query('ROLLBACK');
            rolledBack += seqs.length;
          } else {
            await client.query('COMMIT');
            for (const seq of seqs) committed.add(seq);
            if (seqs.at(-1)! > maxCommitted) maxCommitted = seqs.at(-1)!;
          }
        } catch (err) {
          await client.query('ROLLBACK').catch(() => undefined);
          throw err;
        } finally {
          client.release();
        }
        await delay(Math.random() * 4);
      }
    };

    const started = Date.now();
    const line = () =>
      `${((Date.now() - started) / 1000).toFixed(1).padStart(5)}s  written ${String(committed.size).padStart(6)}  rolled back ${String(rolledBack).padStart(4)}` +
      `  safe_seq ${String(safeSeq).padStart(6)}  delivered ${String(delivered.length).padStart(6)}` +
      `  held back ${String(maxCommitted > safeSeq ? maxCommitted - safeSeq : 0n).padStart(4)}  slow tx open ${slowOpen}${blocker}`;
    const tty = process.stdout.isTTY;
    const ticker = setInterval(
      () => void watch().then(() => (tty ? process.stdout.write(`\r${line()}\x1b[K`) : say(line())), () => undefined),
      tty ? 200 : 1000,
    );
    const timer = setTimeout(() => stopWriters.abort(), durationMs);
    // A writer that fails stops the others, and the demo reports why
    // instead of waiting for a verdict that cannot come.
    const writers = Array.from({ length: writerCount }, (_, i) =>
      writer(i + 1).catch((err: unknown) => {
        stopWriters.abort();
        throw err;
      }),
    );
    const failed = (await Promise.allSettled(writers)).find((r): r is PromiseRejectedResult => r.status === 'rejected');
    clearTimeout(timer);
    if (failed) {
      clearInterval(ticker);
      stopInfra.abort();
      await Promise.allSettled([watermarking, consuming]);
      await client.close();
      await watermarker.close();
      if (sqlState(failed.reason) === SQLSTATE.tooManyConnections) {
        throw new CliError('a writer could not connect: the server ran out of connection slots during the demo (max_connections); use fewer --writers');
      }
      throw failed.reason;
    }

    // Let the watermark and the consumer catch up with everything committed.
    const deadline = Date.now() + 30_000;
    while ((safeSeq < maxCommitted || delivered.length < committed.size) && Date.now() < deadline) {
      await delay(20);
      await watch();
    }
    clearInterval(ticker);
    if (tty) process.stdout.write(`\r${line()}\n`);
    else say(line());
    stopInfra.abort();
    await Promise.all([watermarking, consuming]);
    await client.close();
    await watermarker.close();

    const v = judge(committed, rolledBack, delivered);
    say('');
    say(`committed    ${v.committed}`);
    say(`delivered    ${v.delivered}`);
    say(`rolled back  ${v.rolledBack} (never delivered)`);
    say(`duplicates   ${v.duplicates}`);
    say(`out of order ${v.outOfOrder}`);
    say(`missing      ${v.missing}`);
    say(`unexpected   ${v.unexpected}`);
    const pass = v.duplicates + v.outOfOrder + v.missing + v.unexpected === 0 && v.delivered === v.committed;
    say(
      pass
        ? `verdict: PASS: every committed event was delivered exactly once, in order, gaps and all (inspect: tidemark status --schema ${schema})`
        : 'verdict: FAIL',
    );
    return pass ? 0 : 1;
  } finally {
    process.off('SIGINT', onSignal);
    await db.close();
  }
}
