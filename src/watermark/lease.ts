import type { Queryable } from '../db/queryable.js';
import { quoteIdent } from '../db/queryable.js';

/** The lease as seen by one acquire/renew attempt. */
export interface LeaseState {
  held: boolean;
  owner: string | null;
  expiresAt: Date | null;
}

/**
 * Acquire or renew the watermarker lease. Runs as its own autocommit
 * statement before the fenced transaction (never inside it). A standby's
 * attempt against a live lease matches no row, so it takes no row lock and
 * never delays the active watermarker's publication.
 */
export const acquireLeaseSql = (schema: string): string => {
  const w = `${quoteIdent(schema)}.watermark`;
  return `WITH acquired AS (
  UPDATE ${w}
     SET lease_owner = $1,
         lease_expires_at = clock_timestamp() + make_interval(secs => $2::float8 / 1000)
   WHERE lease_owner = $1 OR lease_owner IS NULL OR lease_expires_at <= clock_timestamp()
  RETURNING lease_owner, lease_expires_at)
SELECT true AS held, lease_owner, lease_expires_at FROM acquired
UNION ALL
SELECT false, lease_owner, lease_expires_at FROM ${w} WHERE NOT EXISTS (SELECT 1 FROM acquired)`;
};

/** Give the lease up at once so a standby need not wait for expiry. */
export const releaseLeaseSql = (schema: string): string =>
  `UPDATE ${quoteIdent(schema)}.watermark SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = $1`;

interface LeaseRow {
  held: boolean;
  lease_owner: string | null;
  lease_expires_at: Date | null;
}

export async function acquireLease(db: Queryable, sql: string, owner: string, ttlMs: number): Promise<LeaseState> {
  const result = await db.query(sql, [owner, ttlMs]);
  const row = result.rows[0] as LeaseRow | undefined;
  if (!row) throw new Error('tidemark watermark row is missing; was the schema migrated?');
  return { held: row.held, owner: row.lease_owner, expiresAt: row.lease_expires_at };
}
