// Drain rate of StreamClient against raw `ORDER BY seq LIMIT n` paging of the
// same rows, one sink row written per event in both, measured side by side.
// Run: npm run bench:drain -- [events]   (DATABASE_URL, default the local server)
import pg from 'pg';
import { migrate, StreamClient, Watermarker } from '../src/index.js';

const base = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const admin = new pg.Client(base);
await admin.connect();
const name = `tidemark_bench_drain_${process.pid}`;
await admin.query(`DROP DATABASE IF EXISTS ${name}`);
await admin.query(`CREATE DATABASE ${name}`);
const u = new URL(base);
u.pathname = `/${name}`;
const pool = new pg.Pool({ connectionString: u.toString(), max: 4 });
const n = Number(process.argv[2] ?? 100_000);
try {
  await migrate(pool);
  await pool.query(`INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 's', 'k', g::text, '{"a":1}' FROM generate_series(1, $1) g`, [n]);
  await pool.query('CREATE TABLE sink (seq bigint PRIMARY KEY)');
  await pool.query('VACUUM ANALYZE tidemark.events');
  await new Watermarker(pool).step();
  for (const batch of [100, 1000, 5000]) {
    await pool.query('TRUNCATE sink');
    // raw: page ORDER BY seq LIMIT batch, insert one row per event, same transaction shape
    const c = await pool.connect();
    let t0 = performance.now();
    let cursor = 0n;
    for (;;) {
      await c.query('BEGIN');
      const r = await c.query(`SELECT seq FROM tidemark.events WHERE stream = 's' AND seq > $1 ORDER BY seq LIMIT $2`, [cursor.toString(), batch]);
      for (const row of r.rows) await c.query('INSERT INTO sink VALUES ($1)', [row.seq]);
      await c.query('COMMIT');
      if (r.rows.length === 0) break;
      cursor = BigInt(r.rows.at(-1).seq);
    }
    const raw = (performance.now() - t0) / 1000;
    c.release();
    await pool.query('TRUNCATE sink');
    const client = new StreamClient(pool, { batchSize: batch, listen: false });
    t0 = performance.now();
    const res = await client.drain(`c${batch}`, 's', async (e, tx) => {
      await tx.query('INSERT INTO sink VALUES ($1)', [e.seq]);
    });
    const ours = (performance.now() - t0) / 1000;
    console.log(`batch ${batch}: raw ${(n / raw).toFixed(0)} ev/s, tidemark ${(res.delivered / ours).toFixed(0)} ev/s, ratio ${(raw / ours).toFixed(3)}`);
  }
} finally {
  await pool.end();
  await admin.query(`DROP DATABASE ${name}`);
  await admin.end();
}
