// Relay the orders stream to NATS JetStream, from TypeScript: each event
// lands once, in seq order, in the JetStream stream TIDEMARK (the default,
// as for `tidemark relay`), and the relay's cursor moves only after
// JetStream acknowledged it.
// Run: DATABASE_URL=postgres://... NATS_URL=nats://127.0.0.1:4222 npx tsx examples/relay.ts
import { append, createPool, migrate, NatsSink, Relay, Watermarker } from 'tidemark';

const pool = createPool({ connectionString: process.env.DATABASE_URL });
await migrate(pool);
for (const [key, total] of [['o-1', 42], ['o-2', 7]] as const) {
  await append(pool, { stream: 'orders', kind: 'order.placed', key, payload: { total } });
}
const watermarker = new Watermarker(pool);
await watermarker.step(); // a service runs `tidemark serve` for this

const sink = new NatsSink({ url: process.env.NATS_URL ?? 'nats://127.0.0.1:4222', createStream: true });
// One consumer name per destination: this is the relay of the README's
// `tidemark relay --consumer to-nats`, to the same stream, so it goes on
// from the same cursors (a second one running at once waits as a standby).
const relay = new Relay(pool, sink, { consumer: 'to-nats', streams: ['orders'] });
await relay.open(); // fails fast when NATS is down or the stream is misconfigured
const stop = new AbortController(); // a service aborts on SIGTERM; this example when it caught up
const relaying = relay.run(stop.signal);
while ((await relay.lag()).some((lag) => lag.events > 0)) await new Promise((resolve) => setTimeout(resolve, 50));
stop.abort();
await relaying; // the page in flight is acknowledged and committed first
for (const { stream, cursor } of await relay.lag()) console.log(`relayed ${stream} through seq ${cursor}`);
await relay.close();
await watermarker.close();
await pool.end();
