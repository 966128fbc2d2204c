/**
 * tidemark's reads of events parse PostgreSQL's text themselves
 * (src/db/types.ts): `occurred_at` is the instant PostgreSQL stored, to the
 * millisecond, in every session time zone, and an application's global
 * `pg.types` parsers change none of the events a consumer or the relay gets.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import fc from 'fast-check';
import pg from 'pg';
import { StreamClient, Watermarker, type StreamEvent } from '../../src/index.js';
import { parseTimestamptz } from '../../src/db/types.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

/** Time zones whose offsets are whole hours, half hours, negative, and (local mean time, before 1900) to the second. */
const ZONES = ['UTC', 'America/Los_Angeles', 'Asia/Kolkata', 'America/St_Johns', 'Pacific/Kiritimati', 'Europe/Amsterdam', 'Asia/Kathmandu'];
/** Microseconds since 1970 of 0001-01-01 and of 9999-12-31 (UTC). */
const FIRST_MICROS = -62_135_596_800_000_000n;
const LAST_MICROS = 253_402_214_400_000_000n;

test("parseTimestamptz gives the instant of PostgreSQL's own text of a timestamptz, truncated to the millisecond, in every session time zone", async (t) => {
  const db = await testDb(t, { migrated: false });
  const micros = fc.oneof(
    fc.bigInt({ min: FIRST_MICROS, max: LAST_MICROS }),
    // Around now, where events are; and whole seconds (no fraction printed).
    fc.bigInt({ min: 1_700_000_000_000_000n, max: 1_900_000_000_000_000n }),
    fc.bigInt({ min: -5_000_000_000n, max: 5_000_000_000n }).map((s) => s * 1_000_000n),
  );
  await fc.assert(
    fc.asyncProperty(fc.constantFrom(...ZONES), fc.array(micros, { minLength: 1, maxLength: 50 }), async (zone, values) => {
      await db.observer.query(`SET TimeZone = '${zone}'`);
      // (interval * bigint goes through float8: the instant is PostgreSQL's, read back exactly by extract.)
      const r = await db.observer.query<{ text: string; ms: string }>(
        `SELECT ts::text AS text, floor(extract(epoch FROM ts) * 1000)::text AS ms
           FROM unnest($1::int8[]) WITH ORDINALITY AS u(m, i), LATERAL (SELECT pg_catalog.to_timestamp(0) + m * interval '1 microsecond' AS ts) x ORDER BY i`,
        [values.map(String)],
      );
      for (const { text, ms } of r.rows) assert.equal(parseTimestamptz(text).getTime(), Number(ms), `${text} in ${zone}`);
    }),
    { numRuns: 60 },
  );
  // BC, and years PostgreSQL prints with five digits.
  for (const text of ['0044-03-15 12:00:00+00 BC', '12345-06-07 01:02:03.5+02', '0099-12-31 23:59:59.999999-03:30']) {
    const r = await db.observer.query<{ ms: string }>('SELECT floor(extract(epoch FROM $1::timestamptz) * 1000)::text AS ms', [text]);
    assert.equal(parseTimestamptz(text).getTime(), Number(r.rows[0]!.ms), text);
  }
  assert.ok(Number.isNaN(parseTimestamptz('infinity').getTime()), 'what is not a date is an invalid Date');
});

test("an application's global pg type parsers (bigint as a number, timestamptz as text) change none of the events a consumer gets", async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  await db.observer.query("INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 's', 'k', 'key', pg_catalog.jsonb_build_object('i', g) FROM generate_series(1, 6) g");
  const stored = await db.observer.query<{ seq: string; at: string }>("SELECT seq::text AS seq, floor(extract(epoch FROM occurred_at) * 1000)::text AS at FROM tidemark.events ORDER BY seq");
  await new Watermarker(pool).step();
  // Set from here on (the Watermarker's own reads still go through pg's parsers).
  const seq = pg.types.getTypeParser(20, 'text');
  const at = pg.types.getTypeParser(1184, 'text');
  pg.types.setTypeParser(20, (v: string) => Number(v) + 0.5);
  pg.types.setTypeParser(1184, (v: string) => `text:${v}`);
  t.after(() => {
    pg.types.setTypeParser(20, seq);
    pg.types.setTypeParser(1184, at);
  });
  // Pages of 2 read ahead: read_page, lock_page and the read ahead all go through tidemark's parsers.
  const client = new StreamClient(pool, { batchSize: 2, listen: false, prefetch: true });
  t.after(() => client.close());
  const seen: StreamEvent[] = [];
  const result = await client.drain('c', 's', (event) => void seen.push(event));
  assert.deepEqual(seen.map((e) => [e.seq, e.occurredAt instanceof Date ? e.occurredAt.getTime() : e.occurredAt]), stored.rows.map((r) => [BigInt(r.seq), Number(r.at)]));
  assert.equal(result.cursor, BigInt(stored.rows.at(-1)!.seq));
});
