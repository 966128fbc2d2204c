/**
 * Scripted members of a consumer group in SQL (migration 0015): a beat, a
 * page applied to an `effects` table in its own transaction, and events
 * published for them. Consumer 'g', stream 's' unless told.
 */
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
