// A handler that keeps failing on one event: tried three times, then set
// aside as a dead letter, and the stream goes on. List, replay or discard
// it later (`npx tidemark dead-letters list`).
// Run: DATABASE_URL=postgres://... npx tsx examples/dead-letters.ts
import { append, createPool, listDeadLetters, migrate, StreamClient, Watermarker } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL });
await migrate(pool);
await pool.query('CREATE TABLE IF NOT EXISTS ledger (stream text, invoice text, amount int NOT NULL, PRIMARY KEY (stream, invoice))');

const stream = `payments-${Date.now().toString(36)}`; // a stream of this run's own
let last = 0n;
for (const [invoice, amount] of [['inv-1', 30], ['inv-2', -5], ['inv-3', 12]] as const) {
  last = await append(pool, { stream, kind: 'payment.received', key: invoice, payload: { amount } });
}

const stop = new AbortController();
const watermarker = new Watermarker(pool);
const watermarking = watermarker.run(stop.signal);
const client = new StreamClient(pool, {
  observer: (e) => e.type === 'handler:retry' && console.log(`seq ${e.seq}: try ${e.attempt} after a back-off`),
});
try {
  await client.tail(
    'ledger',
    stream,
    async (event, tx) => {
      const amount = Number(event.payload.amount);
      if (amount < 0) throw new Error(`negative amount on ${event.key}`);
      await tx.query('INSERT INTO ledger (stream, invoice, amount) VALUES ($1, $2, $3)', [stream, event.key, amount]);
      if (event.seq === last) stop.abort();
    },
    { signal: stop.signal, failures: { maxAttempts: 3, backoffMinMs: 50, onExhausted: 'dead-letter' } },
  );
} catch (err) {
  if (!stop.signal.aborted) throw err;
}

const { rows } = await pool.query('SELECT invoice, amount FROM ledger WHERE stream = $1 ORDER BY invoice', [stream]);
for (const row of rows) console.log(`booked ${row.invoice}: ${row.amount}`);
for (const d of await listDeadLetters(pool, { consumer: 'ledger', stream })) {
  console.log(`dead letter ${d.id}: seq ${d.seq}, ${d.key}, ${d.attempts} tries: ${d.lastError}`);
}
await watermarking;
await watermarker.close();
await client.close();
await pool.end();
