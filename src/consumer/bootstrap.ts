import type pg from 'pg';
import { ClosedError, CursorContentionError, FenceBusyError, SQLSTATE, sqlState } from '../errors.js';
import { sleep } from '../db/acquire.js';
import { fenceKey, quoteIdent } from '../db/queryable.js';
import { CursorHold } from './cursor-hold.js';
import type { Transaction } from './events.js';
import type { ResolvedStreamClientOptions } from './options.js';

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
  /** The seq the cursor is set to on commit. */
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

/** Opens a bootstrap snapshot; see {@link BootstrapSnapshot}. */
export async function openBootstrap(
  pool: pg.Pool,
  options: ResolvedStreamClientOptions,
  consumer: string,
  stream: string,
  signal?: AbortSignal,
): Promise<BootstrapSnapshot> {
  const s = quoteIdent(options.schema);
  const hold = await CursorHold.open(pool, options.schema, consumer, stream, signal);
  const { client } = hold;
  const fence = fenceKey(options.schema).toString();
  let inTransaction = false;
  try {
    await client.query(`INSERT INTO ${s}.cursors (consumer, stream) VALUES ($1, $2) ON CONFLICT (consumer, stream) DO NOTHING`, [
      consumer,
      stream,
    ]);
    await takeExclusiveFence(client, fence, options, signal);
    // Under the exclusive fence no writer holds a sequence number it has not
    // finished with, so the snapshot taken now sees every allocated seq as
    // committed or never-to-exist: max(seq) is a gap-free point, and the
    // snapshot contains the effects of exactly the events up to it. (The
    // published safe_seq is a lower bound that survives pruning of the
    // newest rows.) One simple-protocol round trip; no parameters.
    // If this fails, the catch below destroys the connection, and the
    // session's end releases the fence.
    inTransaction = true;
    const snapshot = (await client.query(
      `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout = ${options.lockTimeoutMs}; ` +
        `SELECT greatest((SELECT max(seq) FROM ${s}.events), (SELECT safe_seq FROM ${s}.watermark))::text AS w`,
    )) as unknown as pg.QueryResult[];
    const unlocked = await client.query<{ ok: boolean }>('SELECT pg_advisory_unlock($1) AS ok', [fence]);
    if (!unlocked.rows[0]!.ok) throw new Error('tidemark bootstrap: the exclusive fence was not held at release');
    const safeSeq = BigInt((snapshot[2]!.rows[0] as { w: string }).w);
    let prior: { seq: string } | undefined;
    try {
      prior = (await client.query<{ seq: string }>(`SELECT seq FROM ${s}.cursors WHERE consumer = $1 AND stream = $2 FOR UPDATE`, [consumer, stream]))
        .rows[0];
    } catch (err) {
      const state = sqlState(err);
      if (state === SQLSTATE.lockNotAvailable || state === SQLSTATE.serializationFailure) {
        throw new CursorContentionError(consumer, stream, { cause: err });
      }
      throw err;
    }
    if (!prior) throw new CursorContentionError(consumer, stream); // deleted under us by a foreign session
    return new Snapshot(hold, s, consumer, stream, safeSeq, BigInt(prior.seq));
  } catch (err) {
    const translated = signal?.aborted && err === signal.reason ? err : hold.translate(err);
    if (inTransaction) await hold.rollback();
    // A failure anywhere above may leave the session holding the fence: destroy it.
    hold.markBroken(err);
    await hold.release();
    throw translated;
  }
}

/**
 * Takes the session-level exclusive fence: try first (never queues ahead of
 * writers), then a wait bounded by `fenceLockTimeoutMs`, spaced out with a
 * growing pause, until `bootstrapFenceTimeoutMs` has passed.
 */
async function takeExclusiveFence(client: pg.PoolClient, key: string, options: ResolvedStreamClientOptions, signal?: AbortSignal): Promise<void> {
  const started = Date.now();
  let pause = 1;
  for (;;) {
    signal?.throwIfAborted();
    const tried = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [key]);
    if (tried.rows[0]!.ok) return;
    try {
      // The subquery runs first, so lock_timeout (local to this statement's
      // transaction) bounds the wait; a session lock outlives that transaction.
      await client.query(`SELECT pg_advisory_lock($2) FROM (SELECT set_config('lock_timeout', $1, true)) t`, [
        String(options.fenceLockTimeoutMs),
        key,
      ]);
      return;
    } catch (err) {
      if (sqlState(err) !== SQLSTATE.lockNotAvailable) throw err;
    }
    const waited = Date.now() - started;
    if (waited >= options.bootstrapFenceTimeoutMs) throw new FenceBusyError('bootstrap', waited);
    await sleep(pause, signal);
    pause = Math.min(pause * 2, 1000);
  }
}

class Snapshot implements BootstrapSnapshot {
  readonly tx: Transaction;
  private state: 'open' | 'closed' = 'open';
  /** The commit in flight, which `close()` waits for rather than racing it. */
  private committing: Promise<void> | undefined;

  constructor(
    private readonly hold: CursorHold,
    private readonly schema: string,
    readonly consumer: string,
    readonly stream: string,
    readonly safeSeq: bigint,
    readonly priorSeq: bigint,
  ) {
    this.tx = { query: hold.client.query.bind(hold.client) as Transaction['query'] };
  }

  commit(): Promise<void> {
    if (this.state !== 'open' || this.committing) return Promise.reject(new ClosedError('BootstrapSnapshot'));
    this.committing = this.finish();
    return this.committing;
  }

  private async finish(): Promise<void> {
    try {
      await this.hold.client.query(`UPDATE ${this.schema}.cursors SET seq = $3, updated_at = now() WHERE consumer = $1 AND stream = $2`, [
        this.consumer,
        this.stream,
        this.safeSeq.toString(),
      ]);
      await this.hold.client.query('COMMIT');
    } catch (err) {
      const translated = this.hold.translate(err);
      await this.hold.rollback();
      await this.hold.release();
      this.state = 'closed';
      throw translated;
    }
    this.state = 'closed';
    await this.hold.release();
  }

  async close(): Promise<void> {
    if (this.committing) return this.committing.catch(() => undefined);
    if (this.state === 'closed') return;
    this.state = 'closed';
    await this.hold.rollback();
    await this.hold.release();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
