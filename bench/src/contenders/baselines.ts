import type pg from 'pg';
import { Histogram } from '../histogram.js';
import { benchPool } from '../db.js';
import { CURSOR_TABLE, clientWriter, cursorLoop, pause } from './common.js';
import type { BenchEvent, Contender, PlainInsert } from './types.js';

/**
 * Strategy baselines: re-implementations of published mechanisms, each on
 * the same shared table. They are not anybody's product; they isolate one
 * idea each so its failure mode shows.
 */
const TABLE = `
  CREATE TABLE bench_events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL,
    payload jsonb NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id());
  CREATE INDEX bench_events_xid_seq ON bench_events (xid, seq);
  ${CURSOR_TABLE};`;

/** The advisory key of the reference design's fence (a small key: classid 0, objid = key). */
export const REFERENCE_FENCE = 7_414_245;

async function installTable(pool: pg.Pool): Promise<void> {
  await pool.query(TABLE);
}

async function plainCopy(pool: pg.Pool): Promise<PlainInsert> {
  await pool.query('CREATE TABLE IF NOT EXISTS bench_plain (LIKE bench_events INCLUDING ALL)');
  return insertInto('bench_plain');
}

function insertInto(table: string): PlainInsert {
  const sql = `INSERT INTO ${table} (key, payload) SELECT * FROM unnest($1::text[], $2::jsonb[])`;
  return async (client, events) => {
    await client.query(sql, [events.map((e) => e.key), events.map((e) => JSON.stringify({ id: e.id }))]);
  };
}

function rows(r: pg.QueryResult): BenchEvent[] {
  return r.rows.map((row) => ({ id: Number(row.payload.id), key: row.key as string }));
}

function lastSeq(r: pg.QueryResult, fallback: bigint): bigint {
  return r.rows.length > 0 ? BigInt(r.rows[r.rows.length - 1].seq) : fallback;
}

const plainWriter = (url: string) => clientWriter(url, (client, events) => insertInto('bench_events')(client, events));

/** `seq > cursor ORDER BY seq`: a number passed while still uncommitted is never read. */
export const naiveContender: Contender = {
  id: 'naive',
  title: 'baseline: naive seq > cursor',
  kind: 'baseline',
  notes: ['re-implementation on the shared baseline table; loses events that commit after a higher seq was read'],
  install: installTable,
  plainTable: plainCopy,
  writer: plainWriter,
  consume: (url, handler, options) =>
    cursorLoop(url, handler, options, async (tx, [, seq], limit) => {
      const r = await tx.query('SELECT seq, key, payload FROM bench_events WHERE seq > $1 ORDER BY seq LIMIT $2', [seq, limit]);
      return { events: rows(r), next: [0n, lastSeq(r, seq)] };
    }),
};

/** Reads rows whose writing transaction is older than every running one, but resumes by seq alone. */
export const xidPositionContender: Contender = {
  id: 'xid-position',
  title: 'baseline: xid horizon, position-only cursor',
  kind: 'baseline',
  notes: ['re-implementation: `xid < pg_snapshot_xmin(pg_current_snapshot())`, resumes from `seq > cursor`; an older xid that commits with a lower seq after a higher one was read is lost'],
  install: installTable,
  plainTable: plainCopy,
  writer: plainWriter,
  consume: (url, handler, options) =>
    cursorLoop(url, handler, options, async (tx, [, seq], limit) => {
      const r = await tx.query(
        `SELECT seq, key, payload FROM bench_events
         WHERE seq > $1 AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY xid, seq LIMIT $2`,
        [seq, limit],
      );
      const next = r.rows.reduce((m: bigint, row) => (BigInt(row.seq) > m ? BigInt(row.seq) : m), seq);
      return { events: rows(r), next: [0n, next] };
    }),
};

/** The same horizon with a compound (xid, seq) cursor: gap-free, but stalls behind any transaction with an xid. */
export const xidCompoundContender: Contender = {
  id: 'xid-compound',
  title: 'baseline: xid horizon, (xid, seq) cursor',
  kind: 'baseline',
  notes: ['re-implementation: `(xid, seq) > cursor AND xid < pg_snapshot_xmin(pg_current_snapshot())`; the horizon is cluster-wide'],
  install: installTable,
  plainTable: plainCopy,
  writer: plainWriter,
  consume: (url, handler, options) =>
    cursorLoop(url, handler, options, async (tx, [xid, seq], limit) => {
      const r = await tx.query(
        `SELECT seq, key, payload, xid::text::bigint AS x FROM bench_events
         WHERE (xid, seq) > ($1::text::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY xid, seq LIMIT $3`,
        [xid, seq, limit],
      );
      const last = r.rows[r.rows.length - 1];
      return { events: rows(r), next: last ? [BigInt(last.x), BigInt(last.seq)] : [xid, seq] };
    }),
};

