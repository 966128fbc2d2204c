import type pg from 'pg';
import { ClosedError, ConnectionLostError, CursorContentionError, SQLSTATE, TidemarkError, sqlState } from '../errors.js';
import type { Transaction } from './events.js';
import { acquire } from '../db/acquire.js';
import { withDeadline } from '../db/deadline.js';
import { quoteIdent } from '../db/queryable.js';

/** Resets what a session may carry to the next pool user; refuses to run inside an open transaction. */
const RELEASE_SQL =
  'SELECT pg_catalog.now() = pg_catalog.statement_timestamp() AS fresh; ' +
  'SELECT pg_catalog.pg_advisory_unlock_all(); UNLISTEN *; RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; DISCARD TEMP';

/** SQLSTATEs with which the server ends the session. */
const SESSION_ENDING: ReadonlySet<string> = new Set([
  SQLSTATE.adminShutdown,
  SQLSTATE.crashShutdown,
  SQLSTATE.cannotConnectNow,
  SQLSTATE.idleInTransactionTimeout,
  SQLSTATE.idleSessionTimeout,
]);

/**
 * A handle on a held connection's transaction that refuses to run anything
 * once `live()` turns false, so a handle kept past its page or snapshot can
 * never run a statement on a connection that went back to the pool.
 */
export function transaction(hold: CursorHold, live: () => boolean, what: string): Transaction {
  const query = (...args: unknown[]): unknown => {
    if (!live()) {
      const err = new ClosedError(`${what} (its transaction has ended)`);
      const callback = args.at(-1);
      if (typeof callback === 'function') return void callback(err);
      return Promise.reject(err);
    }
    return (hold.client.query as (...a: unknown[]) => unknown)(...args);
  };
  return { query: query as Transaction['query'] };
}

/**
 * One pooled connection that holds the session-level advisory lock of a
 * (consumer, stream) cursor for as long as a tailer or bootstrap runs, so
 * a second one gets `CursorContentionError` at once rather than racing page
 * by page. The lock dies with the session, so a crashed process frees it.
 *
 * The connection is returned to the pool only in a known state: no open
 * transaction and the lock released. Otherwise it is destroyed.
 */
export class CursorHold {
  private broken: unknown;
  /** Why the connection was lost, once it was. */
  private lostWith: ConnectionLostError | undefined;
  /** Waiters to tell when it is lost: each removes itself when its wait ends, so a long tail keeps none of its past waits. */
  private readonly lostListeners = new Set<(err: ConnectionLostError) => void>();
  private released = false;
  private readonly onError: (err?: unknown) => void;

