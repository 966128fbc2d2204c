import type pg from 'pg';
import { ConnectionLostError, CursorContentionError, TidemarkError, sqlState } from '../errors.js';
import { acquire } from '../db/acquire.js';
import { cursorKey } from '../db/queryable.js';

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
  /** Rejects when the connection ends under us; never resolves otherwise. */
  readonly lost: Promise<never>;
  private broken: unknown;
  private released = false;
  private readonly onError: (err?: unknown) => void;

  private constructor(
    readonly client: pg.PoolClient,
    private readonly key: bigint,
    readonly consumer: string,
    readonly stream: string,
  ) {
    let fail!: (err: unknown) => void;
    this.lost = new Promise<never>((_, reject) => (fail = reject));
    this.lost.catch(() => undefined);
    this.onError = (err?: unknown) => {
      this.broken ??= err ?? new Error('connection ended');
      fail(new ConnectionLostError(`tail of ${JSON.stringify(consumer)}`, err));
    };
    client.on('error', this.onError);
    client.on('end', this.onError);
  }

  /** Checks out a connection and takes the cursor's advisory lock, or throws `CursorContentionError`. */
  static async open(pool: pg.Pool, schema: string, consumer: string, stream: string, signal?: AbortSignal): Promise<CursorHold> {
    const client = await acquire(pool, signal);
    const hold = new CursorHold(client, cursorKey(schema, consumer, stream), consumer, stream);
    let locked: boolean;
    try {
      const r = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [hold.key.toString()]);
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
    if (sqlState(err) === undefined || this.broken !== undefined) {
      this.markBroken(err);
      if (sqlState(err) === undefined) return new ConnectionLostError(`tail of ${JSON.stringify(this.consumer)}`, err);
    }
    return err;
  }

  /** Rolls back after a failure; a failed rollback leaves the connection to be destroyed. */
  async rollback(): Promise<void> {
    if (this.broken !== undefined) return;
    try {
      await this.client.query('ROLLBACK');
    } catch (err) {
      this.markBroken(err);
    }
  }

  /** Releases the lock and returns the connection, or destroys it when its state is unknown. Idempotent. */
  async release(locked = true): Promise<void> {
    if (this.released) return;
    this.released = true;
    if (this.broken === undefined && locked) {
      try {
        const r = await this.client.query<{ ok: boolean }>('SELECT pg_advisory_unlock($1) AS ok', [this.key.toString()]);
        if (!r.rows[0]!.ok) this.markBroken(new Error('cursor lock was not held at release'));
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
