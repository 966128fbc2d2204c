// Two members of one consumer group share a stream: the events are split
// into 8 partitions by key, each member holds some of them by lease, and
// every key is handled in order. Start the same code in more processes to
// add members; stop one and its partitions move to the others.
// Run: DATABASE_URL=postgres://... npx tsx examples/groups.ts
import { append, createPool, migrate, StreamClient, Watermarker } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL, max: 12 });
await migrate(pool);
await pool.query(
  'CREATE TABLE IF NOT EXISTS shipments (n bigint GENERATED ALWAYS AS IDENTITY, stream text, seq bigint, parcel text, member text, PRIMARY KEY (stream, seq))',
);

const stream = `parcels-${Date.now().toString(36)}`; // a stream of this run's own
for (let i = 0; i < 60; i += 1) {
  await append(pool, { stream, kind: 'parcel.scanned', key: `parcel-${i % 12}`, payload: { scan: i } });
}

const stop = new AbortController();
const watermarker = new Watermarker(pool);
const watermarking = watermarker.run(stop.signal);
const members = ['east', 'west'].map(async (member) => {
  const client = new StreamClient(pool);
  try {
    await client.tailGroup(
      'shipping',
      stream,
      async (event, tx) => {
        await tx.query('INSERT INTO shipments (stream, seq, parcel, member) VALUES ($1, $2, $3, $4)', [stream, event.seq, event.key, member]);
      },
      { partitions: 8, member, signal: stop.signal },
    );
  } catch (err) {
    if (!stop.signal.aborted) throw err;
  } finally {
    await client.close();
  }
});
// Stop once all 60 are handled (each page commits its events with its partition's cursor).
while ((await pool.query('SELECT count(*)::int AS n FROM shipments WHERE stream = $1', [stream])).rows[0].n < 60) {
  await new Promise((resolve) => setTimeout(resolve, 50));
}
stop.abort();
await Promise.all(members);

const { rows } = await pool.query(
  `SELECT count(*)::int AS events, count(DISTINCT seq)::int AS once, bool_and(in_order) AS in_order
     FROM (SELECT seq, seq > coalesce(lag(seq) OVER (PARTITION BY parcel ORDER BY n), 0) AS in_order
             FROM shipments WHERE stream = $1) s`,
  [stream],
);
console.log(`handled ${rows[0].events} events, ${rows[0].once} once each; each parcel in order: ${rows[0].in_order}`);
await watermarking;
await watermarker.close();
await pool.end();
