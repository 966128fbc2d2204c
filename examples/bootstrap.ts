// Rebuild the order_totals projection from a snapshot, then resume tailing
// from exactly the seq the snapshot matches. Run after examples/consumer.ts.
import { createPool, StreamClient } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL });
const client = new StreamClient(pool);
{
  await using snap = await client.bootstrap('order-totals', 'orders');
  await snap.tx.query('DELETE FROM order_totals');
  // Rebuild from your own tables; here, from the events in the snapshot.
  await snap.tx.query(
    `INSERT INTO order_totals (customer, total)
     SELECT key, sum((payload->>'total')::numeric) FROM tidemark.events
      WHERE stream = 'orders' AND seq <= $1 GROUP BY key`,
    [snap.safeSeq],
  );
  await snap.commit(); // cursor = snap.safeSeq, atomically with the rebuild
  console.log(`rebuilt through seq ${snap.safeSeq} (cursor was ${snap.priorSeq})`);
}
const { delivered } = await client.drain('order-totals', 'orders', () => {
  throw new Error('nothing is left to deliver: the snapshot covered it');
});
console.log(`then delivered ${delivered}`);
await client.close();
await pool.end();
