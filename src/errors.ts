/**
 * Errors raised by tidemark. Every error carries a stable string `code`;
 * callers branch on the code (or the class), never on message text.
 */

/** Stable error codes. Each is documented in docs/ERRORS.md. */
export type TidemarkErrorCode =
  | 'INVALID_EVENT'
  | 'INVALID_OPTIONS'
  | 'MIGRATION_FAILED'
  | 'CLOSED';

/** Base class for every error tidemark throws on purpose. */
export class TidemarkError extends Error {
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

/** A method was called on an object after `close()`. */
export class ClosedError extends TidemarkError {
  constructor(what: string) {
    super('CLOSED', `${what} is closed`);
  }
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
  uniqueViolation: '23505',
} as const;

/** The SQLSTATE of a PostgreSQL error, if `err` is one. */
export function sqlState(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err) {
    const code = (err as { code: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}
