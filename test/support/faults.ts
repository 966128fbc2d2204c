/**
 * What the fault tests (test/faults/) share: writers that keep appending
 * through failures, a projection that records each delivery with the
 * cursor, the NDJSON a CLI tail prints, and stopping child processes.
 * Timings recorded here are reported, never pass/fail criteria.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import type pg from 'pg';
import { append } from '../../src/outbox/append.js';
import type { Handler } from '../../src/consumer/events.js';
import { exited, type watchStderr } from './cli.js';

/** The SQLSTATE or socket code of an error, or of the first error in its `cause` chain that has one. */
export function errorCode(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e && depth < 8; e = (e as { cause?: unknown }).cause, depth += 1) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$|^E[A-Z]+$/.test(code)) return code;
  }
  return undefined;
}

export interface Writers {
  /** Appends that returned a seq (committed). */
  readonly ok: number;
  /** Appends that failed; the loop tried again. One that failed on a lost connection may still have committed. */
  readonly errors: number;
  /** Failures by SQLSTATE or socket code (`other` without one). */
  readonly errorCodes: Map<string, number>;
  /** Appends that returned after `since` (a `performance.now()` instant). */
  okSince(since: number): number;
  /** Stops the loops; resolves when none is appending any more. */
  stop(): Promise<void>;
}

/**
 * `count` loops appending to `stream` one event per autocommit statement,
 * each pausing `pauseMs` between appends (load shaping, not
 * synchronisation) and `retryMs` after a failure. With `freshConnection`
 * every append opens a connection of its own and closes it after, so
 * writers meet a connection limit on every append.
 */
export function startWriters(
  pool: pg.Pool,
  options: { count?: number; stream?: string; pauseMs?: number; retryMs?: number; freshConnection?: boolean } = {},
): Writers {
  const { count = 4, stream = 's', pauseMs = 2, retryMs = 20, freshConnection = false } = options;
  let running = true;
  const okAt: number[] = [];
  const errorCodes = new Map<string, number>();
  let errors = 0;
  const loop = async (w: number) => {
    for (let n = 0; running; n += 1) {
      try {
        if (freshConnection) {
          // A connection of its own for this append, closed after it.
          const client = await pool.connect();
          try {
            await append(client, { stream, kind: 'fault.write', key: `w${w}`, payload: { w, n } });
          } finally {
            client.release(true);
          }
        } else {
          await append(pool, { stream, kind: 'fault.write', key: `w${w}`, payload: { w, n } });
        }
        okAt.push(performance.now());
        await delay(pauseMs);
      } catch (err) {
        errors += 1;
        const code = errorCode(err) ?? 'other';
        errorCodes.set(code, (errorCodes.get(code) ?? 0) + 1);
        await delay(retryMs);
      }
    }
  };
  const loops = Array.from({ length: count }, (_, w) => loop(w));
  return {
    get ok() {
      return okAt.length;
    },
    get errors() {
      return errors;
    },
    errorCodes,
    okSince: (since) => {
      const i = okAt.findIndex((t) => t > since); // ascending: pushed as they return
      return i < 0 ? 0 : okAt.length - i;
    },
    async stop() {
      running = false;
      await Promise.all(loops);
    },
  };
}

/** The projection the in-process tailers keep: one row per delivery, numbered in delivery order. */
export const EFFECTS_TABLE_SQL = 'CREATE TABLE IF NOT EXISTS public.fault_effects (n bigserial PRIMARY KEY, consumer text NOT NULL, seq bigint NOT NULL)';

/** A handler that writes each event into `fault_effects` in the page's transaction, so the effect commits with the cursor. */
export function effectHandler(consumer: string): Handler {
  return async (event, tx) => {
    await tx.query('INSERT INTO public.fault_effects (consumer, seq) VALUES ($1, $2)', [consumer, event.seq.toString()]);
  };
}

/** The seqs `consumer`'s effects hold, in delivery order. */
export async function effectSeqs(db: Pick<pg.ClientBase, 'query'>, consumer: string): Promise<bigint[]> {
  const r = await db.query<{ seq: string }>('SELECT seq FROM public.fault_effects WHERE consumer = $1 ORDER BY n', [consumer]);
  return r.rows.map((row) => BigInt(row.seq));
}

/** Every committed seq of `stream`, ascending: the only truth about what writers wrote. */
export async function committedSeqs(db: Pick<pg.ClientBase, 'query'>, stream = 's'): Promise<bigint[]> {
  const r = await db.query<{ seq: string }>('SELECT seq FROM tidemark.events WHERE stream = $1 ORDER BY seq', [stream]);
  return r.rows.map((row) => BigInt(row.seq));
}

/** How a tailer's deliveries differ from the committed events (all empty / 0: exactly once, in order). */
export interface DeliveryCheck {
  /** Seqs delivered more than once. */
  duplicated: string[];
  /** Committed seqs never delivered. */
  missing: string[];
  /** Delivered seqs that are not committed events. */
  unknown: string[];
  /** Deliveries of a lower seq after a higher one. */
  outOfOrder: number;
}

/** The {@link DeliveryCheck} of exactly once, in order. */
export const EXACTLY_ONCE: DeliveryCheck = Object.freeze({ duplicated: [], missing: [], unknown: [], outOfOrder: 0 }) as DeliveryCheck;

