// A RabbitMQ consumer of relayed events: declares its queue, binds it to the
// relay's exchange, and prints each event once, dropping republished copies
// by message_id (the relay delivers at least once).
// Run it once before `tidemark relay --to amqp://...` (so the relay's messages
// have a queue to go to), and again to see what was relayed:
//   AMQP_URL=amqp://guest:guest@127.0.0.1:5672 npx tsx examples/rabbitmq-consumer.ts
import { connect } from 'amqplib';

const connection = await connect(process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672');
const channel = await connection.createChannel();
await channel.assertExchange('tidemark', 'topic', { durable: true });
await channel.assertQueue('orders', { durable: true });
await channel.bindQueue('orders', 'tidemark', 'orders.#'); // routing key {stream}.{kind}

const seen = new Set<string>(); // a service keeps this in its database, with its effects
let quiet!: () => void;
const done = new Promise<void>((resolve) => (quiet = resolve));
let idle = setTimeout(quiet, 1000); // this example stops once the queue is quiet; a service keeps consuming
await channel.consume('orders', (m) => {
  if (!m) return;
  const id = String(m.properties.messageId); // <schema>:<seq>
  if (!seen.has(id)) {
    seen.add(id);
    console.log(`${m.fields.routingKey} ${id}: ${m.content.toString()}`);
  }
  channel.ack(m);
  clearTimeout(idle);
  idle = setTimeout(quiet, 1000);
});
await done;
await connection.close();