  private constructor(
    readonly client: pg.PoolClient,
    readonly consumer: string,
    readonly stream: string,
    /** Bound on each of tidemark's own statements on this connection; past it the connection is dropped. */
    readonly boundMs: number,
    /** The group partition this connection pages, if it pages one. */
    readonly partition?: number,
  ) {
    this.onError = (err?: unknown) => {
      this.broken ??= err ?? new Error('connection ended');
      if (this.lostWith) return;
      this.lostWith = new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err);
      for (const listener of [...this.lostListeners]) listener(this.lostWith);
      this.lostListeners.clear();
    };
    client.on('error', this.onError);
    client.on('end', this.onError);
  }

  /**
   * Calls `listener` once if the connection ends under us (at once, in a
   * microtask, if it has already). Returns the function that removes it:
   * a wait calls it when it ends, however it ends.
   */
  onLost(listener: (err: ConnectionLostError) => void): () => void {
    if (this.lostWith) {
      const err = this.lostWith;
      queueMicrotask(() => listener(err));
      return () => undefined;
    }
    this.lostListeners.add(listener);
    return () => this.lostListeners.delete(listener);
  }

  /** How many waits are listening for the connection's loss now (for tests: none outlives its wait). */
  get lostListenerCount(): number {
    return this.lostListeners.size;
  }

  /**
   * Checks out a connection to page one partition of a group, with no lock
   * of the session's: a partition is this member's by lease, and its page
   * holds the partition's cursor row (PROTOCOL §6.4). A session-level lock
   * would outlive a member paused between pages and keep its successor out.
   */
  static async forPartition(pool: pg.Pool, consumer: string, stream: string, partition: number, signal: AbortSignal | undefined, boundMs: number): Promise<CursorHold> {
    return new CursorHold(await acquire(pool, signal), consumer, stream, boundMs, partition);
  }

  /**
   * Checks out a connection and takes the cursor's advisory lock, or throws
   * `CursorContentionError`. Each of tidemark's statements on it must be
   * answered within `boundMs`, or the connection is dropped (`CONNECTION_LOST`).
   */
  static async open(pool: pg.Pool, schema: string, consumer: string, stream: string, signal: AbortSignal | undefined, boundMs: number): Promise<CursorHold> {
    const client = await acquire(pool, signal);
    const hold = new CursorHold(client, consumer, stream, boundMs);
    let locked: boolean;
    try {
      // The same key as a page's transaction-level lock (read_page).
      const r = await hold.query<{ ok: boolean }>(`SELECT pg_catalog.pg_try_advisory_lock(${quoteIdent(schema)}.cursor_lock_key($1, $2)) AS ok`, [consumer, stream]);
      locked = r.rows[0]!.ok;
    } catch (err) {
      hold.markBroken(err);
      await hold.release();
      throw hold.translate(err);
    }
    if (!locked) {
      await hold.release(false);
      throw new CursorContentionError(consumer, stream);
    }
    return hold;
  }

  /**
   * One of tidemark's own statements on the held connection, answered within
   * `boundMs` or the connection is dropped; `types` parses its columns
   * (EVENT_TYPES for a read of events) instead of pg's global parsers.
   */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[], types?: pg.CustomTypesConfig): Promise<pg.QueryResult<R>> {
    return withDeadline(this.client, this.boundMs, `${JSON.stringify(this.consumer)} on ${JSON.stringify(this.stream)}`, () =>
      this.client.query<R>({ text, values, types }),
    );
  }

  /** True once the connection failed or its state became unknown. */
  get isBroken(): boolean {
    return this.broken !== undefined;
  }

  /** Remember that the connection's state is unknown: it will be destroyed, not reused. */
  markBroken(err: unknown): void {
    this.broken ??= err;
  }

  /**
   * Errors of tidemark's own statements: a driver error without SQLSTATE
   * means the connection failed under the statement.
   */
  translate(err: unknown): unknown {
    if (err instanceof TidemarkError) return err;
    const state = sqlState(err);
    const fatal = typeof err === 'object' && err !== null && ['FATAL', 'PANIC'].includes((err as { severity?: unknown }).severity as string);
    if (state === undefined || state.startsWith('08') || SESSION_ENDING.has(state) || fatal) {
      // No SQLSTATE: the driver lost the connection. 08xxx / 57P0x: the
      // server ended the session. Either way the connection is gone.
      this.markBroken(err);
      return new ConnectionLostError(`${JSON.stringify(this.consumer)} on ${JSON.stringify(this.stream)}`, err);
    }
    return err;
  }

  /**
   * A failed lock of the cursor: another session holds its advisory lock
   * (TM001, from read_page), holds the row outside tidemark's cursor lock
   * (55P03 after lock_timeout) or changed it after this transaction's
   * snapshot (40001). Each is contention, as the caller sees it.
   */
  contention(err: unknown): unknown {
    const state = sqlState(err);
    if (state === SQLSTATE.cursorContention || state === SQLSTATE.lockNotAvailable || state === SQLSTATE.serializationFailure) {
      return new CursorContentionError(this.consumer, this.stream, { cause: err });
    }
    return this.translate(err);
  }

  /** Rolls back after a failure; a failed rollback leaves the connection to be destroyed. */
  async rollback(): Promise<void> {
    if (this.broken !== undefined) return;
    try {
      await this.query('ROLLBACK');
    } catch (err) {
      this.markBroken(err);
    }
  }

  /**
   * Returns the connection to the pool in a clean state, or destroys it when
   * its state is unknown. Idempotent. The reset also undoes session state a
   * handler may have left on the connection it borrowed: advisory locks
   * (the cursor lock among them), LISTENs, SET parameters, SET ROLE and
   * temporary tables.
   */
  async release(locked = true): Promise<void> {
    if (this.released) return;
    this.released = true;
    if (this.broken === undefined && locked) {
      try {
        // First statement: a session with no open transaction starts one
        // here, so now() equals statement_timestamp(); inside a transaction
        // left open it would not, and the connection must not be reused.
        const results = (await this.query(RELEASE_SQL)) as unknown as { rows: { fresh: boolean }[] }[];
        if (!results[0]!.rows[0]!.fresh) this.markBroken(new Error('a transaction was left open on the connection'));
      } catch (err) {
        this.markBroken(err);
      }
    }
    this.client.off('error', this.onError);
    this.client.off('end', this.onError);
    const broken = this.broken;
    this.client.release(broken === undefined ? undefined : broken instanceof Error ? broken : new Error(String(broken)));
  }
}
