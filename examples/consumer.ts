// Project orders into a table, exactly once: the handler writes with the
// page's transaction, so the projection and the cursor commit together.
// Run: DATABASE_URL=postgres://... npx tsx examples/consumer.ts
import { append, createPool, migrate, StreamClient, Watermarker } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL });
await migrate(pool);
await pool.query('CREATE TABLE IF NOT EXISTS order_totals (customer text PRIMARY KEY, total numeric NOT NULL)');

let last = 0n;
for (const [customer, total] of [['ada', 30], ['bob', 12], ['ada', 5]] as const) {
  last = await append(pool, { stream: 'orders', kind: 'order.placed', key: customer, payload: { total } });
}

const stop = new AbortController(); // a service aborts on SIGTERM; this example when it caught up
const watermarker = new Watermarker(pool);
const watermarking = watermarker.run(stop.signal);
const client = new StreamClient(pool);
try {
  await client.tail(
    'order-totals',
    'orders',
    async (event, tx) => {
      await tx.query(
        `INSERT INTO order_totals (customer, total) VALUES ($1, $2)
         ON CONFLICT (customer) DO UPDATE SET total = order_totals.total + excluded.total`,
        [event.key, event.payload.total],
      );
      console.log(`seq ${event.seq}: ${event.kind} ${event.key}`);
      if (event.seq === last) stop.abort();
    },
    { signal: stop.signal },
  );
} catch (err) {
  // HandlerError, ResyncRequiredError (rebuild with client.bootstrap), or a
  // database error; isRetryable(err) says whether to simply start again.
  if (!stop.signal.aborted) throw err;
}

const { rows } = await pool.query('SELECT customer, total FROM order_totals ORDER BY customer');
for (const row of rows) console.log(`${row.customer}: ${row.total}`);
await watermarking;
await watermarker.close();
await client.close();
await pool.end();
