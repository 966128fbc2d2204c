import type pg from 'pg';
import type { BenchEvent, BenchTx } from './contenders/types.js';

/**
 * The gap checker. Writers record each committed event's id in
 * `bench_committed` inside their own transaction, so that table is exactly
 * what committed; handlers record each delivery in `bench_deliveries` inside
 * the contender's delivery transaction (or on their own, when it has none).
 */
export async function installChecker(pool: pg.Pool): Promise<void> {
  await pool.query(`
    CREATE TABLE IF NOT EXISTS bench_committed (event_id bigint PRIMARY KEY, key text NOT NULL);
    CREATE TABLE IF NOT EXISTS bench_deliveries (
      n bigserial PRIMARY KEY, consumer text NOT NULL, event_id bigint NOT NULL, key text NOT NULL);
    CREATE INDEX IF NOT EXISTS bench_deliveries_consumer ON bench_deliveries (consumer, event_id)`);
}

export async function recordCommitted(tx: BenchTx, events: BenchEvent[]): Promise<void> {
  await tx.query('INSERT INTO bench_committed (event_id, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [
    events.map((e) => e.id),
    events.map((e) => e.key),
  ]);
}

export async function recordDelivered(tx: BenchTx, consumer: string, events: BenchEvent[]): Promise<void> {
  if (events.length === 0) return;
  await tx.query('INSERT INTO bench_deliveries (consumer, event_id, key) SELECT $1, * FROM unnest($2::bigint[], $3::text[])', [
    consumer,
    events.map((e) => e.id),
    events.map((e) => e.key),
  ]);
}

/** The defect columns of one cursor. */
export interface Verdict {
  committed: number;
  delivered: number;
  missing: number;
  duplicated: number;
  outOfOrder: number;
  unexpected: number;
}

/**
 * Counts, for one cursor: committed events never delivered, deliveries of an
 * event after its first, first deliveries that came after a later event of
 * the same entity (each writer's transactions are sequential, so its ids
 * increase in commit order), and deliveries of events that never committed.
 */
export async function check(pool: pg.Pool, consumer: string): Promise<Verdict> {
  const r = await pool.query(
    `WITH mine AS (SELECT n, event_id, key FROM bench_deliveries WHERE consumer = $1),
          first AS (SELECT DISTINCT ON (event_id) n, event_id, key FROM mine ORDER BY event_id, n),
          ordered AS (
            SELECT event_id, max(event_id) OVER (PARTITION BY key ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
            FROM first)
     SELECT (SELECT count(*) FROM bench_committed)::int AS committed,
            (SELECT count(*) FROM mine)::int AS deliveries,
            (SELECT count(*) FROM first)::int AS distinct_delivered,
            (SELECT count(*) FROM bench_committed c WHERE NOT EXISTS (SELECT 1 FROM first f WHERE f.event_id = c.event_id))::int AS missing,
            (SELECT count(*) FROM first f WHERE NOT EXISTS (SELECT 1 FROM bench_committed c WHERE c.event_id = f.event_id))::int AS unexpected,
            (SELECT count(*) FROM ordered WHERE event_id < prev)::int AS out_of_order`,
    [consumer],
  );
  const row = r.rows[0];
  return {
    committed: row.committed,
    delivered: row.distinct_delivered,
    missing: row.missing,
    duplicated: row.deliveries - row.distinct_delivered,
    outOfOrder: row.out_of_order,
    unexpected: row.unexpected,
  };
}

/** Distinct events delivered to `consumer` so far. */
export async function deliveredCount(pool: pg.Pool, consumer: string): Promise<number> {
  const r = await pool.query('SELECT count(DISTINCT event_id)::int AS n FROM bench_deliveries WHERE consumer = $1', [consumer]);
  return r.rows[0].n;
}

export async function committedCount(pool: pg.Pool): Promise<number> {
  const r = await pool.query('SELECT count(*)::int AS n FROM bench_committed');
  return r.rows[0].n;
}
