import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import { recordCommitted } from '../checker.js';
import { benchPool } from '../db.js';
import { ContenderUnavailable, type BatchHandler, type BenchEvent, type ConsumeOptions, type WriteOptions, type Writer } from './types.js';

/** Consumers that poll sleep this long after a short page. */
export const POLL_MS = 5;

/** Resolves after `ms`, or early (quietly) when `signal` aborts. */
export async function pause(ms: number, signal?: AbortSignal): Promise<void> {
  await sleep(ms, undefined, { signal }).catch(() => undefined);
}

/** Imports an npm peer (a dev dependency) at run time, untyped on purpose, or says how to install it. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function loadPeer(name: string, version: string): Promise<any> {
  try {
    const mod = await import(name);
    return mod.default ?? mod;
  } catch {
    throw new ContenderUnavailable(`${name} is not installed (npm install --save-dev ${name}@${version})`);
  }
}

/**
 * A writer on one pg.Client: BEGIN, `insert`, the ground-truth record, the
 * hold, COMMIT (or ROLLBACK). Used by every contender whose writes run in the
 * caller's transaction.
 */
export async function clientWriter(url: string, insert: (client: pg.Client, events: BenchEvent[]) => Promise<void>): Promise<Writer> {
  const client = new pg.Client({ connectionString: url, application_name: 'tidemark-bench-writer' });
  client.on('error', () => undefined);
  await client.connect();
  return {
    async write(events: BenchEvent[], options: WriteOptions = {}): Promise<void> {
      await client.query('BEGIN');
      try {
        // The application's own write comes first (it takes the xid), its
        // work spans both sides of the event insert.
        if (options.record) await recordCommitted(client, events);
        if (options.holdBeforeMs) await sleep(options.holdBeforeMs);
        await insert(client, events);
        if (options.holdMs) await sleep(options.holdMs);
        await client.query(options.rollback ? 'ROLLBACK' : 'COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw err;
      }
    },
    close: () => client.end(),
  };
}

/** A page read under the consumer's lock on its cursor row: the events and the cursor after them. */
export interface CursorPage {
  events: BenchEvent[];
  next: [bigint, bigint];
}

/**
 * The consumer loop of every re-implemented strategy: one transaction per
 * page locks the cursor row, reads a page after it, runs the handler,
 * advances the cursor and commits. Polls every POLL_MS when a page is short.
 */
export async function cursorLoop(
  url: string,
  handler: BatchHandler,
  options: ConsumeOptions & { isolation?: 'REPEATABLE READ' | 'READ COMMITTED'; initial?: [bigint, bigint] },
  page: (tx: pg.PoolClient, cursor: [bigint, bigint], limit: number) => Promise<CursorPage>,
): Promise<void> {
  const pool = benchPool(url, 1, `tidemark-bench-consumer`);
  const [a0, b0] = options.initial ?? [0n, 0n];
  try {
    await pool.query('INSERT INTO bench_cursors (name, a, b) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [options.name, a0, b0]);
    while (!options.signal.aborted) {
      let delivered = 0;
      const client = await pool.connect();
      try {
        await client.query(`BEGIN ISOLATION LEVEL ${options.isolation ?? 'READ COMMITTED'}`);
        const c = await client.query('SELECT a, b FROM bench_cursors WHERE name = $1 FOR UPDATE', [options.name]);
        const cursor: [bigint, bigint] = [BigInt(c.rows[0].a), BigInt(c.rows[0].b)];
        const { events, next } = await page(client, cursor, options.batchSize);
        if (events.length > 0) {
          await handler(client, events);
          await client.query('UPDATE bench_cursors SET a = $2, b = $3 WHERE name = $1', [options.name, next[0], next[1]]);
        }
        await client.query('COMMIT');
        delivered = events.length;
        client.release();
      } catch (err) {
        client.release(true);
        if (options.signal.aborted) break;
        await pause(100, options.signal);
        void err;
        continue;
      }
      if (delivered < options.batchSize) await pause(POLL_MS, options.signal);
    }
  } finally {
    await pool.end();
  }
}

/** The cursor table the re-implemented strategies share. */
export const CURSOR_TABLE = `CREATE TABLE IF NOT EXISTS bench_cursors (name text PRIMARY KEY, a bigint NOT NULL, b bigint NOT NULL)`;