/** Compares deliveries (in delivery order) with the committed seqs; lists at most 20 of each kind. */
export function checkDeliveries(delivered: readonly bigint[], committed: readonly bigint[]): DeliveryCheck {
  const seen = new Map<bigint, number>();
  let outOfOrder = 0;
  delivered.forEach((seq, i) => {
    seen.set(seq, (seen.get(seq) ?? 0) + 1);
    if (i > 0 && seq < delivered[i - 1]!) outOfOrder += 1;
  });
  const wanted = new Set(committed);
  const few = (seqs: bigint[]) => seqs.slice(0, 20).map(String).concat(seqs.length > 20 ? [`... ${seqs.length} in all`] : []);
  return {
    duplicated: few([...seen].filter(([, n]) => n > 1).map(([seq]) => seq)),
    missing: few(committed.filter((seq) => !seen.has(seq))),
    unknown: few([...seen.keys()].filter((seq) => !wanted.has(seq))),
    outOfOrder,
  };
}

/** Deliveries of a CLI `tail --json`: each line's seq and when the test received it. */
export interface NdjsonTail {
  readonly seqs: bigint[];
  /** `performance.now()` at which each line arrived. */
  readonly times: number[];
  /** Lines that were not an event (reported by the test). */
  readonly junk: string[];
}

export function collectNdjson(child: ChildProcess): NdjsonTail {
  const tail: NdjsonTail = { seqs: [], times: [], junk: [] };
  let rest = '';
  child.stdout!.on('data', (d: Buffer) => {
    const at = performance.now();
    const lines = (rest + d.toString()).split('\n');
    rest = lines.pop()!;
    for (const line of lines) {
      try {
        tail.seqs.push(BigInt((JSON.parse(line) as { seq: string }).seq));
        tail.times.push(at);
      } catch {
        tail.junk.push(line);
      }
    }
  });
  return tail;
}

/** Lines of a child's output stream with the instant (`performance.now()`) each arrived. */
export interface TimedLines {
  readonly lines: { at: number; line: string }[];
  /** The lines after `since`, each prefixed with its time relative to `origin`, e.g. `+812 ms`. */
  since(since: number, origin?: number): string;
}

export function timedLines(stream: NodeJS.ReadableStream): TimedLines {
  const lines: { at: number; line: string }[] = [];
  let rest = '';
  stream.on('data', (d: Buffer) => {
    const at = performance.now();
    const parts = (rest + d.toString()).split('\n');
    rest = parts.pop()!;
    for (const line of parts) lines.push({ at, line });
  });
  return {
    lines,
    since: (since, origin = since) =>
      lines
        .filter((l) => l.at > since)
        .map((l) => `${l.at >= origin ? '+' : ''}${Math.round(l.at - origin)} ms  ${l.line}`)
        .join('\n'),
  };
}

/** The first instant in ascending `times` after `since`, or undefined. */
export function firstAfter(times: readonly number[], since: number): number | undefined {
  return times.find((t) => t > since);
}

/** True while the child has neither exited nor been killed. */
export function alive(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

/** Waits for a stderr line matching `pattern` (see `watchStderr`), failing at once if the child exits first. */
export async function stderrLine(
  child: ChildProcess,
  log: ReturnType<typeof watchStderr>,
  pattern: RegExp,
  timeoutMs = 60_000,
): Promise<RegExpMatchArray> {
  const line = log.next(pattern, timeoutMs);
  const died = exited(child).then((code) => {
    throw new Error(`the child exited (${code}) before printing ${pattern}:\n${log.text()}`);
  });
  line.catch(() => undefined);
  died.catch(() => undefined);
  return Promise.race([line, died]);
}

/** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
export async function stopChild(child: ChildProcess, graceMs = 5000): Promise<void> {
  if (!alive(child)) return;
  child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const done = await Promise.race([exited(child).then(() => true), new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), graceMs)))]);
  clearTimeout(timer);
  if (!done) {
    child.kill('SIGKILL');
    await exited(child);
  }
}

/** One line about an error for diagnostics: its codes down the cause chain and its message. */
export function describeError(err: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = err, depth = 0; e && depth < 8; e = (e as { cause?: unknown }).cause, depth += 1) {
    const code = (e as { code?: unknown }).code;
    parts.push(`${typeof code === 'string' ? `${code} ` : ''}${e instanceof Error ? e.message : String(e)}`);
  }
  return parts.join(' <- ');
}

/** The observer's retry events of a StreamClient, described one per line (with times relative to `origin`, if given). */
export function describeRetries(events: readonly { at: number; event: { type: string } }[], origin?: number): string[] {
  return events
    .filter((o) => o.event.type === 'retry')
    .map((o) => {
      const e = o.event as { attempt?: number; delayMs?: number; error?: unknown };
      const at = origin === undefined ? '' : `${o.at >= origin ? '+' : ''}${Math.round(o.at - origin)} ms  `;
      return `${at}attempt ${e.attempt}, delay ${e.delayMs} ms: ${describeError(e.error)}`;
    });
}

/** Milliseconds with one decimal, for diagnostics. */
export function ms(value: number | undefined): string {
  return value === undefined ? 'n/a' : `${value.toFixed(1)} ms`;
}

/** A fixture process (test/faults/fixtures), run through tsx. */
export interface FixtureProcess {
  child: ChildProcess;
  /** Its stdout, line by line, as they come. */
  lines: string[];
  stderr: () => string;
}

/** Starts `fixture` (a path) with `args`; its stdout lines are collected; stdin is a pipe when `stdin` is set. */
export function startFixture(fixture: string, args: string[], options: { stdin?: boolean } = {}): FixtureProcess {
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), fixture, ...args], { stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  let rest = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => {
    const parts = (rest + d.toString()).split('\n');
    rest = parts.pop()!;
    lines.push(...parts);
  });
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  return { child, lines, stderr: () => stderr };
}
