import { writeSync } from 'node:fs';
import type pg from 'pg';
import { InvalidEventError, sqlState } from '../../errors.js';
import { eventFromJson, eventFromParts, type EventRow } from '../../outbox/event.js';
import { insertRows } from '../../outbox/append.js';
import { EVENT_LIMITS } from '../../outbox/limits.js';
import { openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';

export interface AppendCommandOptions extends GlobalOptions {
  stream?: string;
  kind?: string;
  key?: string;
  payload?: string;
  headers?: string;
  ndjson?: boolean;
  batch?: string;
}

/** An invalid event: one line, exit code 2 (INVALID_EVENT), as for any bad input. */
const INVALID_EVENT_EXIT = 2;

/** The reason of an InvalidEventError without its `event[i].field: ` prefix (the CLI names lines and flags instead). */
function reason(err: InvalidEventError): string {
  return err.message.slice(`event[${err.index}].${err.field}: `.length);
}

/** PostgreSQL refused the data itself (class 22 data exception, class 23 constraint): the input must change, not the setup. */
function refusal(err: unknown): string | undefined {
  const state = sqlState(err);
  if (state === undefined || !(state.startsWith('22') || state.startsWith('23'))) return undefined;
  const column = (err as { column?: string }).column;
  const message = (err as Error).message;
  const cut = message.length > 200 ? `${message.slice(0, 200)}…` : message; // a message may quote the value
  return `${column ? `${column}: ` : ''}PostgreSQL refused it: ${cut} (SQLSTATE ${state})`;
}

/** Inserts rows in a transaction of their own; says whether a failure hit the COMMIT (outcome unknown). */
async function commitRows(pool: pg.Pool, schema: string, rows: EventRow[]): Promise<bigint[]> {
  let client: pg.PoolClient | undefined;
  let committing = false;
  try {
    client = await pool.connect();
    await client.query('BEGIN');
    const seqs = await insertRows(client, schema, rows);
    committing = true;
    await client.query('COMMIT');
    client.release();
    return seqs;
  } catch (err) {
    await client?.query('ROLLBACK').catch(() => undefined);
    client?.release(true);
    throw Object.assign(new Error('batch failed', { cause: err }), { committing });
  }
}

/**
 * Which row of a refused batch PostgreSQL refuses: the rows again, one by
 * one under savepoints (so a duplicate inside the batch shows at its second
 * occurrence), in a transaction that is rolled back. Runs only after a
 * refusal, to name the line.
 */
async function findRefused(pool: pg.Pool, schema: string, rows: EventRow[]): Promise<{ index: number; problem: string } | undefined> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    for (const [index, row] of rows.entries()) {
      await client.query('SAVEPOINT tidemark_probe');
      try {
        await insertRows(client, schema, [row]);
      } catch (err) {
        const problem = refusal(err);
        if (problem) return { index, problem };
        throw err;
      }
      await client.query('RELEASE SAVEPOINT tidemark_probe');
    }
    return undefined;
  } finally {
    await client.query('ROLLBACK').catch(() => undefined);
    client.release();
  }
}

/** Prints seqs one per line and waits until stdout took them: the process may exit right after. */
function printSeqs(seqs: bigint[]): Promise<void> {
  const text = seqs.map((seq) => `${seq}\n`).join('');
  return new Promise((resolve, reject) => process.stdout.write(text, (err) => (err ? reject(err) : resolve())));
}

/** What has been committed so far: the record printed when the input stops early. */
class Committed {
  lastLine = 0;
  count = 0;
  min = 0n;
  max = 0n;

  add(seqs: bigint[], lastLine: number): void {
    for (const seq of seqs) {
      if (this.count === 0 || seq < this.min) this.min = seq;
      if (this.count === 0 || seq > this.max) this.max = seq;
      this.count += 1;
    }
    this.lastLine = lastLine;
  }

  /** `committed lines 1-500 as seqs 1-500`; empty when nothing was. */
  summary(): string {
    if (this.count === 0) return '';
    const seqs =
      this.max - this.min + 1n === BigInt(this.count)
        ? `seqs ${this.min}-${this.max}`
        : `${this.count} seqs from ${this.min} to ${this.max} (other writers' seqs in between; each is on stdout)`;
    return `committed lines 1-${this.lastLine} as ${seqs}`;
  }

  /** What was not written. */
  rest(): string {
    return this.count === 0 ? 'nothing was written' : `nothing after line ${this.lastLine} was written`;
  }

