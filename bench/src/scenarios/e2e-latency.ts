import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { DEFAULT_SCHEMA, notifyChannel, wakeChannel } from 'tidemark';
import { quoteIdent } from '../db.js';
import { installedDatabase, settle, type BenchContext } from '../context.js';
import { Histogram } from '../histogram.js';
import { epochMs } from '../load.js';
import type { Contender } from '../contenders/types.js';
import type { Goal, ScenarioResult } from '../report.js';
import { spawnWorker } from '../worker.js';
import { cpuPercent, sampleCpu, type CpuSample } from '../cpu.js';
import { WATERMARKER_APPS } from './watermarkers.js';
import { naiveContender } from '../contenders/baselines.js';
import { startLogicalServer, streamInserts } from '../logical.js';

/** Above this offered rate, events are batched into transactions (see the method note). */
const MAX_TX_PER_SEC = 1000;

/** The contenders that also get the idle probes: tidemark, and the naive 5 ms poller as the reference. */
const IDLE_PROBED = new Set(['tidemark', 'naive']);

interface WriteReport {
  type: 'write';
  commits: [number, number][];
  result: { committedEvents: number; elapsedMs: number; errors: number; firstError?: string };
}

/**
 * Commit -> handler latency at offered rates. The load runs in a child
 * process (8 writers, open loop, one event per transaction) and reports when
 * each COMMIT returned; the consumer runs here and notes when each handler
 * ran. Both clocks are the machine's wall clock at sub-millisecond precision.
 */
