/**
 * Every failure of a command as one line a person can act on, and its exit
 * code (the table in docs/ERRORS.md, "Command line"). The driver's and the
 * server's own errors are recognised by socket code and SQLSTATE; the few
 * node-postgres errors that carry neither by their fixed texts.
 */
import { CommanderError } from 'commander';
import { InvalidOptionsError, sqlState, TidemarkError, type SinkError } from '../errors.js';
import { CliError, EXIT } from './cli-error.js';
import { inFlagTerms } from './flags.js';

/** What the command was talking to, for messages that say where. */
export interface ExplainContext {
  /** The database URL in use, if one was given (its password is never printed). */
  url?: string;
  /** The tidemark schema in use. */
  schema?: string;
}

/** One line and an exit code. */
export interface Explanation {
  message: string;
  exitCode: number;
}

/** Longest line printed: a safety net under the 80-character cap on echoed values. */
const LINE_LIMIT = 1000;
/** Longest quoted string kept whole in a message. */
const QUOTE_LIMIT = 80;

/** node-postgres's own connection errors: no SQLSTATE, no socket code; their fixed texts (pg 8: client.js, pg-pool). */
const DRIVER_LOST = new Set(['Connection terminated unexpectedly', 'Connection terminated', 'Client has encountered a connection error and is not queryable']);
/** node-postgres, asked for SCRAM by a server when it has no password (or an empty one) to give. */
const DRIVER_NO_PASSWORD = /^SASL: SCRAM-SERVER-FIRST-MESSAGE: client password must be a (non-empty )?string$/;
const DRIVER_TIMEOUT = new Set(['timeout expired', 'Connection terminated due to connection timeout', 'timeout exceeded when trying to connect']);

interface Target {
  /** `host:port/database`, or the embedded server. */
  where: string;
  hostPort: string;
  host?: string;
  user?: string;
  database?: string;
  password?: string;
}

function target(url: string | undefined): Target {
  if (url === undefined) return { where: 'the embedded PostgreSQL', hostPort: 'the embedded PostgreSQL' };
  try {
    const u = new URL(url);
    const host = u.searchParams.get('host') ?? (u.hostname || 'localhost');
    const port = u.searchParams.get('port') ?? (u.port || '5432');
    const user = decodeURIComponent(u.username) || undefined;
    const database = decodeURIComponent(u.pathname.slice(1)) || user;
    const hostPort = `${host}:${port}`;
    return { where: `${hostPort}/${database ?? ''}`, hostPort, host, user, database, password: decodeURIComponent(u.password) || undefined };
  } catch {
    return { where: 'the database', hostPort: 'the database' };
  }
}

const q = (text: string) => JSON.stringify(text);

/**
 * Turns any error a command throws into one line naming the problem and
 * what to do, and the exit code: 1 failed, 2 bad usage, input or
 * configuration, 3 resync, 4 the database could not be reached, refused the
 * login, or dropped the connection. Never a stack; echoed values are cut
 * to 80 characters and the URL's password is never printed.
 */
export function explain(err: unknown, context: ExplainContext = {}): Explanation {
  const t = target(context.url);
  const { message, exitCode } = classify(err, t, context.schema);
  return { message: oneLine(message, t.password), exitCode };
}

function classify(err: unknown, t: Target, schema: string | undefined): Explanation {
  if (err instanceof CliError) return { message: err.message, exitCode: err.exitCode };
  if (err instanceof CommanderError) return { message: err.message.replace(/^error: /, ''), exitCode: EXIT.usage };
  if (err instanceof TidemarkError) return tidemarkError(err, t, schema);
  if (err instanceof AggregateError && err.errors.length > 0) {
    // Happy eyeballs: one connect error per address tried; the first that is a connection failure speaks for all.
    const all = err.errors.map((e) => classify(e, t, schema));
    return all.find((e) => e.exitCode === EXIT.database) ?? all[0]!;
  }
  const system = systemError(err, t);
  if (system) return system;
  const state = sqlState(err);
  if (state !== undefined && typeof err === 'object' && err !== null && 'severity' in err) return postgresError(err as unknown as PgError, state, t, schema);
  if (err instanceof Error && !('code' in err)) {
    if (DRIVER_LOST.has(err.message)) {
      return database(`the connection to ${t.where} ended unexpectedly (the server restarted or closed it, or the network dropped it); run the command again once the database is back`);
    }
    if (DRIVER_TIMEOUT.has(err.message)) return database(`cannot connect to ${t.hostPort}: no answer within the connection timeout; check the host, the port and any firewall in between`);
    if (DRIVER_NO_PASSWORD.test(err.message)) {
      return database(`${t.hostPort} asks for a password (SCRAM authentication) and none was given; put it in the database URL (postgres://user:password@host/db), PGPASSWORD or ~/.pgpass`);
    }
  }
  if (err instanceof Error) {
    const code = 'code' in err && (typeof err.code === 'string' || typeof err.code === 'number') ? ` ${err.code}` : '';
    return { message: `${err.name}${code}: ${err.message}`, exitCode: EXIT.failed };
  }
  return { message: `unexpected failure: ${String(err)}`, exitCode: EXIT.failed };
}

