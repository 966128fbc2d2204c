// Write an order and its event in one transaction, then publish safe_seq.
// Run: DATABASE_URL=postgres://... npx tsx examples/outbox.ts (each run places a new order)
import { randomUUID } from 'node:crypto';
import { append, createPool, migrate, Watermarker } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL });
await migrate(pool);
await pool.query('CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total numeric)');

const orderId = `o-${randomUUID()}`;
const client = await pool.connect();
try {
  await client.query('BEGIN');
  await client.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [orderId, 42]);
  const seq = await append(client, { stream: 'orders', kind: 'order.placed', key: orderId, payload: { total: 42 } });
  await client.query('COMMIT');
  console.log(`appended seq ${seq}`);
} catch (err) {
  await client.query('ROLLBACK');
  throw err;
} finally {
  client.release();
}

const watermarker = new Watermarker(pool);
const progress = await watermarker.step();
console.log(`${progress.outcome}: safe_seq = ${progress.safeSeq}`);
await watermarker.close();
await pool.end();
