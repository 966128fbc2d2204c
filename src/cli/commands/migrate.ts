import { migrate } from '../../schema/migrate.js';
import { openDatabase, type GlobalOptions } from '../context.js';

/** `tidemark migrate [--dry-run]`: applies pending migrations and lists them. */
export async function migrateCommand(options: GlobalOptions & { dryRun?: boolean }): Promise<number> {
  const db = await openDatabase(options);
  try {
    const result = await migrate(db.pool, { schema: options.schema, dryRun: options.dryRun ?? false });
    const verb = options.dryRun ? 'would apply' : 'applied';
    if (result.applied.length === 0) console.log(`schema ${result.schema} is up to date (${result.alreadyApplied.length} migrations)`);
    for (const m of result.applied) console.log(`${verb} ${m.name}`);
    return 0;
  } finally {
    await db.close();
  }
}