const database = (message: string): Explanation => ({ message, exitCode: EXIT.database });

function tidemarkError(err: TidemarkError, t: Target, schema: string | undefined): Explanation {
  switch (err.code) {
    case 'INVALID_OPTIONS':
      return { message: err instanceof InvalidOptionsError ? inFlagTerms(err) : err.message, exitCode: EXIT.usage };
    case 'INVALID_EVENT':
      return { message: err.message, exitCode: EXIT.usage };
    case 'RESYNC_REQUIRED':
      return { message: err.message, exitCode: EXIT.resync };
    case 'MISSING_PACKAGE':
      return { message: err.message, exitCode: EXIT.usage };
    case 'OWNER_IN_USE':
      return { message: `--owner: ${err.message}`, exitCode: EXIT.usage };
    case 'SINK_FAILED': {
      // The sink's message names the broker and what to do. Retryable: the
      // broker could not be reached; without a seq: its destination is
      // misconfigured; with one: an event it can never take.
      const sink = err as SinkError;
      return { message: sink.message, exitCode: sink.retryable ? EXIT.database : sink.seq === undefined ? EXIT.usage : EXIT.failed };
    }
    case 'CONNECTION_LOST':
      return database(`${err.message} (${t.where}${err.cause === undefined ? '' : `: ${summary(err.cause)}`}); run the command again once the database is back`);
    default: {
      if (err.cause === undefined) return { message: err.message, exitCode: EXIT.failed };
      const cause = classify(err.cause, t, schema);
      return { message: `${err.message}: ${cause.message}`, exitCode: cause.exitCode };
    }
  }
}

/** Node's socket and DNS errors, by code. */
function systemError(err: unknown, t: Target): Explanation | undefined {
  if (typeof err !== 'object' || err === null || !('syscall' in err) || !('code' in err) || typeof err.code !== 'string') return undefined;
  const e = err as { code: string; syscall: unknown; hostname?: unknown; message?: unknown };
  const hint = t.where.startsWith('the embedded') ? '' : ' in --database-url (or DATABASE_URL)';
  switch (e.code) {
    case 'ECONNREFUSED':
      return database(`cannot connect to ${t.hostPort}: connection refused; is PostgreSQL running and listening on that port? Check the host and port${hint}`);
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return database(`cannot reach ${t.hostPort}: ${e.code === 'EHOSTUNREACH' ? 'no route to the host' : 'the network is unreachable'}; check the host${hint} and the network path to it`);
    case 'ENOTFOUND':
      return database(`cannot resolve the database host ${q(String(e.hostname ?? t.host ?? '?'))}: no such host; check the host name${hint}`);
    case 'EAI_AGAIN':
      return database(`cannot resolve the database host ${q(String(e.hostname ?? t.host ?? '?'))}: the DNS lookup failed for now; check DNS, then run the command again`);
    case 'ETIMEDOUT':
      if (e.syscall === 'connect') return database(`cannot connect to ${t.hostPort}: no answer within the connection timeout; check the host, the port and any firewall in between`);
      return database(`the database at ${t.where} stopped answering (${String(e.message)}); run the command again once it answers`);
    case 'ECONNRESET':
      return database(`the connection to ${t.where} was reset (the server restarted or the network dropped it); run the command again once the database is back`);
    default:
      return undefined;
  }
}

