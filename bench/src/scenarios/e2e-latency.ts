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
  const windowMs = ctx.pick(1000, 5000);
  const probes = ctx.pick(3, 50);
  const idleMs: [number, number] = ctx.pick([1000, 1500], [2000, 10000]);
  const rows: (string | number | null)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
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
        const child = spawnWorker(['write', contender.id, url, '8', String(rate / perTx), String(perTx), String(windowMs), String((i + 1) * 1e8), `r${rate}-`]);
        const [report] = (await once(child, 'message')) as [WriteReport];
        await once(child, 'exit').catch(() => undefined);
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
        const s = h.summary();
        if (publications) notes.push(breakdown(`${contender.title} at ${rate} events/s`, report.commits, seqs, received, publications.heard));
        publications?.heard.splice(0);
        const achieved = (report.result.committedEvents / report.result.elapsedMs) * 1000;
        rows.push([contender.title, rate, perTx, achieved, s.p50, s.p99, s.p999, s.max, undelivered]);
        if (report.result.errors > 0) notes.push(`${contender.title} at ${rate}/s: ${report.result.errors} writer errors (${report.result.firstError})`);
        if (contender.id === 'tidemark' && rate === 5000) {
          goals.push({ goal: 'end-to-end: tidemark commit→handler p99 at 5,000 events/s', target: '<= 25 ms', measured: `${s.p99.toFixed(1)} ms (achieved ${achieved.toFixed(0)} events/s)`, met: s.p99 <= 25 });
        }
        if (contender.id === 'tidemark' && rate === 100) {
          goals.push({ goal: 'end-to-end: tidemark commit→handler p50 at 100 events/s', target: '<= 3 ms', measured: `${s.p50.toFixed(2)} ms`, met: s.p50 <= 3 });
        }
      }
      if (IDLE_PROBED.has(contender.id)) {
        ctx.progress.step(`end-to-end latency: ${contender.id}, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle, ${probes} times`);
        publications?.heard.splice(0);
        publications?.woken.splice(0);
        const { summary: s, undelivered, commits } = await idleProbes(contender, url, received, probes, idleMs);
        if (publications) {
          const title = `${contender.title}, one event after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle`;
          notes.push(`${breakdown(title, commits, seqs, received, publications.heard)}; ${wakeSplit(commits, seqs, publications.heard, publications.woken)}`);
        }
        rows.push([contender.title, `1 after ${idleMs[0] / 1000}-${idleMs[1] / 1000} s idle`, 1, null, s.p50, s.p99, s.p999, s.max, undelivered]);
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
      `Idle rows (tidemark and the naive poller): ${probes} times, nothing written for a random ${idleMs[0] / 1000}-${idleMs[1] / 1000} s, then one event in a transaction of its own, from the bench's process.`,
    columns: ['contender', 'offered events/s', 'events/tx', 'achieved events/s', 'p50 ms', 'p99 ms', 'p99.9 ms', 'max ms', 'undelivered'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
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

/**
 * Where one rate's milliseconds went, per event: from its COMMIT to the
 * publication that first covered it (heard by the bench's listener: the
 * watermarker noticing, stepping and committing, and the notification's
 * trip), and from that publication to its handler (the consumer waking,
 * reading the page, calling the handler).
 */
function breakdown(title: string, commits: [number, number][], seqs: Map<number, bigint>, received: Map<number, number>, heard: [bigint, number][]): string {
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
      unheard += 1; // delivered before its notification was heard (or one skipped): no split
      continue;
    }
    toPublication.recordMs(Math.max(0, published - at));
    toHandler.recordMs(handled - published);
  }
  const a = toPublication.summary();
  const b = toHandler.summary();
  const ms = (x: number) => x.toFixed(2);
  return (
    `${title}: commit→publication p50 ${ms(a.p50)} / p99 ${ms(a.p99)} ms, publication→handler p50 ${ms(b.p50)} / p99 ${ms(b.p99)} ms ` +
    `(${heard.length} publications, ${(commits.length / Math.max(1, heard.length)).toFixed(1)} events each; ${unheard} events not split)`
  );
}