export async function e2eLatency(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const rates = ctx.pick([1000], [100, 1000, 5000]);
  const windowMs = ctx.pick(600, 5000);
  const probes = ctx.pick(3, 50);
  const idleMs: [number, number] = ctx.pick([600, 900], [2000, 10000]);
  const rows: (string | number | null)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  /** tidemark's watermarker backends' CPU per offered rate. */
  const watermarkerCpu = new Map<number, number | null>();
  for (const contender of ctx.contenders) {
    const { url, pool } = await installedDatabase(ctx.server, contender, `e2e_${contender.id}`);
    const services = await contender.services?.(url);
    const received = new Map<number, number>();
    const seqs = new Map<number, bigint>();
    // tidemark: each publication as a listener of its own hears it (safe_seq, when).
    const publications = contender.id === 'tidemark' ? await listenPublications(url) : undefined;
    const stop = new AbortController();
    const consuming = contender
      .consume(
        url,
        async (_tx, events) => {
          const now = epochMs();
          for (const e of events) {
            if (received.has(e.id)) continue;
            received.set(e.id, now);
            if (e.seq !== undefined) seqs.set(e.id, e.seq);
          }
        },
        { name: 'c1', batchSize: 1000, signal: stop.signal },
      )
      .catch(() => undefined);
    try {
      for (const [i, rate] of rates.entries()) {
        ctx.progress.step(`end-to-end latency: ${contender.id} at ${rate} events/s`);
        const perTx = Math.max(1, Math.ceil(rate / MAX_TX_PER_SEC));
        const { report, summary: s, undelivered, achieved, cpu } = await measureWindow(
          ctx,
          [contender.id, url, '8', String(rate / perTx), String(perTx), String(windowMs), String((i + 1) * 1e8), `r${rate}-`],
          received,
          pool,
        );
        if (publications) notes.push(breakdown(`${contender.title} at ${rate} events/s`, report.commits, seqs, received, publications.heard));
        publications?.heard.splice(0);
        rows.push([contender.title, rate, perTx, achieved, s.p50, s.p99, s.p999, s.max, undelivered, cpu.all]);
        if (contender.id === 'tidemark') watermarkerCpu.set(rate, cpu.watermarker);
        if (report.result.errors > 0) notes.push(`${contender.title} at ${rate}/s: ${report.result.errors} writer errors (${report.result.firstError})`);
        if (contender.id === 'tidemark' && rate === 5000) {
          goals.push({ goal: 'end-to-end: tidemark commit→handler p99 at 5,000 events/s', target: '<= 25 ms', measured: `${s.p99.toFixed(1)} ms (achieved ${achieved.toFixed(0)} events/s)`, met: s.p99 <= 25 });
        }
        if (contender.id === 'tidemark' && rate === 100) {
          goals.push({ goal: 'end-to-end: tidemark commit→handler p50 at 100 events/s', target: '<= 3 ms', measured: `${s.p50.toFixed(2)} ms`, met: s.p50 <= 3 });
        }
      }
      if (contender.id === 'tidemark') {
        // Writers as fast as they go: how closely safe_seq follows commits when the fence is never free for long.
        ctx.progress.step('end-to-end latency: tidemark under 8 closed-loop writers');
        publications?.heard.splice(0);
        const { report, summary: s, undelivered, achieved, cpu } = await measureWindow(
          ctx,
          [contender.id, url, '8', '0', '1', String(windowMs), String(SATURATED_ID_BASE), 'sat-'],
          received,
          pool,
        );
        rows.push([contender.title, 'closed loop, 8 writers', 1, achieved, s.p50, s.p99, s.p999, s.max, undelivered, cpu.all]);
        const title = `${contender.title} under 8 closed-loop writers (${achieved.toFixed(0)} events/s)`;
        const split = splitAtPublication(report.commits, seqs, received, publications!.heard);
        notes.push(breakdownText(title, split, report.commits.length, publications!.heard.length));
        const p = split.toPublication.summary();
        goals.push({
          goal: 'end-to-end: tidemark commit→safe_seq p99 under 8 closed-loop writers',
          target: '<= 10 ms',
          measured: `${p.p99.toFixed(2)} ms (p50 ${p.p50.toFixed(2)}, ${achieved.toFixed(0)} events/s)`,
          met: p.p99 <= 10,
        });
      }
      if (IDLE_PROBED.has(contender.id)) {
        ctx.progress.step(`end-to-end latency: ${contender.id}, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle, ${probes} times`);
        publications?.heard.splice(0);
        publications?.woken.splice(0);
        const before = await sampleCpu(pool, NOT_DELIVERY);
        const { summary: s, undelivered, commits } = await idleProbes(contender, url, received, probes, idleMs);
        const idleCpu = cpuPercent(before, await sampleCpu(pool, NOT_DELIVERY));
        if (publications) {
          const title = `${contender.title}, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle`;
          notes.push(`${breakdown(title, commits, seqs, received, publications.heard)}; ${wakeSplit(commits, seqs, publications.heard, publications.woken)}`);
        }
        rows.push([contender.title, `1 after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle`, 1, null, s.p50, s.p99, s.p999, s.max, undelivered, idleCpu]);
        if (contender.id === 'tidemark') {
          goals.push({ goal: `end-to-end: tidemark, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle (${probes} times), p50`, target: '<= 3 ms', measured: `${s.p50.toFixed(2)} ms`, met: s.p50 <= 3 });
          goals.push({ goal: `end-to-end: tidemark, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle (${probes} times), p99`, target: '<= 10 ms', measured: `${s.p99.toFixed(2)} ms`, met: s.p99 <= 10 });
        }
      }
    } finally {
      stop.abort();
      await publications?.close();
      await consuming;
      await services?.stop();
      await pool.end();
    }
  }
  if (ctx.references.includes('logical')) {
    const logical = await logicalDecodingRows(ctx, rates, windowMs).catch((err: Error) => {
      notes.push(`logical decoding (the physical-limit row) could not run: ${err.message}`);
      return [];
    });
    rows.push(...logical);
  }
  if (watermarkerCpu.size > 0) {
    const pct = (x: number | null | undefined) => (x === null || x === undefined ? 'not measured (no /proc)' : `${x.toFixed(1)}%`);
    notes.push(
      `tidemark's watermarker backends (the in-database loop and its pool), CPU in % of one core: ` +
        [...watermarkerCpu].map(([rate, x]) => `${pct(x)} at ${rate.toLocaleString('en-US')} events/s`).join(', ') +
        '; its client runs in the bench process, counted in the delivery column (section 4 counts both at 800 transactions/s).',
    );
    if (watermarkerCpu.has(5000)) {
      const x = watermarkerCpu.get(5000);
      goals.push({ goal: 'watermarker CPU at 5,000 events/s (its backends, % of one core)', target: '<= 5%', measured: pct(x), met: x === null || x === undefined ? null : x <= 5 });
    }
  }
  if (goals.length === 0 && ctx.contenders.some((c) => c.id === 'tidemark')) {
    goals.push({ goal: 'end-to-end: tidemark commit→handler p99 at 5,000 events/s', target: '<= 25 ms', measured: 'not run at 5,000/s (--quick)', met: null });
  }
  return {
    id: 'e2e-latency',
    title: '5. End-to-end latency',
    method:
      `8 writers in a separate process, open loop, ${windowMs / 1000} s per rate, at most ${MAX_TX_PER_SEC} transactions/s (above that, several events per transaction: ` +
      'one connection\'s BEGIN, INSERT, COMMIT with a synchronous commit cannot go much faster here, for any contender); latency from COMMIT returning in the writer to the handler running. ' +
      'Contenders run one after another. "achieved" is what the writers committed; an offered rate a contender cannot sustain shows there. ' +
      "For tidemark, the notes split each event's latency at the publication that first covered it, as a listener of the bench's own heard it. " +
      `Idle rows (tidemark and the naive poller): ${probes} times, nothing written for a random ${idleMs[0] / 1000}-${idleMs[1] / 1000} s, then one event in a transaction of its own, from the bench's process. ` +
      `Closed loop (tidemark): the same 8 writers as fast as they commit, one event per transaction, ${windowMs / 1000} s; its note and goal give commit→safe_seq (the publication, as the bench's listener heard it). ` +
      'Physical limit: logical decoding on a server of its own started with wal_level=logical (the embedded PostgreSQL, whatever server the contenders use), ' +
      'the same writers and table as the naive poller, a test_decoding slot streamed over the replication protocol (as pg_recvlogical does) into the bench process; latency from COMMIT returning to the INSERT arriving. ' +
      'Delivery CPU: the bench process (the consumer; tidemark\'s watermarker client too) and the contender\'s backends other than the writers\' and the bench\'s own, over the window, in % of one core (idle rows: over all the probes).',
    columns: ['contender', 'offered events/s', 'events/tx', 'achieved events/s', 'p50 ms', 'p99 ms', 'p99.9 ms', 'max ms', 'undelivered', 'delivery CPU %'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}

/** One window of load from the write worker (`args`), then its events' commit -> arrival latencies. */
async function measureWindow(
  ctx: BenchContext,
  args: string[],
  received: Map<number, number>,
  cpuOf?: pg.Pool,
): Promise<{ report: WriteReport; summary: ReturnType<Histogram['summary']>; undelivered: number; achieved: number; cpu: DeliveryCpu }> {
  const before = cpuOf ? await sampleCpu(cpuOf, NOT_DELIVERY) : undefined;
  const child = spawnWorker(['write', ...args]);
  const exited = once(child, 'exit').catch(() => undefined);
  const [report] = (await once(child, 'message')) as [WriteReport];
  const cpu = deliveryCpu(before, cpuOf ? await sampleCpu(cpuOf, NOT_DELIVERY) : undefined);
  await exited;
  await settle(
    async () => {
      let left = 0;
      for (const [id] of report.commits) if (!received.has(id)) left += 1;
      return { done: left === 0, progress: left };
    },
    ctx.pick(1500, 3000),
    ctx.pick(4000, 10000),
  );
  const h = new Histogram();
  let undelivered = 0;
  for (const [id, at] of report.commits) {
    const got = received.get(id);
    if (got === undefined) undelivered += 1;
    else h.recordMs(Math.max(0, got - at));
  }
  return { report, summary: h.summary(), undelivered, achieved: (report.result.committedEvents / report.result.elapsedMs) * 1000, cpu };
}

/** The bench's own sessions and the writers': not the delivery side. */
const NOT_DELIVERY = ['tidemark-bench', 'tidemark-bench-admin', 'tidemark-bench-writer', 'tidemark-bench-listener'];

/** Delivery CPU over a window, in % of one core: all of it, and tidemark's watermarker backends alone. */
interface DeliveryCpu {
  /** This process (the consumer, and tidemark's watermarker client) and the contender's backends but the writers' and the bench's own. */
  all: number | null;
  /** The watermarker's backends (its pool's and the in-database loop's). */
  watermarker: number | null;
}

function deliveryCpu(a: CpuSample | undefined, b: CpuSample | undefined): DeliveryCpu {
  if (!a || !b) return { all: null, watermarker: null };
  return { all: cpuPercent(a, b), watermarker: cpuPercent(a, b, { backendsOnly: true, pick: (app) => WATERMARKER_APPS.includes(app) }) };
}

/**
 * `probes` times: nothing written for a random while within `idleMs`, then
 * one event, and its commit -> handler latency (the consumer under way
 * notes each arrival in `received`).
 */
async function idleProbes(
  contender: Contender,
  url: string,
  received: Map<number, number>,
  probes: number,
  idleMs: [number, number],
): Promise<{ summary: ReturnType<Histogram['summary']>; undelivered: number; commits: [number, number][] }> {
  const writer = await contender.writer(url);
  const h = new Histogram();
  const commits: [number, number][] = [];
  let undelivered = 0;
  try {
    for (let k = 0; k < probes; k += 1) {
      await sleep(idleMs[0] + Math.random() * (idleMs[1] - idleMs[0]));
      const event = { id: IDLE_ID_BASE + k, key: 'idle' };
      await writer.write([event]);
      const at = epochMs();
      commits.push([event.id, at]);
      const deadline = performance.now() + 5000;
      while (!received.has(event.id) && performance.now() < deadline) await sleep(1);
      const got = received.get(event.id);
      if (got === undefined) undelivered += 1;
      else h.recordMs(Math.max(0, got - at));
    }
  } finally {
    await writer.close();
  }
  return { summary: h.summary(), undelivered, commits };
}

/** Ids of the idle probes' events: above every rate's (the workers number from (i + 1) * 1e8). */
const IDLE_ID_BASE = 900_000_000;

/** A connection of the bench's own, LISTENing to the publications of the default schema: each safe_seq and when it was heard. */
async function listenPublications(url: string): Promise<{ heard: [bigint, number][]; woken: number[]; close: () => Promise<void> }> {
  const client = new pg.Client({ connectionString: url, application_name: 'tidemark-bench-listener' });
  await client.connect();
  const heard: [bigint, number][] = [];
  const woken: number[] = [];
  const wake = wakeChannel(DEFAULT_SCHEMA);
  client.on('notification', (n) => {
    if (n.channel === wake) woken.push(epochMs());
    else if (n.payload !== undefined) heard.push([BigInt(n.payload), epochMs()]);
  });
  await client.query(`LISTEN ${quoteIdent(notifyChannel(DEFAULT_SCHEMA))}`);
  // The writers' wake-ups of a sleeping watermarker (docs/PROTOCOL.md §3.13): heard after idle only.
  await client.query(`LISTEN ${quoteIdent(wake)}`);
  return { heard, woken, close: () => client.end() };
}

/**
 * The idle probes' split: from the writer's wake-up of the sleeping
 * watermarker, as the bench's listener heard it, to the publication that
 * covered the probe (the watermarker's client waking, its run starting,
 * looking and stepping). The wake-up is sent at the writer's commit, so it
 * is heard about when COMMIT returns.
 */
function wakeSplit(commits: [number, number][], seqs: Map<number, bigint>, heard: [bigint, number][], woken: number[]): string {
  const toPublication = new Histogram();
  let unsplit = 0;
  for (const [id, at] of commits) {
    const seq = seqs.get(id);
    const published = seq === undefined ? undefined : heard.find(([s]) => s >= seq)?.[1];
    // The first wake-up heard within 5 ms before the COMMIT returned, or after it.
    const wake = woken.find((w) => w >= at - 5);
    if (published === undefined || wake === undefined || wake > published) {
      unsplit += 1;
      continue;
    }
    toPublication.recordMs(published - wake);
  }
  const a = toPublication.summary();
  return `wake-up→publication p50 ${a.p50.toFixed(2)} / p99 ${a.p99.toFixed(2)} ms (${woken.length} wake-ups heard; ${unsplit} probes not split)`;
}

/** Each event's latency split at the publication that first covered it. */
interface PublicationSplit {
  /** COMMIT -> the publication, heard by the bench's listener: the watermarker noticing, stepping and committing, and the notification's trip. */
  toPublication: Histogram;
  /** The publication -> the handler: the consumer waking, reading the page, calling the handler. */
  toHandler: Histogram;
  /** Events delivered before their publication was heard (or whose publication was skipped): not split. */
  unheard: number;
}

function splitAtPublication(commits: [number, number][], seqs: Map<number, bigint>, received: Map<number, number>, heard: [bigint, number][]): PublicationSplit {
  const toPublication = new Histogram();
  const toHandler = new Histogram();
  let unheard = 0;
  for (const [id, at] of commits) {
    const seq = seqs.get(id);
    const handled = received.get(id);
    if (seq === undefined || handled === undefined) continue;
    // safe_seq only grows: the first publication at or above seq.
    let lo = 0;
    let hi = heard.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (heard[mid]![0] >= seq) hi = mid;
      else lo = mid + 1;
    }
    const published = heard[lo]?.[1];
    if (published === undefined || published > handled) {
      unheard += 1;
      continue;
    }
    toPublication.recordMs(Math.max(0, published - at));
    toHandler.recordMs(handled - published);
  }
  return { toPublication, toHandler, unheard };
}

function breakdownText(title: string, split: PublicationSplit, events: number, publications: number): string {
  const a = split.toPublication.summary();
  const b = split.toHandler.summary();
  const ms = (x: number) => x.toFixed(2);
  return (
    `${title}: commit→publication p50 ${ms(a.p50)} / p99 ${ms(a.p99)} ms, publication→handler p50 ${ms(b.p50)} / p99 ${ms(b.p99)} ms ` +
    `(${publications} publications, ${(events / Math.max(1, publications)).toFixed(1)} events each; ${split.unheard} events not split)`
  );
}

/** Where one rate's milliseconds went, per event (splitAtPublication), as a note. */
function breakdown(title: string, commits: [number, number][], seqs: Map<number, bigint>, received: Map<number, number>, heard: [bigint, number][]): string {
  return breakdownText(title, splitAtPublication(commits, seqs, received, heard), commits.length, heard.length);
}

/** Ids of the closed-loop phase's events: above every rate's, below the idle probes'. */
const SATURATED_ID_BASE = 800_000_000;

/**
 * The physical-limit rows: the naive poller's writers and table on a server
 * with wal_level=logical, each INSERT streamed from a test_decoding slot.
 */
async function logicalDecodingRows(ctx: BenchContext, rates: number[], windowMs: number): Promise<(string | number | null)[][]> {
  ctx.progress.step('end-to-end latency: logical decoding (starting a server with wal_level=logical)');
  const server = await startLogicalServer();
  const rows: (string | number | null)[][] = [];
  try {
    const pool = new pg.Pool({ connectionString: server.url, max: 2 });
    try {
      await naiveContender.install(pool);
    } finally {
      await pool.end();
    }
    const received = new Map<number, number>();
    const stream = await streamInserts(server.url, 'bench_e2e', (row) => {
      const id = /"id": (\d+)/.exec(row)?.[1];
      if (id !== undefined && !received.has(Number(id))) received.set(Number(id), epochMs());
    });
    try {
      for (const [i, rate] of rates.entries()) {
        ctx.progress.step(`end-to-end latency: logical decoding at ${rate} events/s`);
        const perTx = Math.max(1, Math.ceil(rate / MAX_TX_PER_SEC));
        const { summary: s, undelivered, achieved } = await measureWindow(
          ctx,
          [naiveContender.id, server.url, '8', String(rate / perTx), String(perTx), String(windowMs), String((i + 1) * 1e8), `r${rate}-`],
          received,
        );
        rows.push([LOGICAL_TITLE, rate, perTx, achieved, s.p50, s.p99, s.p999, s.max, undelivered, null]);
      }
    } finally {
      await stream.close();
    }
  } finally {
    await server.stop();
  }
  return rows;
}

const LOGICAL_TITLE = 'physical limit: logical decoding (test_decoding slot, own server, wal_level=logical)';