  /** The one-line record: what was committed, what happened, what was not written. */
  record(...what: string[]): string {
    return [this.summary(), ...what, this.rest()].filter((part) => part !== '').join('; ');
  }
}

/**
 * `tidemark append --stream S --kind K --key KEY [--payload JSON] [--headers JSON]`
 * or `tidemark append --ndjson [--batch 500]`: prints the assigned seqs, one
 * per line. JSON text is passed to PostgreSQL as written (`1e400` and
 * `12345678901234567890` are stored exactly as jsonb reads them).
 *
 * NDJSON input is written batch by batch: each `--batch` events (blank lines
 * skipped) are checked in full, then committed in one transaction, and their
 * seqs printed. So input of up to `--batch` events is all or nothing. A bad
 * line, an event PostgreSQL refuses, or SIGINT/SIGTERM stops the input:
 * stderr says which lines were committed as which seqs and that nothing
 * after them was written. An invalid event exits 2; a signal finishes the
 * batch being written (never one being read) and exits 128 + its number.
 */
export async function appendCommand(options: AppendCommandOptions): Promise<number> {
  const batchSize = positiveInt(options.batch ?? '500', '--batch');
  let single: EventRow | undefined;
  if (!options.ndjson) {
    for (const name of ['stream', 'kind', 'key'] as const) {
      if (options[name] === undefined) throw new CliError(`append: --${name} is required (or use --ndjson)`);
    }
    try {
      single = eventFromParts(options as { stream: string; kind: string; key: string }, EVENT_LIMITS.eventMaxBytes);
    } catch (err) {
      if (err instanceof InvalidEventError) throw new CliError(`--${err.field}: ${reason(err)}`, INVALID_EVENT_EXIT);
      throw err;
    }
  } else if (options.stream || options.kind || options.key || options.payload || options.headers) {
    throw new CliError('append: --ndjson reads whole events from stdin; do not combine it with --stream/--kind/--key/--payload/--headers');
  }

  const db = await openDatabase(options);
  // A closed stdout fails the write of the seqs (reported with what was
  // committed), not the process: without a listener, its 'error' would crash.
  const ignore = () => undefined;
  process.stdout.on('error', ignore);
  try {
    if (single) {
      try {
        await printSeqs(await commitRows(db.pool, options.schema, [single]));
        return 0;
      } catch (err) {
        const cause = (err as Error).cause;
        const problem = refusal(cause);
        if (problem) throw new CliError(problem, INVALID_EVENT_EXIT);
        throw cause;
      }
    }
    return await appendNdjson(db.pool, options.schema, batchSize);
  } finally {
    process.stdout.off('error', ignore);
    await db.close();
  }
}

