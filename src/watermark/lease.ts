import type { Queryable } from '../db/queryable.js';
import { quoteIdent } from '../db/queryable.js';

/** The lease statements of one schema: `acquire_lease` and `release_lease` (migration 0004). */
export interface LeaseSql {
  acquire: string;
  release: string;
}

export function leaseSql(schema: string): LeaseSql {
  const s = quoteIdent(schema);
  return {
    acquire: `SELECT held FROM ${s}.acquire_lease($1, $2)`,
    release: `SELECT ${s}.release_lease($1) AS released`,
  };
}

/**
 * Acquires or renews the watermarker lease, as its own autocommit
 * statement (never inside a step). A standby's attempt against a live lease
 * matches no row, so it takes no row lock and never delays the active
 * watermarker's publication.
 */
export async function acquireLease(db: Queryable, sql: LeaseSql, owner: string, ttlMs: number): Promise<boolean> {
  const result = await db.query(sql.acquire, [owner, ttlMs]);
  const row = result.rows[0] as { held: boolean } | undefined;
  if (!row) throw new Error('tidemark watermark row is missing; was the schema migrated?');
  return row.held;
}
