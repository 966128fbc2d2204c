import { createInterface } from 'node:readline';
import { appendMany, type NewEvent } from '../../outbox/append.js';
import { InvalidEventError } from '../../errors.js';
import { openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';

export interface AppendCommandOptions extends GlobalOptions {
  stream?: string;
  kind?: string;
  key?: string;
  payload?: string;
  headers?: string;
  ndjson?: boolean;
  batch?: string;
}

function parseObject(text: string | undefined, option: string): Record<string, unknown> | undefined {
  if (text === undefined) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new CliError(`${option}: not valid JSON`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new CliError(`${option}: expected a JSON object`);
  return value as Record<string, unknown>;
}

/**
 * `tidemark append --stream S --kind K --key KEY [--payload JSON] [--headers JSON]`
 * or `tidemark append --ndjson` (one event object per stdin line, appended in
 * transactions of `--batch` events). Prints the assigned seqs, one per line.
 * A bad line stops the command before its batch is written; earlier batches
 * are committed (their seqs were printed).
 */
export async function appendCommand(options: AppendCommandOptions): Promise<number> {
  const batchSize = positiveInt(options.batch ?? '500', '--batch');
  let single: NewEvent | undefined;
  if (!options.ndjson) {
    for (const name of ['stream', 'kind', 'key'] as const) {
      if (!options[name]) throw new CliError(`append: --${name} is required (or use --ndjson)`);
    }
    single = {
      stream: options.stream!,
      kind: options.kind!,
      key: options.key!,
      payload: parseObject(options.payload, '--payload'),
      headers: parseObject(options.headers, '--headers'),
    };
  } else if (options.stream || options.kind || options.key || options.payload || options.headers) {
    throw new CliError('append: --ndjson reads whole events from stdin; do not combine it with --stream/--kind/--key/--payload/--headers');
  }

  const db = await openDatabase(options);
  try {
    const write = async (events: NewEvent[], firstLine: number) => {
      const client = await db.pool.connect();
      try {
        await client.query('BEGIN');
        const seqs = await appendMany(client, events, { schema: options.schema });
        await client.query('COMMIT');
        for (const seq of seqs) console.log(seq.toString());
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        if (err instanceof InvalidEventError) throw new CliError(`line ${firstLine + err.index}: ${err.message}`, 1);
        throw err;
      } finally {
        client.release();
      }
    };
    if (single) {
      await write([single], 1);
      return 0;
    }
    let batch: NewEvent[] = [];
    let line = 0;
    let first = 1;
    for await (const text of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      line += 1;
      if (text.trim() === '') continue;
      let event: unknown;
      try {
        event = JSON.parse(text);
      } catch {
        throw new CliError(`line ${line}: not valid JSON`, 1);
      }
      if (batch.length === 0) first = line;
      batch.push(event as NewEvent);
      if (batch.length >= batchSize) {
        await write(batch, first);
        batch = [];
      }
    }
    if (batch.length > 0) await write(batch, first);
    return 0;
  } finally {
    await db.close();
  }
}
