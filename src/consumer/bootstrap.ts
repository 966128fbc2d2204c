import type pg from 'pg';
import { ClosedError, CursorContentionError, FenceBusyError, SQLSTATE, sqlState } from '../errors.js';
import { sleep } from '../db/acquire.js';
import { fenceKey, quoteIdent } from '../db/queryable.js';
import { CursorHold, transaction } from './cursor-hold.js';
import type { Transaction } from './events.js';
import type { ResolvedStreamClientOptions } from './options.js';
import type { PageSql } from './page.js';

/**
 * An open REPEATABLE READ snapshot to rebuild a projection from, returned by
 * `StreamClient.bootstrap`. Everything with `seq <= safeSeq` is committed and
 * visible in it, and nothing above `safeSeq` is: the snapshot was taken
 * while this client held the exclusive fence, so the data your own tables
 * show in `tx` is exactly the effect of the events through `safeSeq`.
 *
 * Rebuild with `tx`, then `commit()` to set the cursor to `safeSeq` in the
 * same transaction. `close()` (or `await using`) without commit rolls back
 * and keeps the prior cursor. Holding the snapshot open does not hold the
 * fence: writers and the watermarker go on.
 */
export interface BootstrapSnapshot {
  /** The consumer being rebuilt. */
  readonly consumer: string;
  /** The stream whose cursor `commit()` sets. */
  readonly stream: string;
  /**
   * The seq the snapshot matches, which `commit()` makes the cursor: every
   * event up to it is in the snapshot, none above it. It is a gap-free point
   * taken under the fence, so it may be above the published safe_seq (tail
   * then delivers nothing new until the watermark passes it).
   */
  readonly safeSeq: bigint;
  /** The cursor before this bootstrap (0 for a new consumer). */
  readonly priorSeq: bigint;
  /** The open transaction; write the rebuilt projection with it. */
  readonly tx: Transaction;
  /** Sets the cursor to `safeSeq` and commits the rebuild with it. */
  commit(): Promise<void>;
  /** Rolls back if not committed and releases the connection. Idempotent. */
  close(): Promise<void>;
  /** `close()`, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Opens a bootstrap snapshot; see {@link BootstrapSnapshot}. With `group`,
 * of the consumer's group of that many partitions (created if new): every
 * partition row is locked in the snapshot's transaction (`lock_group`),
 * and `commit()` moves them all to the snapshot's point.
 */
export async function openBootstrap(
  pool: pg.Pool,
  options: ResolvedStreamClientOptions,
  sql: PageSql,
  consumer: string,
  stream: string,
  signal: AbortSignal | undefined,
  onClose: (snapshot: BootstrapSnapshot) => void,
  group?: { partitions: number },
): Promise<BootstrapSnapshot> {
  const s = quoteIdent(options.schema);
  const hold = await CursorHold.open(pool, options.schema, consumer, stream, signal, options.lockTimeoutMs + options.responseTimeoutMs);
  const { client } = hold;
  const fence = fenceKey(options.schema).toString();
  let inTransaction = false;
  try {
    if (!group) await client.query(sql.ensureCursor, [consumer, stream]);
    // The snapshot point is taken under the exclusive fence, and the whole
    // fenced section is one simple-protocol message that the server runs
    // back to back: the fence is never held while the server waits for this
    // client (a stalled process cannot stall writers). See takeSnapshot.
    const safeSeq = await takeSnapshot(hold, s, fence, options, signal);
    inTransaction = true;
    let prior: { seq: string } | undefined;
    try {
      prior = group
        ? (await client.query<{ seq: string }>(`SELECT ${s}.lock_group($1, $2, $3)::text AS seq`, [consumer, stream, group.partitions])).rows[0]
        : (await client.query<{ seq: string }>(`SELECT seq FROM ${s}.cursors WHERE consumer = $1 AND stream = $2 FOR NO KEY UPDATE`, [consumer, stream])).rows[0];
    } catch (err) {
      throw hold.contention(err);
    }
    if (!prior) throw new CursorContentionError(consumer, stream); // deleted under us by a foreign session
    signal?.throwIfAborted();
    const commitSql = group ? `SELECT ${s}.set_group_cursors($1, $2, $3)` : sql.advance;
    return new Snapshot(hold, commitSql, consumer, stream, safeSeq, BigInt(prior.seq), onClose);
  } catch (err) {
    // takeSnapshot leaves the connection clean or marked broken; after it,
    // the open transaction is rolled back (a failed rollback marks it broken).
    const translated = signal?.aborted && err === signal.reason ? err : hold.translate(err);
    if (inTransaction) await hold.rollback();
    await hold.release();
    throw translated;
  }
}

/**
 * Opens the REPEATABLE READ transaction with its snapshot taken under the
 * exclusive fence, and returns the snapshot point W. One message, run by the
 * server statement after statement without waiting for the client:
 *
 * 1. `BEGIN; SELECT pg_advisory_lock(fence) ...; COMMIT`: take the fence
 *    session-level (it outlives this transaction), the wait bounded by a
 *    lock_timeout local to it;
 * 2. `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout`, short
 *    (`fenceLockTimeoutMs`): the next statement waits for table locks (DDL
 *    on events or watermark) while holding the fence;
 * 3. one SELECT whose snapshot, taken as it starts, becomes the
 *    transaction's snapshot while the fence is still held, and which then
 *    releases the fence; then `lock_timeout` back to `lockTimeoutMs`.
 *
 * Any failure rolls back, releases the fence if the session still holds it
 * (a failure after step 1, or a lock timeout raised just after the grant)
 * and checks on the server that it is gone. Unconfirmed: the connection is
 * marked broken, so it is destroyed and the session's end releases the
 * fence. Confirmed, after a lock timeout (the fence or a table lock under
 * it was busy): wait and try again. The first attempt waits at most 1 ms
 * (close to a try-lock, so it hardly queues ahead of writers), later ones
 * `fenceLockTimeoutMs`, spaced by a growing pause, until
 * `bootstrapFenceTimeoutMs` (then `FenceBusyError`). The SQL holds only
 * validated integers and the bigint key: no user text.
 */
async function takeSnapshot(hold: CursorHold, s: string, fence: string, options: ResolvedStreamClientOptions, signal?: AbortSignal): Promise<bigint> {
  const { client } = hold;
  const started = Date.now();
  let pause = 1;
  for (let attempt = 0; ; attempt += 1) {
    signal?.throwIfAborted();
    const waitMs = attempt === 0 ? 1 : options.fenceLockTimeoutMs;
    try {
      const results = (await client.query(
        `BEGIN; SELECT pg_catalog.pg_advisory_lock(${fence}) FROM (SELECT pg_catalog.set_config('lock_timeout', '${waitMs}', true)) t; COMMIT; ` +
          `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout = ${options.fenceLockTimeoutMs}; ` +
          `SELECT greatest((SELECT pg_catalog.max(seq) FROM ${s}.events), (SELECT safe_seq FROM ${s}.watermark))::text AS w, ` +
          `pg_catalog.pg_advisory_unlock(${fence}) AS unlocked; ` +
          `SET LOCAL lock_timeout = ${options.lockTimeoutMs}`,
      )) as unknown as pg.QueryResult[];
      const row = results[5]!.rows[0] as { w: string; unlocked: boolean };
      if (!row.unlocked) throw new Error('tidemark bootstrap: the exclusive fence was not held at release');
      return BigInt(row.w);
    } catch (err) {
      if (!(await fenceReleased(client, fence))) {
        hold.markBroken(err);
        throw err;
      }
      if (sqlState(err) !== SQLSTATE.lockNotAvailable) throw err;
    }
    const waited = Date.now() - started;
    if (waited >= options.bootstrapFenceTimeoutMs) throw new FenceBusyError('bootstrap', waited, await fenceHolders(client, s));
    await sleep(pause, signal);
    pause = Math.min(pause * 2, 1000);
  }
}

/** The writers holding the shared fence now, oldest first (for the error's message); empty if that cannot be read. */
async function fenceHolders(client: pg.PoolClient, schema: string): Promise<FenceBusyError['holders']> {
  try {
    const r = await client.query<{ pid: number | null; application_name: string | null; age_seconds: number | null }>(
      `SELECT pid, application_name, age_seconds FROM ${schema}.fence_holders()`,
    );
    return r.rows.map((h) => ({ pid: h.pid, applicationName: h.application_name, ageSeconds: h.age_seconds }));
  } catch {
    return [];
  }
}

/**
 * After a failed attempt: rolls back, releases the fence if this session
 * still holds it, and returns true only once the server confirms it holds
 * none. The session can hold it after an error: a statement after the lock
 * failed, or a lock timeout landed just as the lock was granted (PostgreSQL
 * then raises the timeout, and a session-level lock survives the error).
 */
async function fenceReleased(client: pg.PoolClient, fence: string): Promise<boolean> {
  const key = BigInt(fence);
  const held = async () =>
    (
      await client.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_catalog.pg_locks
          WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() AND granted
            AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`,
        [(BigInt.asUintN(64, key) >> 32n).toString(), BigInt.asUintN(32, key).toString()],
      )
    ).rows[0]!.n;
  try {
    await client.query('ROLLBACK');
    if ((await held()) > 0) await client.query('SELECT pg_catalog.pg_advisory_unlock($1)', [fence]);
    return (await held()) === 0;
  } catch {
    return false;
  }
}

class Snapshot implements BootstrapSnapshot {
  readonly tx: Transaction;
  private live = true;
  private state: 'open' | 'closed' = 'open';
  /** The commit in flight, which `close()` waits for rather than racing it. */
  private committing: Promise<void> | undefined;

  constructor(
    private readonly hold: CursorHold,
    private readonly advanceSql: string,
    readonly consumer: string,
    readonly stream: string,
    readonly safeSeq: bigint,
    readonly priorSeq: bigint,
    private readonly onClose: (snapshot: BootstrapSnapshot) => void,
  ) {
    this.tx = transaction(hold, () => this.live, 'BootstrapSnapshot.tx');
  }

  commit(): Promise<void> {
    if (this.state !== 'open' || this.committing) return Promise.reject(new ClosedError('BootstrapSnapshot'));
    this.committing = this.finish();
    return this.committing;
  }

  private async finish(): Promise<void> {
    try {
      await this.hold.client.query(this.advanceSql, [this.consumer, this.stream, this.safeSeq.toString()]);
      await this.hold.client.query('COMMIT');
    } catch (err) {
      const translated = this.hold.translate(err);
      await this.end(true);
      throw translated;
    }
    await this.end(false);
  }

  private async end(rollback: boolean): Promise<void> {
    this.live = false;
    this.state = 'closed';
    if (rollback) await this.hold.rollback();
    await this.hold.release();
    this.onClose(this);
  }

  async close(): Promise<void> {
    if (this.committing) return this.committing.catch(() => undefined);
    if (this.state === 'closed') return;
    await this.end(true);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