const REFERENCE_TRIGGERS = `
  CREATE TABLE bench_safe (id int PRIMARY KEY, safe_seq bigint NOT NULL);
  INSERT INTO bench_safe VALUES (1, 0);
  CREATE FUNCTION bench_check_fence() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
                   AND classid = 0 AND objid = ${REFERENCE_FENCE} AND objsubid = 1 AND mode = 'ShareLock' AND granted) THEN
      RAISE EXCEPTION 'bench_events: take the fence first';
    END IF;
    RETURN NEW;
  END $$;
  CREATE TRIGGER bench_check_fence BEFORE INSERT ON bench_events FOR EACH ROW EXECUTE FUNCTION bench_check_fence();
  CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN PERFORM pg_notify('bench_events', ''); RETURN NULL; END $$;
  CREATE TRIGGER bench_notify AFTER INSERT ON bench_events FOR EACH STATEMENT EXECUTE FUNCTION bench_notify();`;

export interface ReferenceWatermarkerOptions {
  /** The fence's advisory key. */
  key: number | bigint;
  /** The table whose max(seq) is published. */
  events: string;
  /** Where safe_seq is published: a table with (id = 1, safe_seq). */
  safe: string;
  stepMs: number;
  /** Exclusive hold (lock granted -> COMMIT returned), per step. */
  hold?: Histogram;
}

/**
 * The reference design's watermarker: a blocking exclusive acquisition, one
 * statement per round trip, synchronous commit, every `stepMs`.
 */
export async function runReferenceWatermarker(pool: pg.Pool, options: ReferenceWatermarkerOptions, signal: AbortSignal): Promise<void> {
  const client = await pool.connect();
  try {
    while (!signal.aborted) {
      await client.query('BEGIN');
      await client.query('SELECT pg_advisory_xact_lock($1)', [String(options.key)]);
      const granted = performance.now();
      const max = await client.query(`SELECT coalesce(max(seq), 0) AS m FROM ${options.events}`);
      await client.query(`UPDATE ${options.safe} SET safe_seq = $1 WHERE id = 1 AND safe_seq < $1`, [max.rows[0].m]);
      await client.query('COMMIT');
      options.hold?.recordMs(performance.now() - granted);
      await pause(options.stepMs, signal);
    }
  } finally {
    client.release();
  }
}

/** The reference writer design: explicit fence call, a per-row pg_locks check trigger, a statement NOTIFY; consumers page below safe_seq. */
export function referenceContender(stepMs = 10): Contender {
  return {
    id: 'reference',
    title: 'baseline: reference fence design',
    kind: 'baseline',
    notes: [
      `re-implementation: writers call the fence explicitly; a per-row pg_locks check trigger and a statement-level NOTIFY on insert; a blocking watermarker every ${stepMs} ms with synchronous commit`,
    ],
    async install(pool) {
      await installTable(pool);
      await pool.query(REFERENCE_TRIGGERS);
    },
    plainTable: plainCopy,
    async services(url) {
      const pool = benchPool(url, 1, 'tidemark-bench-reference-watermarker');
      const stop = new AbortController();
      const running = runReferenceWatermarker(pool, { key: REFERENCE_FENCE, events: 'bench_events', safe: 'bench_safe', stepMs }, stop.signal).catch(
        () => undefined,
      );
      return {
        async stop() {
          stop.abort();
          await running;
          await pool.end();
        },
      };
    },
    writer: (url) =>
      clientWriter(url, async (client, events) => {
        await client.query('SELECT pg_advisory_xact_lock_shared($1)', [REFERENCE_FENCE]);
        await insertInto('bench_events')(client, events);
      }),
    consume: (url, handler, options) =>
      cursorLoop(url, handler, { ...options, isolation: 'REPEATABLE READ' }, async (tx, [, seq], limit) => {
        const r = await tx.query(
          `SELECT seq, key, payload FROM bench_events
           WHERE seq > $1 AND seq <= (SELECT safe_seq FROM bench_safe WHERE id = 1) ORDER BY seq LIMIT $2`,
          [seq, limit],
        );
        return { events: rows(r), next: [0n, lastSeq(r, seq)] };
      }),
  };
}

