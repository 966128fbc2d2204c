import { fstatSync, statSync } from 'node:fs';
import { StreamClient } from '../../consumer/stream-client.js';
import type { HandlerContext, StreamEvent } from '../../consumer/events.js';
import type { PageInfo } from '../../consumer/stream-client.js';
import { HandlerError, ResyncRequiredError } from '../../errors.js';
import { explain } from '../explain.js';
import { nameOption } from '../../options.js';
import { configured, json, openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import { setCursor } from '../../consumer/cursors.js';
import { cursorTarget, refusedAs } from './cursor.js';
import { shellWord } from '../shell-word.js';
import { RetryLines } from '../retry-lines.js';
import { DEFAULT_SCHEMA } from '../../db/queryable.js';
import { parseDuration } from '../duration.js';

export interface TailCommandOptions extends GlobalOptions {
  consumer: string;
  stream: string;
  bootstrap?: boolean;
  once?: boolean;
  json?: boolean;
  limit?: string;
  batch: string;
  poll: string;
  from?: string;
  partitions?: string;
  member?: string;
  concurrency?: string;
  lease?: string;
  /** false with --no-partition-index */
  partitionIndex?: boolean;
}

/**
 * One output line. NDJSON: the event's fields, with `payload` and `headers`
 * as PostgreSQL's own text, byte for byte (never parsed and written again:
 * a number JavaScript cannot hold, `12345678901234567890` or `1e400`, stays
 * as stored). TSV: seq, kind, key and the payload's text, each escaped as
 * PostgreSQL's COPY text format escapes a field (`\\`, `\t`, `\n`, `\r`),
 * so a tab or a line break inside a field cannot split the line.
 */
function render(event: StreamEvent, asJson: boolean): string {
  if (asJson) {
    const fields = `"seq":${json(event.seq)},"stream":${json(event.stream)},"kind":${json(event.kind)},"key":${json(event.key)}`;
    return `{${fields},"payload":${event.payloadText},"headers":${event.headersText},"occurredAt":${json(event.occurredAt)}}`;
  }
  return [event.seq.toString(), event.kind, event.key, event.payloadText].map(tsvField).join('\t');
}

/** A TSV field as COPY's text format writes it. */
function tsvField(value: string): string {
  return value.replace(/[\\\t\n\r]/g, (c) => TSV_ESCAPES[c]!);
}

const TSV_ESCAPES: Record<string, string> = { '\\': '\\\\', '\t': '\\t', '\n': '\\n', '\r': '\\r' };

/** `--partitions N` and its companions, validated; undefined without `--partitions`. */
function groupOptions(options: TailCommandOptions): { partitions: number; member?: string; concurrency?: number; leaseTtlMs?: number; partitionIndex: boolean } | undefined {
  if (options.partitions === undefined) {
    for (const flag of ['member', 'concurrency', 'lease'] as const) {
      if (options[flag] !== undefined) throw new CliError(`--${flag}: only with --partitions (a group member)`);
    }
    if (options.partitionIndex === false) throw new CliError('--no-partition-index: only with --partitions (a group member)');
    return undefined;
  }
  const partitions = positiveInt(options.partitions, '--partitions');
  if (partitions > 1024) throw new CliError(`--partitions: expected at most 1024, got ${options.partitions}`);
  if (options.member !== undefined) {
    try {
      nameOption(options.member, 'member');
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`);
    }
  }
  return {
    partitions,
    ...(options.member !== undefined && { member: options.member }),
    ...(options.concurrency !== undefined && { concurrency: positiveInt(options.concurrency, '--concurrency') }),
    ...(options.lease !== undefined && { leaseTtlMs: parseDuration(options.lease, '--lease') }),
    partitionIndex: options.partitionIndex !== false,
  };
}

/** Exit code of a resync: the consumer must bootstrap. */
export const RESYNC_EXIT = 3;

/**
 * `tidemark tail --consumer C --stream S [--bootstrap] [--once] [--json] [--limit N]`:
 * writes delivered events to stdout (NDJSON with `--json`), advancing the
 * durable cursor page by page. `--once` drains what is visible and exits;
 * otherwise it follows until SIGINT/SIGTERM or `--limit` events.
 * `--bootstrap` first moves the cursor to a fresh snapshot point (the CLI
 * has no projection to rebuild: it skips to the present).
 */
export async function tailCommand(options: TailCommandOptions): Promise<number> {
  const limit = options.limit === undefined ? undefined : positiveInt(options.limit, '--limit');
  const clientOptions = {
    schema: options.schema,
    batchSize: positiveInt(options.batch, '--batch'),
    pollIntervalMs: parseDuration(options.poll, '--poll'),
  };
  for (const name of ['consumer', 'stream'] as const) {
    try {
      nameOption(options[name], name);
    } catch (err) {
      throw new CliError(`--${(err as Error).message}`); // "--consumer: expected ..."
    }
  }
  const from = options.from === undefined ? undefined : cursorTarget(options.from, '--from');
  const group = groupOptions(options);
  if (group && (options.once || from !== undefined)) {
    throw new CliError(`--partitions: a group member follows its partitions; ${options.once ? '--once' : '--from'} is for a consumer's own cursor`);
  }
  if (from !== undefined && options.bootstrap) {
    throw new CliError('--from: sets where a new consumer starts; --bootstrap moves this one to the present: give one of them');
  }
  if (stdoutIsNull()) {
    // Node reopens a closed stdout (`>&-`) on /dev/null: either way no line
    // would reach anyone, and the durable cursor would move past them.
    const schema = options.schema === DEFAULT_SCHEMA ? '' : ` --schema ${shellWord(options.schema)}`;
    const skip = `tidemark cursor set --consumer ${shellWord(options.consumer)} --stream ${shellWord(options.stream)} --to now${schema}`;
    throw new CliError(`stdout is /dev/null or closed: tail would advance the cursor past lines nobody can read; to skip to the present, run: ${skip}`);
  }
  // A group member: a connection per concurrent page, the listener's, the
  // beats' and one for the partition index's build.
  const db = await openDatabase(options, group ? (group.concurrency ?? 4) + 3 : 3);
  const retries = new RetryLines((line) => console.error(`tidemark: tail: ${line}`));
  const client = configured(
    () =>
      new StreamClient(db.pool, {
        ...clientOptions,
        // --once fails fast; following recovers from restarts and lost connections by itself.
        retry: !options.once,
        observer: (event) => {
          if (event.type === 'page') {
            written = event.cursor;
            retries.succeeded();
          }
          if (event.type === 'retry') retries.failed(explain(event.error, { url: db.url }).message, event.attempt);
          if (event.type === 'group:assignment') {
            console.error(`tidemark: tail: member ${event.member} holds ${event.partitions.length === 0 ? 'no partition' : `partitions ${event.partitions.join(',')}`} of ${event.count}`);
          }
          if (event.type === 'group:index') {
            console.error(`tidemark: tail: the partition index was not created (${explain(event.error, { url: db.url }).message}); pages read past other partitions' events: run "SELECT ${options.schema}.partition_index_ddl(${group!.partitions})" as the table's owner and execute its statement`);
          }
        },
      }),
  );
  let written: bigint | undefined; // the cursor after the last page stdout accepted and the database committed
  const stop = new AbortController();
  const onSignal = () => stop.abort(new Error('interrupted'));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const out = new PageOutput(process.stdout);
  try {
    if (from !== undefined) await setCursor(db.pool, options.consumer, options.stream, from, { schema: options.schema, onlyIfNew: true }).catch(refusedAs('--from'));
    if (options.bootstrap) {
      const snap = group
        ? await client.bootstrapGroup(options.consumer, options.stream, { partitions: group.partitions, signal: stop.signal })
        : await client.bootstrap(options.consumer, options.stream, { signal: stop.signal });
      await snap.commit();
      console.error(`tidemark: bootstrapped ${options.consumer} on ${options.stream}: ${group ? "every partition's cursor" : `cursor ${snap.priorSeq}`} -> ${snap.safeSeq}`);
    }
    let delivered = 0;
    // A page's lines are written together once its handlers ran, and the
    // page commits only after stdout accepted them all (beforeCommit).
    const handler = (event: StreamEvent, _tx: unknown, context: HandlerContext) => {
      // A page whose lines stdout accepted but whose COMMIT was lost is
      // delivered again after the retry: its lines are out already.
      const part = context.partition ?? -1;
      const accepted = out.acceptedThrough(part);
      if (accepted !== undefined && event.seq <= accepted) return;
      out.push(`${render(event, options.json ?? false)}\n`, event.seq, part);
      delivered += 1;
      if (limit !== undefined && delivered >= limit) stop.abort(new Error('limit reached'));
    };
    const tailOptions = { signal: stop.signal, beforeCommit: (page: PageInfo) => out.flush(page.partition ?? -1) };
    if (group) {
      await client.tailGroup(options.consumer, options.stream, handler, { ...tailOptions, ...group }).catch((err: unknown) => {
        if (!stop.signal.aborted) throw err;
      });
      return 0;
    }
    if (options.once) {
      const result = await client.drain(options.consumer, options.stream, handler, { ...tailOptions, maxEvents: limit });
      console.error(`tidemark: delivered ${result.delivered}; cursor ${result.cursor}, safe_seq ${result.safeSeq}`);
      return 0;
    }
    await client.tail(options.consumer, options.stream, handler, tailOptions).catch((err: unknown) => {
      if (!stop.signal.aborted) throw err;
    });
    return 0;
  } catch (err) {
    if (err instanceof ResyncRequiredError) {
      throw new CliError(
        `${err.message}. Rebuild what this consumer feeds, then run: tidemark tail --consumer ${options.consumer} --stream ${options.stream}${group ? ` --partitions ${group.partitions}` : ''} --bootstrap`,
        RESYNC_EXIT,
      );
    }
    if (stop.signal.aborted && err === stop.signal.reason) return 0;
    if (err instanceof HandlerError && out.failed(err.cause)) {
      // The page whose lines stdout refused was rolled back: the cursor is
      // at the last page stdout accepted. A reader that went away (EPIPE)
      // is a normal end, like SIGINT; any other failure is not.
      const cursor = `the cursor stays at the last line written${written === undefined ? '' : ` (seq ${written})`}`;
      if ((err.cause as NodeJS.ErrnoException).code === 'EPIPE') {
        console.error(`tidemark: stdout was closed by its reader; ${cursor}`);
        return 0;
      }
      throw new CliError(`cannot write to stdout: ${(err.cause as Error).message}; ${cursor}`, 1);
    }
    throw err;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    out.close();
    await client.close();
    await db.close();
  }
}

/**
 * Stdout for whole pages: lines are collected while a page's handlers run,
 * then written in one write whose callback says whether the stream
 * accepted them (into the pipe or file: a reader that is slow holds the
 * next page back). After a failure (EPIPE, ENOSPC, EBADF), every later
 * flush fails with the same error. A group member's partitions page at
 * once: each keeps its own page (`part`; -1 for a consumer's own cursor).
 */
class PageOutput {
  private readonly pages = new Map<number, { lines: string[]; last: bigint | undefined; accepted: bigint | undefined }>();
  private error: Error | undefined;
  private readonly onError = (err: Error) => void (this.error ??= err);

  constructor(private readonly stream: NodeJS.WriteStream) {
    stream.on('error', this.onError); // reported through the write callback; unhandled it would crash
  }

  private page(part: number) {
    let page = this.pages.get(part);
    if (!page) this.pages.set(part, (page = { lines: [], last: undefined, accepted: undefined }));
    return page;
  }

  /** Seq of the last line of `part` that stdout accepted. */
  acceptedThrough(part = -1): bigint | undefined {
    return this.pages.get(part)?.accepted;
  }

  /** Adds a line of the page being collected; a seq at or below the last one means the page is being delivered again (it failed before its flush): start it over. */
  push(line: string, seq: bigint, part = -1): void {
    const page = this.page(part);
    if (page.last !== undefined && seq <= page.last) page.lines = [];
    page.lines.push(line);
    page.last = seq;
  }

  /** Writes the page's lines; resolves once the stream accepted them, rejects with its error. */
  flush(part = -1): Promise<void> {
    const page = this.page(part);
    const text = page.lines.join('');
    return new Promise<void>((resolve, reject) => {
      if (this.error) return reject(this.error);
      if (this.stream.destroyed || !this.stream.writable) return reject((this.error = closedStdout()));
      this.stream.write(text, (err) => {
        if (err || this.error) return reject((this.error ??= err ?? undefined));
        page.lines = [];
        page.accepted = page.last;
        resolve();
      });
    });
  }

  /** Whether `err` is this output's failure. */
  failed(err: unknown): boolean {
    return err !== undefined && err === this.error;
  }

  close(): void {
    this.stream.off('error', this.onError);
  }
}

function closedStdout(): NodeJS.ErrnoException {
  return Object.assign(new Error('stdout is closed (EBADF)'), { code: 'EBADF', syscall: 'write' });
}

/** Whether fd 1 is /dev/null (where Node also puts a stdout that was closed). */
function stdoutIsNull(): boolean {
  try {
    const out = fstatSync(1);
    return out.isCharacterDevice() && out.rdev === statSync('/dev/null').rdev;
  } catch {
    return false;
  }
}
