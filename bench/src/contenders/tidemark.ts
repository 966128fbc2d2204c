import type pg from 'pg';
import { append, appendMany, migrate, StreamClient, Watermarker, type WatermarkerOptions } from 'tidemark';
import { benchPool } from '../db.js';
import { clientWriter, pause } from './common.js';
import type { BenchEvent, Contender, PlainInsert } from './types.js';

const STREAM = 'bench';

function toNew(e: BenchEvent) {
  return { stream: STREAM, kind: 'e', key: e.key, payload: { id: e.id } };
}

/** Same statement shapes as `append` / `appendMany`, into an unfenced copy of the events table. */
export function plainInsertLike(table: string): PlainInsert {
  const one = `INSERT INTO ${table} (stream, kind, key, payload, headers) VALUES ($1, $2, $3, $4, $5) RETURNING seq`;
  const many =
    `INSERT INTO ${table} (stream, kind, key, payload, headers) SELECT stream, kind, key, payload, headers ` +
    `FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[]) ` +
    `WITH ORDINALITY AS e(stream, kind, key, payload, headers, n) ORDER BY n RETURNING seq`;
  return async (client, events) => {
    if (events.length === 1) {
      const e = events[0]!;
      await client.query(one, [STREAM, 'e', e.key, JSON.stringify({ id: e.id }), '{}']);
    } else {
      await client.query(many, [
        events.map(() => STREAM),
        events.map(() => 'e'),
        events.map((e) => e.key),
        events.map((e) => JSON.stringify({ id: e.id })),
        events.map(() => '{}'),
      ]);
    }
  };
}

/** tidemark through its public API: append/appendMany, the Watermarker, StreamClient.tail. */
export function tidemarkContender(watermarker: WatermarkerOptions = {}): Contender {
  return {
    id: 'tidemark',
    title: 'tidemark',
    kind: 'tidemark',
    notes: [],
    async install(pool: pg.Pool) {
      await migrate(pool);
    },
    async plainTable(pool: pg.Pool) {
      await pool.query('CREATE TABLE IF NOT EXISTS bench_plain (LIKE tidemark.events INCLUDING ALL)');
      return plainInsertLike('bench_plain');
    },
    async services(url: string) {
      const pool = benchPool(url, 3, 'tidemark-bench-watermarker');
      const stop = new AbortController();
      const running = new Watermarker(pool, { owner: 'bench', ...watermarker }).run(stop.signal).catch(() => undefined);
      return {
        async stop() {
          stop.abort();
          await running;
          await pool.end();
        },
      };
    },
    writer(url: string) {
      return clientWriter(url, async (client, events) => {
        if (events.length === 1) await append(client, toNew(events[0]!));
        else await appendMany(client, events.map(toNew));
      });
    },
    async consume(url, handler, options) {
      const pool = benchPool(url, 3, 'tidemark-bench-consumer');
      const client = new StreamClient(pool, { batchSize: options.batchSize });
      try {
        while (!options.signal.aborted) {
          await client
            .tail(options.name, STREAM, (e, tx) => handler(tx, [{ id: Number(e.payload.id), key: e.key, seq: e.seq }]), { signal: options.signal })
            .catch(() => pause(100, options.signal));
        }
      } finally {
        await client.close();
        await pool.end();
      }
    },
  };
}
