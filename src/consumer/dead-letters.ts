/**
 * Dead letter administration: list them, ask for replays, discard them.
 *
 * A consumer whose `failures` policy is `onExhausted: 'dead-letter'` sets an
 * event aside after its last try (PROTOCOL §6.3). A replay is a request: the
 * consumer's own tailer (a tail or drain with that policy) delivers the
 * event to its handler again and deletes the dead letter in the handler's
 * transaction; a replay whose handler fails leaves it dead, one try more.
 * Discarding deletes it: the event stays skipped.
 */
import type pg from 'pg';
import { InvalidOptionsError } from '../errors.js';
import { quoteIdent, validateSchema, DEFAULT_SCHEMA } from '../db/queryable.js';
import { nameOption, poolOption } from '../options.js';
import type { EventRow } from './page.js';

/** One dead letter: the event as it was stored, its tries and its last error. */
export interface DeadLetter {
  id: bigint;
  consumer: string;
  stream: string;
  /** The partition of the event in the consumer's group; null for a consumer's own cursor. */
  partition: number | null;
  seq: bigint;
  kind: string;
  key: string;
  /** The payload as PostgreSQL's text. */
  payloadText: string;
  headersText: string;
  occurredAt: Date;
  /** Tries of its handler in all (the last included), replays too. */
  attempts: number;
  lastError: string;
  /** When it (last) failed its last try. */
  deadAt: Date;
  /** When a replay was asked for, until the consumer ran it. */
  replayRequestedAt: Date | null;
}

/** Which dead letters: all, a consumer's, a consumer's on one stream, or by id. */
export interface DeadLetterFilter {
  schema?: string;
  consumer?: string;
  stream?: string;
  ids?: readonly bigint[];
}

function where(filter: DeadLetterFilter): { sql: string; values: unknown[] } {
  const conditions: string[] = [];
  const values: unknown[] = [];
  if (filter.consumer !== undefined) {
    values.push(nameOption(filter.consumer, 'consumer'));
    conditions.push(`d.consumer = $${values.length}`);
  }
  if (filter.stream !== undefined) {
    values.push(nameOption(filter.stream, 'stream'));
    conditions.push(`d.stream = $${values.length}`);
  }
  if (filter.ids !== undefined) {
    if (!Array.isArray(filter.ids) || filter.ids.some((id) => typeof id !== 'bigint' || id < 1n)) {
      throw new InvalidOptionsError('ids', 'expected positive bigint ids');
    }
    values.push(filter.ids.map(String));
    conditions.push(`d.id = ANY ($${values.length}::bigint[])`);
  }
  return { sql: conditions.length ? `WHERE ${conditions.join(' AND ')}` : '', values };
}

interface Row extends EventRow {
  id: string;
  consumer: string;
  stream: string;
  partition: number | null;
  attempts: number;
  last_error: string;
  dead_at: Date;
  replay_requested_at: Date | null;
}

const COLUMNS = `d.id::text AS id, d.consumer, d.stream, d.partition, d.seq::text AS seq, d.kind, d.key, d.payload::pg_catalog.text AS payload,
  d.headers::pg_catalog.text AS headers, d.occurred_at, d.attempts, d.last_error, d.dead_at, d.replay_requested_at`;

function deadLetter(r: Row): DeadLetter {
  return {
    id: BigInt(r.id),
    consumer: r.consumer,
    stream: r.stream,
    partition: r.partition,
    seq: BigInt(r.seq),
    kind: r.kind,
    key: r.key,
    payloadText: r.payload,
    headersText: r.headers,
    occurredAt: r.occurred_at,
    attempts: r.attempts,
    lastError: r.last_error,
    deadAt: r.dead_at,
    replayRequestedAt: r.replay_requested_at,
  };
}

/** The dead letters `filter` selects, by consumer, stream and seq (a consumer role sees its own consumers' only). */
export async function listDeadLetters(pool: pg.Pool, filter: DeadLetterFilter = {}): Promise<DeadLetter[]> {
  const s = quoteIdent(validateSchema(filter.schema ?? DEFAULT_SCHEMA));
  const w = where(filter);
  const r = await poolOption(pool).query<Row>(`SELECT ${COLUMNS} FROM ${s}.dead_letters d ${w.sql} ORDER BY d.consumer, d.stream, d.seq`, w.values);
  return r.rows.map(deadLetter);
}

/**
 * Asks for the selected dead letters to be replayed; returns them. The
 * consumer's tailer replays them within its poll interval (or its next
 * drain), oldest event first. A filter that selects nothing is refused
 * (`ids`, or `consumer`, must be given: replaying every consumer's dead
 * letters at once is not an accident this should allow).
 */
export async function replayDeadLetters(pool: pg.Pool, filter: DeadLetterFilter): Promise<DeadLetter[]> {
  return change(pool, filter, 'UPDATE', 'SET replay_requested_at = pg_catalog.now()');
}

/** Deletes the selected dead letters (their events stay skipped); returns what was deleted. Needs `ids` or `consumer`, as {@link replayDeadLetters}. */
export async function discardDeadLetters(pool: pg.Pool, filter: DeadLetterFilter): Promise<DeadLetter[]> {
  return change(pool, filter, 'DELETE', '');
}

async function change(pool: pg.Pool, filter: DeadLetterFilter, verb: 'UPDATE' | 'DELETE', set: string): Promise<DeadLetter[]> {
  if (filter.ids === undefined && filter.consumer === undefined) {
    throw new InvalidOptionsError('ids', 'name the dead letters: ids, or a consumer (and a stream)');
  }
  const s = quoteIdent(validateSchema(filter.schema ?? DEFAULT_SCHEMA));
  const w = where(filter);
  const target = verb === 'UPDATE' ? `UPDATE ${s}.dead_letters d ${set}` : `DELETE FROM ${s}.dead_letters d`;
  const r = await poolOption(pool).query<Row>(`${target} ${w.sql} RETURNING ${COLUMNS}`, w.values);
  return r.rows.map(deadLetter).sort((a, b) => (a.consumer < b.consumer ? -1 : a.consumer > b.consumer ? 1 : a.stream < b.stream ? -1 : a.stream > b.stream ? 1 : Number(a.seq - b.seq)));
}
