import pg from 'pg';
import { checkKnownOptions } from '../options.js';
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
 * Defaults that let both ends notice a dead network path: TCP keepalive on
 * the client's socket after 10 s idle, the server's keepalive on its side
 * (idle 10 s, then 3 probes 5 s apart, so a backend whose client vanished
 * ends, and releases its locks, within about 25 s), and a 10 s bound on
 * opening a connection. Each can be overridden in the options.
 */
export const CONNECTION_DEFAULTS = {
  keepAlive: true,
  keepAliveInitialDelayMillis: 10_000,
  connectionTimeoutMillis: 10_000,
  options: '-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3',
} as const satisfies pg.PoolConfig;

/**
 * Creates a pg Pool set up for tidemark: writers' sessions get
 * `idle_in_transaction_session_timeout`, dead connections are noticed
 * ({@link CONNECTION_DEFAULTS}: TCP keepalive on both ends, a bound on
 * connecting), and the pool has an `error` listener (an unhandled pool
 * error would end the Node process).
 *
 * @example
 * const pool = createPool({ connectionString: process.env.DATABASE_URL });
 */
/**
 * What createPool takes: its own two options and node-postgres's pool and
 * client settings (pg 8), so a misspelt one is refused by name instead of
 * ignored.
 */
const POOL_OPTIONS = Object.fromEntries(
  [
    'idleInTransactionTimeoutMs', 'onError',
    'Client', 'Promise', 'allowExitOnIdle', 'application_name', 'binary', 'client_encoding', 'connectionString', 'connectionTimeoutMillis',
    'database', 'enableChannelBinding', 'fallback_application_name', 'host', 'idleTimeoutMillis', 'idle_in_transaction_session_timeout',
    'keepAlive', 'keepAliveInitialDelayMillis', 'lock_timeout', 'log', 'max', 'maxLifetimeSeconds', 'maxUses', 'min', 'onConnect', 'options',
    'parseInputDatesAsUTC', 'password', 'pipeline', 'port', 'query_timeout', 'replication', 'scramMaxIterations', 'ssl', 'sslnegotiation',
    'statement_timeout', 'stream', 'types', 'user',
  ].map((name) => [name, true]),
);

export function createPool(options: CreatePoolOptions = {}): pg.Pool {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', `expected an object, got ${String(options)}`);
  checkKnownOptions(options, POOL_OPTIONS, 'createPool');
  const { idleInTransactionTimeoutMs = 60_000, onError, ...config } = options;
  if (!Number.isInteger(idleInTransactionTimeoutMs) || idleInTransactionTimeoutMs < 0) {
    throw new InvalidOptionsError(
      'idleInTransactionTimeoutMs',
      `expected a non-negative integer, got ${String(idleInTransactionTimeoutMs)}`,
    );
  }
  const pool = new pg.Pool({
    ...CONNECTION_DEFAULTS,
    ...config,
    // The caller's server options come after the keepalive ones (a later -c
    // wins), so setting search_path does not turn keepalive off.
    options: config.options === undefined ? CONNECTION_DEFAULTS.options : `${CONNECTION_DEFAULTS.options} ${config.options}`,
    idle_in_transaction_session_timeout: idleInTransactionTimeoutMs,
  });
  pool.on('error', (err) => onError?.(err));
  // A connection that ends while it is being handed over (its FATAL in the
  // same read as its ReadyForQuery) emits 'error' before the borrower can
  // listen: without a listener here that would end the process. Borrowers
  // see the failure on their next statement.
  pool.on('connect', (client) => client.on('error', () => undefined));
  return pool;
}
