/**
 * Scripted members of a consumer group in SQL (migration 0015): a beat, a
 * page applied to an `effects` table in its own transaction, and events
 * published for them. Consumer 'g', stream 's' unless told.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Watermarker } from '../../src/index.js';
import type { Session, TestDb } from './db.js';

export const RR = 'BEGIN ISOLATION LEVEL REPEATABLE READ';

/** The documented partition function, in JavaScript. */
export function partitionOf(key: string, partitions: number): number {
  return createHash('md5').update(key, 'utf8').digest().readUInt32BE(0) % partitions;
}

/** Appends one event per key (in order), commits and publishes them; returns their seqs. */
export async function publish(db: TestDb, keys: string[], stream = 's'): Promise<bigint[]> {
  const writer = await db.session('writer');
  const r = await writer.query<{ seq: string }>(
    `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT $1, 'k', k, pg_catalog.jsonb_build_object('i', i)
       FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i RETURNING seq`,
    [stream, keys],
  );
  const watermarker = new Watermarker(db.pool({ max: 1 }), { owner: 'test' });
  await watermarker.step();
  await watermarker.close();
  return r.rows.map((row) => BigInt(row.seq)).sort((a, b) => (a < b ? -1 : 1));
}

/** `member`'s beat: the partitions it holds after it. */
export async function beat(session: Session, member: string, partitions = 4, ttlMs = 60_000, consumer = 'g'): Promise<number[]> {
  const r = await session.query<{ partition: number }>('SELECT partition FROM tidemark.group_beat($1, $2, $3, $4, $5)', [consumer, 's', partitions, member, ttlMs]);
  return r.rows.map((row) => row.partition);
}

/** The table a scripted page applies its events to: a seq twice fails the page. */
export async function createEffects(session: Session): Promise<void> {
  await session.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
}

/**
 * One page of `partition` as `member`, applied to `effects` (seq, key) in
 * the page's transaction, then advanced and committed. Returns the seqs.
 */
export async function page(session: Session, member: string, partition: number, max = 100): Promise<bigint[]> {
  await session.query(RR);
  try {
    const r = await session.query<{ seq: string; key: string }>('SELECT seq, key FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', partition, member, max]);
    await session.query('INSERT INTO effects (seq, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [r.rows.map((x) => x.seq), r.rows.map((x) => x.key)]);
    const through = (await session.query<{ through: string }>('SELECT through FROM tidemark.partition_page_info($1, $2, $3)', ['g', 's', partition])).rows[0]!.through;
    const last = r.rows.at(-1)?.seq ?? through;
    await session.query('SELECT tidemark.advance_partition($1, $2, $3, $4, $5)', ['g', 's', partition, member, r.rows.length < max ? through : last]);
    await session.query('COMMIT');
    return r.rows.map((x) => BigInt(x.seq));
  } catch (err) {
    await session.query('ROLLBACK');
    throw err;
  }
}

/** A re-partition's state, as repartition_group and finish_repartition return it (migration 0017). */
export interface RepartitionRow {
  partitions: number;
  next_partitions: number | null;
  barrier: string | null;
  since_seq: string;
  behind: number | null;
}

/** repartition_group of group 'g' on 's'. */
export const repartition = async (session: Session, partitions: number): Promise<RepartitionRow> =>
  (await session.query<RepartitionRow>(`SELECT * FROM tidemark.repartition_group('g', 's', $1)`, [partitions])).rows[0]!;

/** finish_repartition of group 'g' on 's'. */
export const finish = async (session: Session): Promise<RepartitionRow> =>
  (await session.query<RepartitionRow>(`SELECT * FROM tidemark.finish_repartition('g', 's')`)).rows[0]!;

/** One page of each of partitions 0..partitions-1 as `member`: the seqs applied. */
export async function drainAll(session: Session, member: string, partitions: number): Promise<bigint[]> {
  const seqs: bigint[] = [];
  for (let p = 0; p < partitions; p += 1) seqs.push(...(await page(session, member, p)));
  return seqs;
}

/** Every event of `expected` applied once (effects), and each key's events applied in seq order. */
export async function assertExactlyOnceInOrder(db: TestDb, expected: bigint[]): Promise<void> {
  const byValue = (a: bigint, b: bigint) => (a < b ? -1 : 1);
  const r = await db.observer.query<{ seq: string; key: string }>('SELECT seq, key FROM effects ORDER BY at');
  const applied = r.rows.map((row) => BigInt(row.seq));
  assert.deepEqual([...applied].sort(byValue), [...expected].sort(byValue), 'every event once (effects.seq is a primary key: none twice)');
  const last = new Map<string, bigint>();
  for (const row of r.rows) {
    const seq = BigInt(row.seq);
    const before = last.get(row.key);
    assert.ok(before === undefined || before < seq, `key ${row.key}: ${seq} applied after ${before}`);
    last.set(row.key, seq);
  }
}
