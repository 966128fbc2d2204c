/**
 * Redis's error replies as the sink reads them: the one table. A Redis error
 * reply is `-CODE text`; the code (its first word) is the only machine-readable
 * part, and for the generic `ERR` code the text is all there is, so the few
 * `ERR` replies the sink must tell apart are listed here by their exact text.
 */
import { SinkError } from '../../../errors.js';

export const NAME = 'redis';

/**
 * Redis's refusal of an XADD whose explicit id is not above the stream's
 * top: the event's entry, or a later one of its stream, is stored already.
 * Exactly this text (Redis 5.0 to 8, Valkey), nothing like it, counts as
 * delivered: `ERR The ID specified in XADD must be greater than 0-0` and
 * every other `ERR` fail.
 */
export const ALREADY_STORED = 'ERR The ID specified in XADD is equal or smaller than the target stream top item';

/**
 * Codes of replies that say "not now": the server is loading its data set,
 * a replica (READONLY: a failover moved the primary), a script is running,
 * memory or disk is short, a cluster is reconfiguring. Retried after a back-off.
 */
const RETRYABLE_CODES: ReadonlySet<string> = new Set(['LOADING', 'READONLY', 'BUSY', 'OOM', 'MISCONF', 'MASTERDOWN', 'TRYAGAIN', 'CLUSTERDOWN', 'NOREPLICAS']);

/** `ERR` replies that are about the connection, not the command: retried. */
const RETRYABLE_ERR: readonly string[] = ['ERR max number of clients reached'];

/** Codes of replies about the credentials or permissions: they say what to check. */
const AUTH_CODES: ReadonlySet<string> = new Set(['NOAUTH', 'WRONGPASS', 'NOPERM']);

/** A Redis error reply (ioredis's `ReplyError`): an Error whose message starts with the reply's code. */
export function replyCode(err: unknown): string | undefined {
  if (!(err instanceof Error) || err.name !== 'ReplyError') return undefined;
  const code = /^[A-Z]+/.exec(err.message);
  return code ? code[0] : undefined;
}

/** Whether `err` is Redis's refusal of an id at or below the stream's top ({@link ALREADY_STORED}). */
export function alreadyStored(err: unknown): boolean {
  return err instanceof Error && err.name === 'ReplyError' && err.message === ALREADY_STORED;
}

/** A refusal the page script returned (the text of an error reply; sink.ts, PAGE_SCRIPT) as the reply error it stands for. */
export function scriptRefusal(text: string): Error {
  const err = new Error(text);
  err.name = 'ReplyError';
  return err;
}

/**
 * A failure as a `SinkError`. `at` says what was being done; `seq` is the
 * event whose own XADD the reply answered (absent for a page-wide or
 * connection failure). Replies: {@link RETRYABLE_CODES} retryable, anything
 * else (WRONGTYPE, NOAUTH/WRONGPASS/NOPERM, a protocol error over a size
 * limit, other ERR) not. Anything that is not a reply (a closed socket, a
 * refused connection) is retryable; `socketError`, the connection's last
 * error, is named with it.
 */
export function redisError(err: unknown, at: string, seq?: bigint, socketError?: unknown): SinkError {
  if (err instanceof SinkError) return err;
  const code = replyCode(err);
  const text = firstLine(err);
  if (code === undefined) {
    // ioredis fails commands with a bare "Connection is closed."; the socket's own error says why.
    const why = socketError !== undefined && socketError !== err ? firstLine(socketError) : text;
    return new SinkError(NAME, `${at}: ${why}`, { retryable: true, cause: err });
  }
  if (code === 'EXECABORT') {
    // A command was refused while queued (OOM, BUSY, READONLY, NOPERM): the whole page was discarded; the first refusal says why.
    const previous = (err as { previousErrors?: unknown[] }).previousErrors?.[0];
    if (previous !== undefined) return redisError(previous, at);
  }
  const retryable = RETRYABLE_CODES.has(code) || RETRYABLE_ERR.some((prefix) => text.startsWith(prefix));
  const hint =
    AUTH_CODES.has(code) ? ' (check the user, the password and its ACL permissions in url)'
    : code === 'WRONGTYPE' ? ' (the key holds another type than a stream: change the stream template, or remove the key)'
    : '';
  // Credentials and a key of another type concern every event alike: no seq (the relay stops under either onRefused policy).
  const eventsOwn = !retryable && seq !== undefined && !AUTH_CODES.has(code) && code !== 'WRONGTYPE';
  return new SinkError(NAME, `${at}: Redis refused it: ${text}${hint}`, { retryable, cause: err, ...(eventsOwn ? { seq } : {}) });
}

/** The first line of an error's message, cut to 300 characters. */
export function firstLine(err: unknown): string {
  if (err instanceof AggregateError && err.errors.length > 0) return firstLine(err.errors[0]);
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  const text = err instanceof Error ? err.message : String(err);
  const line = text.split('\n')[0]!.slice(0, 300);
  return typeof code === 'string' && !line.includes(code) ? `${code}: ${line}` : line;
}
