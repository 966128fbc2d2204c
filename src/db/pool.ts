import pg from 'pg';
import { InvalidOptionsError } from '../errors.js';

/** Options for {@link createPool}. */
export interface CreatePoolOptions extends pg.PoolConfig {
  /**
   * `idle_in_transaction_session_timeout` for every connection, in ms, so an
   * abandoned writer cannot hold the shared fence forever. Default 60000;
   * 0 disables it (not recommended for writer pools).
   */
  idleInTransactionTimeoutMs?: number;
  /** Called with errors of idle pooled connections. Default: ignored (the pool drops the connection). */
  onError?: (err: Error) => void;
}

/**
 * Creates a pg Pool set up for tidemark: writers' sessions get
 * `idle_in_transaction_session_timeout`, and the pool has an `error`
 * listener (an unhandled pool error would end the Node process).
 *
 * @example
 * const pool = createPool({ connectionString: process.env.DATABASE_URL });
 */
export function createPool(options: CreatePoolOptions = {}): pg.Pool {
  const { idleInTransactionTimeoutMs = 60_000, onError, ...config } = options;
  if (!Number.isInteger(idleInTransactionTimeoutMs) || idleInTransactionTimeoutMs < 0) {
    throw new InvalidOptionsError(
      'idleInTransactionTimeoutMs',
      `expected a non-negative integer, got ${String(idleInTransactionTimeoutMs)}`,
    );
  }
  const pool = new pg.Pool({
    ...config,
    idle_in_transaction_session_timeout: idleInTransactionTimeoutMs,
  });
  pool.on('error', (err) => onError?.(err));
  return pool;
}
