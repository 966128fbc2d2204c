import type { Queryable } from '../db/queryable.js';
import { quoteIdent } from '../db/queryable.js';

/**
 * The lease statements of one schema: `acquire_lease` (migration 0004),
 * and the owner's claim, `claim_owner` and `release_owner` (migration 0009).
 */
export interface LeaseSql {
  acquire: string;
  /** $1 owner, $2 instance, $3 TTL in ms; also answers the server's `now` (statement_timestamp). */
  claim: string;
  /** $1 owner, $2 instance: gives up the claim and releases the lease, unless another live instance claims the owner. */
  release: string;
}

export function leaseSql(schema: string): LeaseSql {
  const s = quoteIdent(schema);
  return {
    // $3, the process's id, names it to the fence for this statement's
    // transaction: the acquire (its argument depends on it) runs after.
    acquire:
      `SELECT a.held FROM (SELECT pg_catalog.set_config('tidemark.instance', $3, true) AS i) g, ` +
      `LATERAL ${s}.acquire_lease(CASE WHEN g.i IS NOT NULL THEN $1::text END, $2) a`,
    claim: `SELECT c.claimed, c.instance, c.claimed_at, c.expires_at, pg_catalog.statement_timestamp() AS now FROM ${s}.claim_owner($1, $2, $3) c`,
    release: `SELECT ${s}.release_owner($1, $2) AS released`,
  };
}

/** What `claim_owner` answered: this instance's claim, or the live claim of another that refused it. */
export interface OwnerClaim {
  claimed: boolean;
  /** The instance holding the claim (this one when `claimed`). */
  instance: string;
  claimedAt: Date;
  expiresAt: Date;
  /** The server's statement_timestamp() of the claim. */
  now: Date;
}

/**
 * Claims `owner` for `instance` until `ttlMs` from now, or renews the claim
 * it holds (docs/PROTOCOL.md section 4): one live instance per owner.
 */
export async function claimOwner(db: Queryable, sql: LeaseSql, owner: string, instance: string, ttlMs: number): Promise<OwnerClaim> {
  const result = await db.query(sql.claim, [owner, instance, ttlMs]);
  const row = result.rows[0] as { claimed: boolean; instance: string; claimed_at: Date; expires_at: Date; now: Date } | undefined;
  if (!row) throw new Error(`tidemark claim_owner answered no row for owner ${JSON.stringify(owner)}`);
  return { claimed: row.claimed, instance: row.instance, claimedAt: row.claimed_at, expiresAt: row.expires_at, now: row.now };
}

/**
 * How long a claim lives: the lease's TTL, plus one run. A live instance
 * claims before every run (a run after a sleep: as the sleep began, at
 * most one run before it), and sleeps between runs at most one run's
 * length; its lease renewals also extend the claim (the fence trigger).
 */
export function claimTtlMs(options: { leaseTtlMs: number; summaryIntervalMs: number }): number {
  return options.leaseTtlMs + options.summaryIntervalMs;
}

/**
 * Acquires or renews the watermarker lease, as its own autocommit
 * statement (never inside a step). A standby's attempt against a live lease
 * matches no row, so it takes no row lock and never delays the active
 * watermarker's publication.
 */
export async function acquireLease(db: Queryable, sql: LeaseSql, owner: string, instance: string, ttlMs: number): Promise<boolean> {
  const result = await db.query(sql.acquire, [owner, ttlMs, instance]);
  const row = result.rows[0] as { held: boolean } | undefined;
  if (!row) throw new Error('tidemark watermark row is missing; was the schema migrated?');
  return row.held;
}
