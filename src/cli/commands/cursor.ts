import { deleteCursor, listCursors, setCursor, type CursorTarget } from '../../consumer/cursors.js';
import { CursorContentionError, InvalidOptionsError } from '../../errors.js';
import { nameOption } from '../../options.js';
import { json, openDatabase, type GlobalOptions } from '../context.js';
import { CliError, EXIT } from '../cli-error.js';
import { table } from './status.js';

interface CursorOptions extends GlobalOptions {
  consumer?: string;
  stream?: string;
  to?: string;
  json?: boolean;
}

/** `--to SEQ|now|start`, checked before anything connects. */
export function cursorTarget(value: string | undefined, flag: string): CursorTarget {
  if (value === 'now' || value === 'start') return value;
  if (value !== undefined && /^\d{1,19}$/.test(value) && BigInt(value) <= 9223372036854775807n) return BigInt(value);
  throw new CliError(`${flag}: expected a seq (a non-negative integer), now or start, got ${JSON.stringify(value ?? '')}`);
}

function names(options: CursorOptions): { consumer: string; stream: string } {
  for (const name of ['consumer', 'stream'] as const) {
    try {
      nameOption(options[name], name);
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`);
    }
  }
  return { consumer: options.consumer!, stream: options.stream! };
}

/**
 * A refusal of the cursor functions as the CLI says it, naming `flag`
 * (`--to`, or `--from` of tail and relay) where the library says `to`: a
 * bad target exits 2, a cursor a consumer holds exits 1 (try later).
 */
export function refusedAs(flag: string): (err: unknown) => never {
  return (err) => {
    if (err instanceof CursorContentionError) throw new CliError(err.message, EXIT.failed);
    if (err instanceof InvalidOptionsError && err.option === 'to') throw new CliError(`${flag}: ${err.message.replace(/^to: /, '')}`);
    throw err;
  };
}

/** `tidemark cursor list [--json]`: every cursor (groups' partitions too), its lag and who holds it. */
export async function cursorListCommand(options: CursorOptions): Promise<number> {
  const db = await openDatabase(options);
  try {
    const cursors = await listCursors(db.pool, { schema: options.schema });
    if (options.json) {
      console.log(json(cursors));
    } else if (cursors.length === 0) {
      console.log('(no cursors)');
    } else {
      // The partition column only when there are groups.
      const groups = cursors.some((c) => c.group !== null);
      console.log(
        table(
          ['consumer', 'stream', ...(groups ? ['partition'] : []), 'cursor', 'lag', 'lag s', 'updated', 'held by'],
          cursors.map((c) => [
            c.consumer,
            c.stream,
            ...(groups ? [c.group ? `${c.group.partition}/${c.group.partitions}` : '-'] : []),
            String(c.seq),
            String(c.lagEvents),
            c.lagSeconds.toFixed(1),
            c.updatedAt.toISOString(),
            c.group
              ? c.group.holder === null
                ? '-'
                : `member ${c.group.holder}${c.group.holderLive ? '' : ' (lease ended)'}`
              : c.heldBy
                ? `pid ${c.heldBy.pid}${c.heldBy.applicationName ? ` (${c.heldBy.applicationName})` : ''}`
                : '-',
          ]),
        ),
      );
    }
    return 0;
  } finally {
    await db.close();
  }
}

/** `tidemark cursor set --consumer C --stream S --to SEQ|now|start [--json]`. */
export async function cursorSetCommand(options: CursorOptions): Promise<number> {
  const { consumer, stream } = names(options);
  const to = cursorTarget(options.to, '--to');
  const db = await openDatabase(options);
  try {
    const r = await setCursor(db.pool, consumer, stream, to, { schema: options.schema }).catch(refusedAs('--to'));
    if (options.json) console.log(json(r));
    else {
      const what = `the cursor of consumer ${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)}`;
      console.log(r.from === null ? `created ${what} at seq ${r.to}` : `moved ${what} from seq ${r.from} to seq ${r.to}`);
    }
    return 0;
  } finally {
    await db.close();
  }
}

/** `tidemark cursor delete --consumer C --stream S [--json]`. */
export async function cursorDeleteCommand(options: CursorOptions): Promise<number> {
  const { consumer, stream } = names(options);
  const db = await openDatabase(options);
  try {
    const seq = await deleteCursor(db.pool, consumer, stream, { schema: options.schema }).catch(refusedAs('--to'));
    if (options.json) console.log(json({ consumer, stream, deleted: seq !== null, seq }));
    else {
      const what = `the cursor of consumer ${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)}`;
      console.log(seq === null ? `${what} does not exist; nothing deleted` : `deleted ${what} (it was at seq ${seq})`);
    }
    return 0;
  } finally {
    await db.close();
  }
}
