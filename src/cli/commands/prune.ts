import { Pruner } from '../../retention/pruner.js';
import { resolvePrunerOptions, type PrunerOptions } from '../../retention/options.js';
import { configured, json, openDatabase, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import { parseDuration } from '../duration.js';

/** `tidemark prune --once [--retention 7d] [--allow-short-retention] [--json]`. */
export async function pruneCommand(
  options: GlobalOptions & { once?: boolean; retention: string; allowShortRetention?: boolean; json?: boolean },
): Promise<number> {
  if (!options.once) throw new CliError('prune: pass --once for a single pass; run it continuously with `tidemark serve --roles pruner`');
  const prunerOptions: PrunerOptions = {
    schema: options.schema,
    retentionMs: parseDuration(options.retention, '--retention'),
    allowShortRetention: options.allowShortRetention ?? false,
  };
  configured(() => resolvePrunerOptions(prunerOptions)); // before connecting: bad options write nothing
  const db = await openDatabase(options);
  try {
    const result = await new Pruner(db.pool, prunerOptions).prune();
    // As in status --json: every seq and every count of events a decimal string (64-bit), batches a number.
    if (options.json) console.log(json({ ...result, deleted: BigInt(result.deleted) }));
    else {
      console.log(`deleted ${result.deleted} events in ${result.batches} batches (safe_seq ${result.safeSeq})`);
      for (const h of result.horizons) console.log(`  ${h.stream}: pruned through seq ${h.prunedThroughSeq}`);
    }
    return 0;
  } finally {
    await db.close();
  }
}
