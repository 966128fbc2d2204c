import { repartitionGroup, type RepartitionState } from '../../consumer/repartition.js';
import { InvalidOptionsError } from '../../errors.js';
import { nameOption } from '../../options.js';
import { json, openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';

interface RepartitionCommandOptions extends GlobalOptions {
  consumer?: string;
  stream?: string;
  partitions?: string;
  wait?: boolean;
  partitionIndex?: boolean;
  json?: boolean;
}

/**
 * `tidemark group repartition --consumer C --stream S --partitions N`:
 * records the new count at a barrier, waits until the old split drained
 * to it, and switches (PROTOCOL §6.6). Progress on stderr, the outcome on
 * stdout.
 */
export async function groupRepartitionCommand(options: RepartitionCommandOptions): Promise<number> {
  for (const name of ['consumer', 'stream'] as const) {
    try {
      nameOption(options[name], name);
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`);
    }
  }
  const partitions = positiveInt(options.partitions ?? '', '--partitions');
  if (partitions > 1024) throw new CliError(`--partitions: expected an integer between 1 and 1024, got ${partitions}`);
  const consumer = options.consumer!;
  const stream = options.stream!;
  const db = await openDatabase(options);
  try {
    const group = `consumer ${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)}`;
    let said = '';
    const progress = (s: RepartitionState) => {
      const line =
        s.behind === null
          ? 'waiting: a page of the group is open'
          : `waiting: ${s.behind} of ${s.partitions} partitions still have events to apply up to seq ${s.barrier}`;
      if (line !== said && !options.json) console.error(line);
      said = line;
    };
    const r = await repartitionGroup(db.pool, consumer, stream, partitions, {
      schema: options.schema,
      wait: options.wait !== false,
      partitionIndex: options.partitionIndex !== false,
      onProgress: progress,
    }).catch((err: unknown) => {
      if (err instanceof InvalidOptionsError && err.option === 'consumer') throw new CliError(err.message.replace(/^consumer: /, ''));
      throw err;
    });
    if (options.json) {
      console.log(json(r));
    } else {
      if (r.indexCreated) console.log(`created index ${r.indexCreated}`);
      if (r.nextPartitions !== null) {
        console.log(`pending: the group of ${group} goes from ${r.partitions} to ${r.nextPartitions} partitions at seq ${r.barrier}; its pages read up to there. Run this command again (without --no-wait) to switch.`);
      } else if (r.cancelled) {
        console.log(`cancelled: the group of ${group} keeps its ${r.partitions} partitions`);
      } else if (r.from === r.partitions && r.sinceSeq === 0n) {
        console.log(`the group of ${group} has ${r.partitions} partitions; nothing pending`);
      } else if (r.from === r.partitions) {
        console.log(`the group of ${group} has ${r.partitions} partitions (since seq ${r.sinceSeq}); nothing pending`);
      } else {
        console.log(`switched: the group of ${group} has ${r.partitions} partitions (was ${r.from}) from seq ${r.sinceSeq}`);
      }
      if (r.indexDropped) console.log(`dropped index ${r.indexDropped} (no group has ${r.from} partitions now)`);
    }
    return 0;
  } finally {
    await db.close();
  }
}
