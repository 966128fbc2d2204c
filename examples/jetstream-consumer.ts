// Read the ORDERS JetStream stream back, as a service on another machine
// would: every event once, in seq order, with tidemark's headers.
// Run: NATS_URL=nats://127.0.0.1:4222 npx tsx examples/jetstream-consumer.ts
import { connect } from '@nats-io/transport-node';
import { jetstream } from '@nats-io/jetstream';

const nc = await connect({ servers: process.env.NATS_URL ?? 'nats://127.0.0.1:4222' });
const consumer = await jetstream(nc).consumers.get('ORDERS'); // an ordered consumer, from the start
const messages = await consumer.consume();
for await (const m of messages) {
  const seq = m.headers?.get('Tidemark-Seq'); // also Tidemark-Stream, -Kind, -Key, -Occurred-At, -Headers
  console.log(`${m.subject} seq ${seq}: ${m.string()}`);
  if (m.info.pending === 0) break; // caught up; a service keeps consuming
}
await nc.close();
