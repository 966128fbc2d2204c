import { Histogram } from './histogram.js';
import type { BenchEvent, Contender, Writer } from './contenders/types.js';

/** The shape of one load: how many writers, what each transaction does, how fast. */
export interface LoadProfile {
  writers: number;
  durationMs: number;
  /** Events per transaction. Default 1. */
  eventsPerTx?: () => number;
  /** How long a transaction stays open, split at random before and after its event inserts. Default 0. */
  holdMs?: () => number;
  /** Whether a transaction rolls back. Default never. */
  rollback?: () => boolean;
  /** Record committed ids for the gap checker. */
  record?: boolean;
  /** Offered transactions per second across all writers (open loop); closed loop when absent. */
  txPerSec?: number;
  /** Entity keys are `${keyPrefix}${writer}`. */
  keyPrefix?: string;
  /** Called after each COMMIT returns, with the epoch time in ms. */
  onCommit?: (events: BenchEvent[], atMs: number) => void;
  /** Use these instead of the contender's writers (a plain INSERT, say). */
  writer?: (url: string) => Promise<Writer>;
  /**
   * Awaited once the writers are connected, before the clock starts: loads
   * that share one (from {@link startTogether}) start at one instant.
   */
  ready?: () => Promise<void>;
}

/** An arrival for each of `parties` loads; each resolves once all have arrived. */
export function startTogether(parties: number): () => Promise<void> {
  let arrived = 0;
  let open!: () => void;
  const all = new Promise<void>((resolve) => (open = resolve));
  return () => {
    arrived += 1;
    if (arrived === parties) open();
    return all;
  };
}

export interface LoadResult {
  committedTx: number;
  committedEvents: number;
  rolledBack: number;
  errors: number;
  firstError?: string;
  elapsedMs: number;
  /** Transaction latency from its intended start (open loop) or its start (closed loop). */
  latency: Histogram;
}

let nextId = 1;

/** Ids unique within this process (offset per process by `base`). */
export function takeIds(n: number): number[] {
  const ids: number[] = [];
  for (let i = 0; i < n; i += 1) ids.push(nextId++);
  return ids;
}

export function setIdBase(base: number): void {
  nextId = base;
}

/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes on one machine. */
export function epochMs(): number {
  return performance.timeOrigin + performance.now();
}

/**
 * The shared load generator: `writers` connections, each running
 * transactions back to back (or on an open-loop schedule) until the duration
 * ends or `signal` aborts. Errors are counted, never thrown.
 */
export async function runLoad(contender: Contender, url: string, profile: LoadProfile, signal?: AbortSignal): Promise<LoadResult> {
  const result: LoadResult = { committedTx: 0, committedEvents: 0, rolledBack: 0, errors: 0, elapsedMs: 0, latency: new Histogram() };
  const make = profile.writer ?? ((u: string) => contender.writer(u));
  const writers = await Promise.all(Array.from({ length: profile.writers }, () => make(url)));
  await profile.ready?.();
  const start = performance.now();
  const end = start + profile.durationMs;
  const interval = profile.txPerSec ? 1000 / profile.txPerSec : 0;
  try {
    await Promise.all(
      writers.map(async (writer, w) => {
        const key = `${profile.keyPrefix ?? 'w'}${w}`;
        for (let k = 0; ; k += 1) {
          let due = performance.now();
          if (interval > 0) {
            due = start + (k * profile.writers + w) * interval;
            const wait = due - performance.now();
            if (wait > 0) await new Promise((r) => setTimeout(r, wait));
          }
          if (performance.now() >= end || signal?.aborted) return;
          const events = takeIds(profile.eventsPerTx?.() ?? 1).map((id) => ({ id, key }));
          const rollback = profile.rollback?.() ?? false;
          try {
            const hold = profile.holdMs?.() ?? 0;
            const before = hold * Math.random();
            await writer.write(events, { holdBeforeMs: before, holdMs: hold - before, rollback, record: profile.record });
            if (rollback) {
              result.rolledBack += 1;
            } else {
              profile.onCommit?.(events, epochMs());
              result.committedTx += 1;
              result.committedEvents += events.length;
              result.latency.recordMs(performance.now() - due);
            }
          } catch (err) {
            result.errors += 1;
            result.firstError ??= (err as Error).message;
          }
        }
      }),
    );
  } finally {
    result.elapsedMs = performance.now() - start;
    await Promise.all(writers.map((w) => w.close().catch(() => undefined)));
  }
  return result;
}