async function appendNdjson(pool: pg.Pool, schema: string, batchSize: number): Promise<number> {
  const committed = new Committed();
  let rows: EventRow[] = [];
  let lines: number[] = [];
  let line = 0;
  let writing: { first: number; last: number } | undefined;
  let stoppedBy: NodeJS.Signals | undefined;
  let writingWhenStopped = false;
  const input = inputLines(process.stdin);

  const onSignal = (signal: NodeJS.Signals) => {
    if (stoppedBy) {
      // A second signal: leave now, saying what may be half-done.
      const inFlight = writing ? `lines ${writing.first}-${writing.last} were being committed and may or may not have been` : '';
      // Written synchronously: console.error to a pipe is asynchronous, and
      // process.exit would cut the line short.
      writeSync(2, `tidemark: ${signal} again: exiting now; ${committed.record(inFlight)}\n`);
      process.exit(128 + signalNumber(signal));
    }
    stoppedBy = signal;
    writingWhenStopped = writing !== undefined;
    if (writing) console.error(`tidemark: ${signal}: stopping once lines ${writing.first}-${writing.last}, being committed now, are`);
    input.close();
  };
  const onSigint = () => onSignal('SIGINT');
  const onSigterm = () => onSignal('SIGTERM');
  process.on('SIGINT', onSigint);
  process.on('SIGTERM', onSigterm);

  const flush = async () => {
    writing = { first: lines[0]!, last: lines.at(-1)! };
    let seqs: bigint[];
    try {
      seqs = await commitRows(pool, schema, rows);
    } catch (err) {
      const { cause, committing } = err as Error & { committing: boolean };
      const problem = refusal(cause);
      if (problem) {
        const found = await findRefused(pool, schema, rows).catch(() => undefined);
        const where = found ? `line ${lines[found.index]}: ${found.problem}` : `lines ${writing.first}-${writing.last}: ${problem}`;
        throw new CliError(committed.record(where), INVALID_EVENT_EXIT);
      }
      const outcome = committing
        ? `lines ${writing.first}-${writing.last} may or may not have been committed (the failure hit COMMIT)`
        : `lines ${writing.first}-${writing.last} were not committed`;
      console.error(`tidemark: ${committed.record(outcome)}`);
      throw cause;
    }
    committed.add(seqs, writing.last);
    writing = undefined;
    try {
      await printSeqs(seqs);
    } catch (err) {
      console.error(`tidemark: ${committed.record('stdout failed, so not every seq was printed')}`);
      throw err;
    }
    rows = [];
    lines = [];
  };

  try {
    for await (const bytes of input.lines) {
      if (stoppedBy) break;
      line += 1;
      let raw: string;
      try {
        raw = utf8.decode(bytes);
      } catch {
        throw new CliError(committed.record(`line ${line}: not valid UTF-8 (${invalidUtf8At(bytes)})`), INVALID_EVENT_EXIT);
      }
      const text = line === 1 ? raw.replace(/^\uFEFF/, '') : raw;
      if (text.trim() === '') continue;
      try {
        rows.push(eventFromJson(text, 0, EVENT_LIMITS.eventMaxBytes));
      } catch (err) {
        if (!(err instanceof InvalidEventError)) throw err;
        const field = err.field === '(event)' ? '' : `${err.field}: `;
        throw new CliError(committed.record(`line ${line}: ${field}${reason(err)}`), INVALID_EVENT_EXIT);
      }
      lines.push(line);
      if (rows.length >= batchSize) await flush();
      if (stoppedBy) break;
    }
    if (!stoppedBy && rows.length > 0) await flush();
    if (!stoppedBy) return 0;
    const finished = writingWhenStopped ? 'finished committing the batch in flight' : '';
    const unread = rows.length > 0 ? `lines ${lines[0]}-${line} were read but not written` : '';
    console.error(`tidemark: ${stoppedBy}: stopped reading at line ${line}; ${[finished, committed.record(unread)].filter(Boolean).join('; ')}`);
    return 128 + signalNumber(stoppedBy);
  } finally {
    process.off('SIGINT', onSigint);
    process.off('SIGTERM', onSigterm);
    input.close();
  }
}

/** Refuses bytes that are not UTF-8, instead of replacing them with U+FFFD. */
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Where the first invalid UTF-8 sequence of `bytes` starts, for the message. */
function invalidUtf8At(bytes: Uint8Array): string {
  let lo = 0;
  let hi = bytes.length;
  // The longest valid prefix, by bisection: a prefix cut inside a valid
  // sequence is invalid too, so the answer is within 3 bytes of it.
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    try {
      utf8.decode(bytes.subarray(0, mid));
      lo = mid;
    } catch {
      hi = mid - 1;
    }
  }
  return `byte ${lo + 1} of the line, 0x${bytes[lo]?.toString(16).padStart(2, '0') ?? '??'}`;
}

/**
 * Lines of `stream` as bytes (LF or CRLF ends one; a last line without
 * one counts), so that each is decoded strictly: readline would have
 * replaced invalid UTF-8 with U+FFFD and written it. `close()` stops the
 * lines after the one being read.
 */
function inputLines(stream: NodeJS.ReadStream): { lines: AsyncGenerator<Uint8Array>; close: () => void } {
  let closed = false;
  async function* lines(): AsyncGenerator<Uint8Array> {
    let rest: Buffer = Buffer.alloc(0);
    try {
      for await (const chunk of stream as AsyncIterable<Buffer>) {
        let buffer: Buffer = rest.length === 0 ? chunk : Buffer.concat([rest, chunk]);
        let at: number;
        while ((at = buffer.indexOf(0x0a)) >= 0) {
          if (closed) return;
          const end = at > 0 && buffer[at - 1] === 0x0d ? at - 1 : at;
          yield buffer.subarray(0, end);
          buffer = buffer.subarray(at + 1);
        }
        rest = buffer;
        if (closed) return;
      }
    } catch (err) {
      if (closed) return; // destroyed by close()
      throw err;
    }
    if (!closed && rest.length > 0) yield rest.at(-1) === 0x0d ? rest.subarray(0, -1) : rest;
  }
  return {
    lines: lines(),
    close: () => {
      closed = true;
      stream.destroy();
    },
  };
}

function signalNumber(signal: NodeJS.Signals): number {
  return signal === 'SIGINT' ? 2 : 15;
}
