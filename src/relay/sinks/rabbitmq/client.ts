/**
 * amqplib, an optional peer dependency: loaded when a RabbitMqSink first
 * connects, so that importing tidemark never loads it, and a user who
 * relays to RabbitMQ without it gets one line naming the package to install.
 */
import type * as Amqp from 'amqplib';
import { importOptional } from '../../../options.js';

let client: typeof Amqp | undefined;
let loading: Promise<typeof Amqp> | undefined;

/** Loads amqplib once; a failed load is tried again by the next call. */
export function loadAmqp(): Promise<typeof Amqp> {
  if (client) return Promise.resolve(client);
  loading ??= importOptional('amqplib', 'the RabbitMQ sink (relay --to amqp://...)', () => import('amqplib')).then(
    (loaded) => (client = loaded),
    (err: unknown) => {
      loading = undefined;
      throw err;
    },
  );
  return loading;
}

/** amqplib, once {@link loadAmqp} has resolved (every connection of the sink waits for it first). */
export function amqp(): typeof Amqp {
  if (!client) throw new Error('tidemark: amqplib is used before loadAmqp() resolved');
  return client;
}
