/**
 * The NATS client packages (`@nats-io/transport-node`, `@nats-io/jetstream`),
 * optional peer dependencies: loaded when a NatsSink first connects, so
 * that importing tidemark never loads them, and a user who relays to NATS
 * without them gets one line naming the packages to install.
 */
import type * as Transport from '@nats-io/transport-node';
import type * as JetStream from '@nats-io/jetstream';
import { importOptional } from '../../../options.js';

export interface NatsClient {
  transport: typeof Transport;
  jetstream: typeof JetStream;
}

const FEATURE = 'the NATS JetStream sink (relay --to nats://...)';
let client: NatsClient | undefined;
let loading: Promise<NatsClient> | undefined;

/** Loads the packages once; a failed load is tried again by the next call. */
export function loadNats(): Promise<NatsClient> {
  if (client) return Promise.resolve(client);
  loading ??= Promise.all([
    importOptional('@nats-io/transport-node', FEATURE, () => import('@nats-io/transport-node')),
    importOptional('@nats-io/jetstream', FEATURE, () => import('@nats-io/jetstream')),
  ]).then(
    ([transport, jetstream]) => (client = { transport, jetstream }),
    (err: unknown) => {
      loading = undefined;
      throw err;
    },
  );
  return loading;
}

/** The packages, once {@link loadNats} has resolved (every connection of the sink waits for it first). */
export function nats(): NatsClient {
  if (!client) throw new Error('tidemark: the NATS client packages are used before loadNats() resolved');
  return client;
}