/** The fields of node-postgres's DatabaseError this module reads. */
interface PgError {
  message: string;
  hint?: string;
  table?: string;
  constraint?: string;
}

function postgresError(err: PgError, state: string, t: Target, schema: string | undefined): Explanation {
  const pgMessage = err.message;
  const user = t.user === undefined ? '' : ` ${q(t.user)}`;
  switch (state) {
    case '28P01':
      return database(`password authentication failed for user${user} at ${t.hostPort}; check the password${t.where.startsWith('the embedded') ? '' : ' in the database URL'}`);
    case '28000':
      return database(`${t.hostPort} refused the login: ${pgMessage}; check the user in the database URL, and pg_hba.conf on the server`);
    case '3D000':
      return database(`${pgMessage} on ${t.hostPort}; create it (CREATE DATABASE) or fix the database name in the URL`);
    case '57P01':
    case '57P02':
      return database(`${t.hostPort} ended the connection (${pgMessage}): the server is shutting down or restarting, or an administrator ended the session; run the command again once it is back`);
    case '57P03':
      return database(`${t.hostPort} is not accepting connections now (${pgMessage}); run the command again in a moment`);
    case '53300':
      return database(`${t.hostPort} has no connection slot free (${pgMessage}); run the command again later, or raise max_connections`);
    case '42P01':
    case '3F000':
    case '42883':
    case '42703': {
      // 42703: a column a later version added (watermark.origin, version 18): the schema is older than the code.
      const s = schema ?? 'tidemark';
      const flag = s === 'tidemark' ? '' : ` --schema ${s}`;
      return { message: `schema ${q(s)} in ${t.where} is not migrated (${pgMessage}); run \`tidemark migrate${flag}\` against this database first`, exitCode: EXIT.usage };
    }
    case '42501':
      return {
        message: `permission denied in ${t.where} for user${user} (${pgMessage}); run this command as the owner of the tidemark schema, or grant the role it needs (README, "Roles")`,
        exitCode: EXIT.usage,
      };
    case 'TM007':
      // A group refused: another partition count, a name that has a cursor
      // of its own, no such group. Fix the command.
      return { message: `${pgMessage.replace(/^tidemark: /, '')}${err.hint ? ` (${err.hint.replace(/\.$/, '')})` : ''}`, exitCode: EXIT.usage };
    case '54000':
      return {
        message:
          err.constraint !== undefined
            ? `a value is too long for index ${q(err.constraint)}${err.table === undefined ? '' : ` of table ${q(err.table)}`} (${pgMessage}); shorten it; nothing of that transaction was written`
            : `a value exceeds a PostgreSQL limit (${pgMessage}); nothing of that transaction was written`,
        exitCode: EXIT.usage,
      };
    default:
      if (state.startsWith('08')) return database(`the connection to ${t.where} failed (${state}: ${pgMessage}); run the command again once the database is reachable`);
      return { message: `PostgreSQL error ${state}: ${pgMessage}${err.hint ? ` (hint: ${err.hint})` : ''}`, exitCode: EXIT.failed };
  }
}

/** A cause in a few words: its code and message. */
function summary(err: unknown): string {
  if (err instanceof Error) {
    const code = 'code' in err && typeof err.code === 'string' ? `${err.code} ` : '';
    return `${code}${err.message}`;
  }
  return String(err);
}

/**
 * One line: whitespace runs (newlines included) become one space, quoted
 * strings longer than 80 characters are cut, the password never shows, and
 * the line stops at 1000 characters.
 */
export function oneLine(message: string, password?: string): string {
  let text = message.replace(/\s+/g, ' ').trim();
  // Only a URL could carry it, and no message prints one; this is the net under that.
  if (password) for (const p of new Set([password, encodeURIComponent(password)])) text = text.replaceAll(`:${p}@`, ':***@');
  text = text.replace(/"(?:[^"\\]|\\.)*"/g, (quoted) => (quoted.length > QUOTE_LIMIT + 4 ? `${quoted.slice(0, QUOTE_LIMIT + 1)}…"` : quoted));
  return text.length > LINE_LIMIT ? `${text.slice(0, LINE_LIMIT - 1)}…` : text;
}
