/* eslint-disable @typescript-eslint/no-explicit-any -- the package is loaded at run time, untyped on purpose */
import { randomUUID } from 'node:crypto';
import { clientWriter, loadPeer, pause } from './common.js';
import type { Contender } from './types.js';

const load = () => loadPeer('pg-transactional-outbox', '0.5.7');

const SETUP = {
  outboxOrInbox: 'outbox',
  database: 'unused',
  schema: 'public',
  table: 'outbox',
  listenerRole: 'unused',
  nextMessagesName: 'next_outbox_messages',
};

function config(url: string, batchSize: number): any {
  return {
    outboxOrInbox: 'outbox',
    dbListenerConfig: { connectionString: url, application_name: 'tidemark-bench-consumer' },
    settings: {
      dbSchema: 'public',
      dbTable: 'outbox',
      nextMessagesFunctionName: 'next_outbox_messages',
      nextMessagesBatchSize: batchSize,
      nextMessagesPollingIntervalInMs: 5,
      nextMessagesLockInMs: 1000,
      enableMaxAttemptsProtection: false,
      enablePoisonousMessageProtection: false,
    },
  };
}

/**
 * pg-transactional-outbox in polling mode: `initializeMessageStorage` writes
 * in the caller's transaction; `initializePollingMessageListener` runs the
 * handler in a transaction that also marks the message processed. It is a
 * queue (a processed flag per message, one logical consumer), not a cursor.
 */
export const pgOutboxContender: Contender = {
  id: 'pg-transactional-outbox',
  title: 'pg-transactional-outbox 0.5.7 (polling)',
  kind: 'npm',
  notes: [
    'a queue with a processed flag per message, not a cursor: one logical consumer per table; each event uses its writer as segment (ordered per segment by created_at)',
    'polling interval set to 5 ms (default 500 ms) to match the polling baselines; message lock 1 s (default 5 s) so a killed consumer\'s messages return sooner',
  ],
  async install(pool) {
    const { DatabaseSetup } = await load();
    await pool.query(DatabaseSetup.dropAndCreateTable(SETUP));
    await pool.query(DatabaseSetup.createPollingFunction(SETUP));
    await pool.query(DatabaseSetup.setupPollingIndexes(SETUP));
  },
  async plainTable(pool) {
    await pool.query('CREATE TABLE IF NOT EXISTS bench_plain (LIKE outbox INCLUDING ALL)');
    return async (client, events) => {
      await client.query(
        `INSERT INTO bench_plain (id, aggregate_type, aggregate_id, message_type, segment, concurrency, payload, metadata, created_at)
         SELECT gen_random_uuid(), 'bench', k, 'E', k, 'sequential', jsonb_build_object('id', i), '{}', clock_timestamp()
         FROM unnest($1::text[], $2::bigint[]) AS t(k, i)`,
        [events.map((e) => e.key), events.map((e) => e.id)],
      );
    };
  },
  async writer(url) {
    const { initializeMessageStorage, getDisabledLogger } = await load();
    const store = initializeMessageStorage(config(url, 1), getDisabledLogger());
    return clientWriter(url, async (client, events) => {
      for (const e of events) {
        await store(
          { id: randomUUID(), aggregateType: 'bench', aggregateId: e.key, messageType: 'E', segment: e.key, concurrency: 'sequential', payload: { id: e.id } },
          client,
        );
      }
    });
  },
  async consume(url, handler, options) {
    const { initializePollingMessageListener, getDisabledLogger } = await load();
    const [shutdown] = initializePollingMessageListener(
      config(url, options.batchSize),
      [
        {
          aggregateType: 'bench',
          messageType: 'E',
          handle: async (message: any, client: any) => {
            await handler(client, [{ id: Number(message.payload.id), key: String(message.aggregateId) }]);
          },
        },
      ],
      getDisabledLogger(),
    );
    try {
      await new Promise<void>((resolve) => {
        if (options.signal.aborted) resolve();
        options.signal.addEventListener('abort', () => resolve(), { once: true });
      });
    } finally {
      await shutdown();
      await pause(0);
    }
  },
};
