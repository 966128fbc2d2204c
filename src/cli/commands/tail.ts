import { StreamClient } from '../../consumer/stream-client.js';
import type { StreamEvent } from '../../consumer/events.js';
import { ResyncRequiredError } from '../../errors.js';
import { nameOption } from '../../options.js';
import { configured, json, openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import { parseDuration } from '../duration.js';

export interface TailCommandOptions extends GlobalOptions {
  consumer: string;
  stream: string;
  bootstrap?: boolean;
  once?: boolean;
  json?: boolean;
  limit?: string;
  batch: string;
  poll: string;
}

function render(event: StreamEvent, asJson: boolean): string {
  if (asJson) return json(event);
  return `${event.seq}\t${event.kind}\t${event.key}\t${JSON.stringify(event.payload)}`;
}

/** Exit code of a resync: the consumer must bootstrap. */
export const RESYNC_EXIT = 3;

/**
 * `tidemark tail --consumer C --stream S [--bootstrap] [--once] [--json] [--limit N]`:
 * writes delivered events to stdout (NDJSON with `--json`), advancing the
 * durable cursor page by page. `--once` drains what is visible and exits;
 * otherwise it follows until SIGINT/SIGTERM or `--limit` events.
 * `--bootstrap` first moves the cursor to a fresh snapshot point (the CLI
 * has no projection to rebuild: it skips to the present).
 */
export async function tailCommand(options: TailCommandOptions): Promise<number> {
  const limit = options.limit === undefined ? undefined : positiveInt(options.limit, '--limit');
  const clientOptions = {
    schema: options.schema,
    batchSize: positiveInt(options.batch, '--batch'),
    pollIntervalMs: parseDuration(options.poll, '--poll'),
  };
  for (const name of ['consumer', 'stream'] as const) {
    try {
      nameOption(options[name], name);
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`); // "--consumer: expected ..."
    }
  }
  const db = await openDatabase(options, 3);
  const client = configured(() => new StreamClient(db.pool, clientOptions));
  const stop = new AbortController();
  const onSignal = () => stop.abort(new Error('interrupted'));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  // The reader went away (`tidemark tail ... | head`): stop like on SIGINT.
  // The page in flight commits only the events handled before the abort.
  let outputFailure: unknown; // a stdout error other than a closed pipe: exit 1
  const onStdoutError = (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE') outputFailure ??= err;
    stop.abort(new Error('stdout closed'));
  };
  process.stdout.on('error', onStdoutError);
  try {
    if (options.bootstrap) {
      const snap = await client.bootstrap(options.consumer, options.stream, { signal: stop.signal });
      await snap.commit();
      console.error(`tidemark: bootstrapped ${options.consumer} on ${options.stream}: cursor ${snap.priorSeq} -> ${snap.safeSeq}`);
    }
    let delivered = 0;
    const handler = (event: StreamEvent) => {
      process.stdout.write(`${render(event, options.json ?? false)}\n`);
      delivered += 1;
      if (limit !== undefined && delivered >= limit) stop.abort(new Error('limit reached'));
    };
    if (options.once) {
      const result = await client.drain(options.consumer, options.stream, handler, { signal: stop.signal, maxEvents: limit });
      console.error(`tidemark: delivered ${result.delivered}; cursor ${result.cursor}, safe_seq ${result.safeSeq}`);
      return 0;
    }
    await client.tail(options.consumer, options.stream, handler, { signal: stop.signal }).catch((err: unknown) => {
      if (!stop.signal.aborted) throw err;
    });
    if (outputFailure) throw outputFailure;
    return 0;
  } catch (err) {
    if (err instanceof ResyncRequiredError) {
      throw new CliError(
        `${err.message}. Rebuild what this consumer feeds, then run: tidemark tail --consumer ${options.consumer} --stream ${options.stream} --bootstrap`,
        RESYNC_EXIT,
      );
    }
    if (stop.signal.aborted && err === stop.signal.reason) {
      if (outputFailure) throw outputFailure;
      return 0;
    }
    throw err;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    process.stdout.off('error', onStdoutError);
    await client.close();
    await db.close();
  }
}
