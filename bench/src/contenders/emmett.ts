/* eslint-disable @typescript-eslint/no-explicit-any -- the package is loaded at run time, untyped on purpose */
import { recordCommitted } from '../checker.js';
import { loadPeer, pause } from './common.js';
import type { BenchEvent, Contender, WriteOptions } from './types.js';

const TYPE = 'BenchEvent';
const load = () => loadPeer('@event-driven-io/emmett-postgresql', '0.42.0');

/** Per-append instructions for the inline projection, keyed by the first event's id. */
const pending = new Map<number, WriteOptions>();

/**
 * The inline projection runs inside appendToStream's transaction, after the
 * events are in and before COMMIT: it is where Emmett lets application code
 * share the events' transaction, so the ground-truth record, the hold and
 * the deliberate rollback happen there.
 */
const inline = {
  canHandle: [TYPE],
  async handle(events: any[], context: any): Promise<void> {
    const first = Number(events[0].data.id);
    const options = pending.get(first) ?? {};
    if (options.record) {
      await recordCommitted(
        context.connection.client,
        events.map((e) => ({ id: Number(e.data.id), key: String(e.data.key) })),
      );
    }
    const hold = (options.holdBeforeMs ?? 0) + (options.holdMs ?? 0);
    if (hold > 0) await pause(hold);
    if (options.rollback) throw new Error('bench: intended rollback');
  },
};

function store(mod: any, url: string): any {
  return mod.getPostgreSQLEventStore(url, { projections: [{ type: 'inline', projection: inline }] });
}

/**
 * Emmett's PostgreSQL event store through its public API: appendToStream to
 * write, a consumer with a reactor (checkpoint stored by Emmett in the
 * handler's transaction) to read.
 */
export const emmettContender: Contender = {
  id: 'emmett',
  title: '@event-driven-io/emmett-postgresql 0.42.0',
  kind: 'npm',
  notes: [
    '0.42.0 is the release the registry serves; its checkpoint is known upstream to lose events under contention (reads `transaction_id < pg_snapshot_xmin` ordered by (transaction_id, global_position) but resumes from a global_position); the fix is only in unreleased 0.43 betas',
    'appendToStream runs its own transaction; application work shares it through an inline projection',
    'consumer pull interval set to 5 ms (default 50 ms) to match the polling baselines; it applies only after a full batch: after a short one the puller waits 100 ms doubling to 1 s, which dominates its latency at moderate rates',
    'processor lock timeout set to 1 s: at the default (300 s) a consumer restarted after a SIGKILL cannot take its processor lock for five minutes',
  ],
  async install(pool) {
    const mod = await load();
    const url = (pool as any).options.connectionString as string;
    const s = store(mod, url);
    try {
      await s.schema.migrate();
    } finally {
      await s.close();
    }
  },
  async plainTable(pool) {
    await pool.query('CREATE TABLE IF NOT EXISTS bench_plain (LIKE emt_messages INCLUDING ALL)');
    return async (client, events) => {
      await client.query(
        `INSERT INTO bench_plain (stream_id, stream_position, partition, message_data, message_metadata, message_schema_version, message_type, message_kind, message_id, transaction_id)
         SELECT 'bench-' || k, i, 'emt:default', jsonb_build_object('id', i, 'key', k), '{}', '1', '${TYPE}', 'E', gen_random_uuid()::text, pg_current_xact_id()
         FROM unnest($1::text[], $2::bigint[]) AS t(k, i)`,
        [events.map((e) => e.key), events.map((e) => e.id)],
      );
    };
  },
  async writer(url) {
    const mod = await load();
    const s = store(mod, url);
    return {
      async write(events: BenchEvent[], options: WriteOptions = {}) {
        const first = events[0]!.id;
        pending.set(first, options);
        try {
          await s.appendToStream(
            `bench-${events[0]!.key}`,
            events.map((e) => ({ type: TYPE, data: { id: e.id, key: e.key } })),
          );
        } catch (err) {
          if (!options.rollback) throw err;
        } finally {
          pending.delete(first);
        }
      },
      close: () => s.close(),
    };
  },
  async consume(url, handler, options) {
    const mod = await load();
    const s = store(mod, url);
    try {
      while (!options.signal.aborted) {
        const consumer = s.consumer({ pulling: { batchSize: options.batchSize, pullingFrequencyInMs: 5 } });
        consumer.reactor({
          processorId: options.name,
          lock: { timeoutSeconds: 1 },
          eachMessage: async (event: any, context: any) => {
            await handler(context.connection.client, [{ id: Number(event.data.id), key: String(event.data.key) }]);
          },
        });
        const stop = () => void consumer.stop();
        options.signal.addEventListener('abort', stop, { once: true });
        try {
          await consumer.start();
        } catch {
          // e.g. the processor lock of a killed instance not yet expired
        } finally {
          options.signal.removeEventListener('abort', stop);
          await consumer.stop().catch(() => undefined);
        }
        await pause(200, options.signal);
      }
    } finally {
      await s.close();
    }
  },
};
