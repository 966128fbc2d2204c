// Read the TIDEMARK JetStream stream back, as a service on another machine
// would: every event once, in seq order, with tidemark's headers. This
// example stops when it has read what is there; a service keeps consuming.
// Run: NATS_URL=nats://127.0.0.1:4222 npx tsx examples/jetstream-consumer.ts
import { connect } from '@nats-io/transport-node';
import { jetstream } from '@nats-io/jetstream';

const nc = await connect({ servers: process.env.NATS_URL ?? 'nats://127.0.0.1:4222' });
const consumer = await jetstream(nc).consumers.get('TIDEMARK'); // an ordered consumer, from the start
if ((await consumer.info()).num_pending > 0) {
  for await (const m of await consumer.consume()) {
    const seq = m.headers?.get('Tidemark-Seq'); // also Tidemark-Stream, -Kind, -Key, -Occurred-At, -Headers
    console.log(`${m.subject} seq ${seq}: ${m.string()}`);
    if (m.info.pending === 0) break; // caught up
  }
}
await nc.close();
