import { discardDeadLetters, listDeadLetters, replayDeadLetters, type DeadLetter, type DeadLetterFilter } from '../../consumer/dead-letters.js';
import { nameOption } from '../../options.js';
import { json, openDatabase, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import { table } from './status.js';

interface DeadLetterOptions extends GlobalOptions {
  consumer?: string;
  stream?: string;
  all?: boolean;
  json?: boolean;
}

/** `--consumer` / `--stream`, checked before anything connects. */
function filterOf(options: DeadLetterOptions): DeadLetterFilter {
  for (const name of ['consumer', 'stream'] as const) {
    if (options[name] === undefined) continue;
    try {
      nameOption(options[name], name);
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`);
    }
  }
  if (options.stream !== undefined && options.consumer === undefined) throw new CliError('--stream: give --consumer too');
  return { schema: options.schema, consumer: options.consumer, stream: options.stream };
}

/** The ids of `replay` and `discard`, or `--all` with `--consumer`: never every consumer's dead letters by accident. */
function selected(ids: string[], options: DeadLetterOptions): DeadLetterFilter {
  const filter = filterOf(options);
  for (const id of ids) {
    if (!/^[1-9]\d{0,18}$/.test(id) || BigInt(id) > 9223372036854775807n) throw new CliError(`expected dead letter ids (positive integers, as list shows them), got ${JSON.stringify(id)}`);
  }
  if (ids.length > 0 && options.all) throw new CliError('--all: give ids or --all, not both');
  if (ids.length === 0 && !options.all) throw new CliError('name the dead letters: their ids (see `tidemark dead-letters list`), or --all with --consumer');
  if (options.all && filter.consumer === undefined) throw new CliError('--all: give --consumer (and --stream) too');
  return ids.length > 0 ? { ...filter, ids: ids.map(BigInt) } : filter;
}

function printed(letters: DeadLetter[]): string {
  // The partition column only when a group's dead letter is among them.
  const groups = letters.some((d) => d.partition !== null);
  return table(
    ['id', 'consumer', 'stream', ...(groups ? ['partition'] : []), 'seq', 'key', 'kind', 'tries', 'dead since', 'replay', 'last error'],
    letters.map((d) => [
      String(d.id),
      d.consumer,
      d.stream,
      ...(groups ? [d.partition === null ? '-' : String(d.partition)] : []),
      String(d.seq),
      d.key,
      d.kind,
      String(d.attempts),
      d.deadAt.toISOString(),
      d.replayRequestedAt ? 'asked' : '-',
      d.lastError.split('\n')[0]!.slice(0, 80),
    ]),
  );
}

/** `tidemark dead-letters list [--consumer C [--stream S]] [--json]`. */
export async function deadLettersListCommand(options: DeadLetterOptions): Promise<number> {
  const filter = filterOf(options);
  const db = await openDatabase(options);
  try {
    const letters = await listDeadLetters(db.pool, filter);
    if (options.json) console.log(json(letters));
    else console.log(letters.length === 0 ? '(no dead letters)' : printed(letters));
    return 0;
  } finally {
    await db.close();
  }
}

/** `tidemark dead-letters replay <id...> | --all --consumer C [--stream S] [--json]`. */
export async function deadLettersReplayCommand(ids: string[], options: DeadLetterOptions): Promise<number> {
  const filter = selected(ids, options);
  const db = await openDatabase(options);
  try {
    const letters = await replayDeadLetters(db.pool, filter);
    if (options.json) console.log(json(letters));
    else {
      console.log(
        letters.length === 0
          ? 'no such dead letters; nothing to replay'
          : `asked to replay ${letters.length} dead letter${letters.length === 1 ? '' : 's'}: each consumer's tail with the dead-letter policy delivers them again, oldest first`,
      );
    }
    return 0;
  } finally {
    await db.close();
  }
}

/** `tidemark dead-letters discard <id...> | --all --consumer C [--stream S] [--json]`. */
export async function deadLettersDiscardCommand(ids: string[], options: DeadLetterOptions): Promise<number> {
  const filter = selected(ids, options);
  const db = await openDatabase(options);
  try {
    const letters = await discardDeadLetters(db.pool, filter);
    if (options.json) console.log(json(letters));
    else console.log(letters.length === 0 ? 'no such dead letters; nothing discarded' : `discarded ${letters.length} dead letter${letters.length === 1 ? '' : 's'} (their events stay skipped)`);
    return 0;
  } finally {
    await db.close();
  }
}
