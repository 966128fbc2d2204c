/**
 * A live torture run: writers of every shape (single inserts, multi-statement
 * transactions, savepoints rolled back and released, failing statements,
 * INSERT ... SELECT, COPY, rollbacks, transactions held open), the
 * watermarker's loop inside PostgreSQL at its defaults, and a tailer. Every
 * committed event must be delivered exactly once, in seq order; nothing
 * else. The pacing sleeps only shape the interleavings; no assertion
 * depends on timing.
 */
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as delay } from 'node:timers/promises';
import { after, test } from 'node:test';
import type pg from 'pg';
import { from as copyFrom } from 'pg-copy-streams';
import { StreamClient, Watermarker } from '../../src/index.js';
import { closeAdmin, testDb, waitFor } from '../support/db.js';

after(closeAdmin);

const WRITERS = 6;
const WRITE_MS = 5000;

type Shape = 'single' | 'multi' | 'savepoint' | 'failing' | 'select' | 'copy' | 'rollback';
const SHAPES: Shape[] = ['single', 'single', 'multi', 'savepoint', 'savepoint', 'failing', 'select', 'copy', 'rollback'];

const pick = <T>(xs: readonly T[]): T => xs[Math.floor(Math.random() * xs.length)]!;

/** One writer transaction of a random shape; returns the keys it committed. */
async function writeOnce(client: pg.PoolClient, prefix: string): Promise<string[]> {
  let n = 0;
  const key = () => `${prefix}-${n++}`;
  const insert = async (kept: string[], into: string[] = kept) => {
    const k = key();
    await client.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('t', 'k', $1)`, [k]);
    into.push(k);
  };
  const kept: string[] = [];
  const shape = pick(SHAPES);
  await client.query('BEGIN');
  try {
    switch (shape) {
      case 'single':
        await insert(kept);
        break;
      case 'multi':
        await insert(kept);
        await client.query('UPDATE torture_side SET n = n + 1');
        await insert(kept);
        break;
      case 'savepoint': {
        await insert(kept);
        await client.query('SAVEPOINT a');
        const inner: string[] = [];
        await insert(kept, inner);
        await insert(kept, inner);
        if (Math.random() < 0.5) await client.query('ROLLBACK TO SAVEPOINT a');
        else {
          await client.query('RELEASE SAVEPOINT a');
          kept.push(...inner);
        }
        await insert(kept);
        break;
      }
      case 'failing':
        // Draws a seq inside a savepoint, fails, and goes on.
        await insert(kept);
        await client.query('SAVEPOINT f');
        await client.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('t', 'k', 'never', '[]')`).catch(() => undefined);
        await client.query('ROLLBACK TO SAVEPOINT f');
        await insert(kept);
        break;
      case 'select': {
        const keys = [key(), key(), key()];
        await client.query(`INSERT INTO tidemark.events (stream, kind, key) SELECT 't', 'k', k FROM unnest($1::text[]) k`, [keys]);
        kept.push(...keys);
        break;
      }
      case 'copy': {
        const keys = Array.from({ length: 2 + Math.floor(Math.random() * 4) }, key);
        await pipeline(Readable.from(keys.map((k) => `t\tk\t${k}\n`)), client.query(copyFrom(`COPY tidemark.events (stream, kind, key) FROM STDIN`)));
        kept.push(...keys);
        break;
      }
      case 'rollback':
        await insert([]);
        await client.query('ROLLBACK');
        return [];
    }
    // Hold the transaction open: usually briefly, sometimes long.
    const r = Math.random();
    await delay(r < 0.02 ? 300 : r < 0.3 ? Math.random() * 30 : 0);
    if (Math.random() < 0.03) {
      await client.query('ROLLBACK');
      return [];
    }
    await client.query('COMMIT');
    return kept;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

test('live torture: every committed event of every writer shape is delivered exactly once, in order', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE torture_side (n int); INSERT INTO torture_side VALUES (0)');
  const writers = db.pool({ max: WRITERS });
  const infra = db.pool({ max: 4 });
  const stop = new AbortController();
  const watermarker = new Watermarker(infra, { summaryIntervalMs: 500 });
  const watermarking = watermarker.run(stop.signal);
  const consumer = new StreamClient(infra, { batchSize: 50 });
  const delivered: { seq: bigint; key: string }[] = [];
  const tailing = consumer.tail('torture', 't', (e) => void delivered.push({ seq: e.seq, key: e.key }), { signal: stop.signal }).catch((err: unknown) => {
    if (!stop.signal.aborted) throw err;
  });
  db.defer(async () => {
    stop.abort();
    await Promise.all([watermarking, tailing]);
    await consumer.close();
    await watermarker.close();
  });

  const committed = new Set<string>();
  const deadline = Date.now() + WRITE_MS;
  await Promise.all(
    Array.from({ length: WRITERS }, async (_, w) => {
      const client = await writers.connect();
      try {
        for (let i = 0; Date.now() < deadline; i += 1) {
          for (const k of await writeOnce(client, `w${w}-${i}`)) committed.add(k);
        }
      } finally {
        client.release();
      }
    }),
  );
  assert.ok(committed.size > 100, `a real load: ${committed.size} events committed`);

  // Writers are done: wait until safe_seq covers every number drawn and the
  // tailer's cursor has caught up with it.
  await waitFor('safe_seq to cover every number drawn, and the tailer to catch up', async () => {
    const r = await db.observer.query(
      `SELECT w.safe_seq >= coalesce(pg_sequence_last_value('tidemark.events_seq_seq'), 0)
              AND c.seq >= (SELECT max(seq) FROM tidemark.events WHERE stream = 't') AS done
         FROM tidemark.watermark w, tidemark.cursors c WHERE c.consumer = 'torture'`,
    );
    return r.rows[0]?.done === true;
  });
  const keys = delivered.map((d) => d.key);
  const seen = new Set(keys);
  const missing = [...committed].filter((k) => !seen.has(k));
  const unexpected = keys.filter((k) => !committed.has(k));
  assert.deepEqual({ missing: missing.length, unexpected: unexpected.length, duplicates: keys.length - seen.size }, { missing: 0, unexpected: 0, duplicates: 0 });
  for (let i = 1; i < delivered.length; i += 1) assert.ok(delivered[i]!.seq > delivered[i - 1]!.seq, 'delivered in seq order');
  const stored = (await db.observer.query(`SELECT count(*)::int AS n FROM tidemark.events WHERE stream = 't'`)).rows[0].n;
  assert.equal(stored, committed.size, 'the table holds exactly the committed events');
});
