/**
 * The NATS client packages (`@nats-io/transport-node`, `@nats-io/jetstream`),
 * optional peer dependencies: loaded when a NatsSink first connects, so
 * that importing tidemark never loads them, and a user who relays to NATS
 * without them gets one line naming the packages to install.
 */
import type * as Transport from '@nats-io/transport-node';
import type * as JetStream from '@nats-io/jetstream';
import { importOptional, loadOnce } from '../../../options.js';

export interface NatsClient {
  transport: typeof Transport;
  jetstream: typeof JetStream;
}

const FEATURE = 'the NATS JetStream sink (relay --to nats://...)';

const client = loadOnce('the NATS client packages', async (): Promise<NatsClient> => {
  const [transport, jetstream] = await Promise.all([
    importOptional('@nats-io/transport-node', FEATURE, () => import('@nats-io/transport-node')),
    importOptional('@nats-io/jetstream', FEATURE, () => import('@nats-io/jetstream')),
  ]);
  return { transport, jetstream };
});

/** Loads the packages once; a failed load is tried again by the next call. */
export const loadNats = client.load;

/** The packages, once {@link loadNats} has resolved (every connection of the sink waits for it first). */
export const nats = client.get;
