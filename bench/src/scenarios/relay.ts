import { connect, headers as natsHeaders } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import type pg from 'pg';
import { NatsSink, Relay, Watermarker, type RelayMessage, type Sink, type SinkTarget } from 'tidemark';
import { benchPool } from '../db.js';
import { preloadBacklog, RELAY_BATCH, relayBacklog, relayProcessPeak } from '../relay-runs.js';
import { installedDatabase, settle, type BenchContext } from '../context.js';
import { epochMs } from '../load.js';
import { spawnWorker } from '../worker.js';
import { once } from 'node:events';
import { Histogram } from '../histogram.js';
import { fmt, ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';
import { startBenchNats, type BenchNats } from '../nats.js';

/** Live latency: commits in the first second of load are not measured. */
const WARM_UP_MS = 1000;

/**
 * The relay to NATS JetStream, against a private nats-server:
 * (a) a backlog relayed, against a plain JetStream publisher sending the
 *     same messages (same subjects, headers, bodies and ids) with the same
 *     pipelining (a batch of 500 sent, then all its acks awaited), no
 *     database involved; runs alternate plain, relay, relay, plain;
 * (b) live: commit -> JetStream ack latency at 1,000 events/s with the
 *     watermarker loop at its defaults;
 * (c) memory: peak RSS of a `tidemark relay` process draining a backlog.
 */
export async function relayScenario(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const rows: (string | number | null)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  let nats: BenchNats;
  try {
    nats = await startBenchNats();
  } catch (err) {
    return skipped(t0, `no NATS server: ${(err as Error).message}`);
  }
  const url = await ctx.server.freshDatabase('relay');
  const pool = benchPool(url, 8);
  try {
    await tidemarkContender().install(pool);
    const backlog = ctx.pick(5_000, 100_000);
    ctx.progress.step(`relay: preloading ${backlog.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'bench', backlog);
    await pool.query('VACUUM ANALYZE tidemark.events');
    await new Watermarker(pool, { owner: 'bench' }).step();

    // (a) Backlog throughput, side by side.
    const messages = await loadMessages(pool, 'bench');
    const rate = { plain: { events: 0, ms: 0 }, relay: { events: 0, ms: 0 }, sink: { events: 0, ms: 0 } };
    let run = 0;
    for (const side of ['plain', 'relay', 'sink', 'sink', 'relay', 'plain'] as const) {
      run += 1;
      ctx.progress.step(`relay: backlog of ${backlog.toLocaleString('en-US')}, ${side} (run ${run} of 6)`);
      const ms =
        side === 'plain' ? await plainPublish(nats.url, run, messages) : side === 'sink' ? await sinkPublish(nats.url, run, messages) : await relayBacklog(pool, new NatsSink({ url: nats.url, stream: `RELAY_${run}`, subject: `relay${run}.{stream}.{kind}`, createStream: true }), `bench-${run}`, messages.at(-1)!.event.seq);
      rate[side].events += messages.length;
      rate[side].ms += ms;
    }
    const perSec = (x: { events: number; ms: number }) => (x.events / x.ms) * 1000;
    const ratio = perSec(rate.relay) / perSec(rate.plain);
    rows.push([`backlog ${backlog.toLocaleString('en-US')}: events/s`, Math.round(perSec(rate.relay)), Math.round(perSec(rate.plain)), fmt(ratio)]);
    rows.push([`the same through NatsSink alone, no database: events/s (relay / this)`, Math.round(perSec(rate.sink)), null, fmt(perSec(rate.relay) / perSec(rate.sink))]);
    notes.push(
      'The plain publisher uses `js.publish`, one request per message, as the JetStream client documents; NatsSink collects the acks on one inbox subscription, which is faster. The second row isolates what the database side costs: the same messages through NatsSink with no database.',
    );
    goals.push({ goal: 'relay backlog to JetStream: relay / plain JetStream publisher', target: '>= 0.8', measured: ratioText(ratio, 0.8), met: ratio >= 0.8 });

    // (b) Live latency at 1,000 events/s.
    ctx.progress.step('relay: live, 1,000 events/s');
    const live = await liveLatency(ctx, nats.url, ctx.pick(3_000, 10_000));
    rows.push(['live 1,000 events/s: commit -> ack p50 / p99 / max (ms)', `${fmt(live.p50)} / ${fmt(live.p99)} / ${fmt(live.max)}`, null, null]);
    goals.push({
      goal: 'relay live: commit -> JetStream ack p99 at 1,000 events/s',
      target: '<= 50 ms',
      measured: `${fmt(live.p99)} ms (${live.count} events${live.missing ? `, ${live.missing} not acknowledged` : ''})`,
      met: live.p99 <= 50 && live.missing === 0,
    });

    // (c) Peak RSS of the relay process over a large backlog.
    const big = ctx.pick(20_000, 1_000_000);
    ctx.progress.step(`relay: memory, preloading ${big.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'big', big);
    await new Watermarker(pool, { owner: 'bench' }).step();
    ctx.progress.step(`relay: memory, draining ${big.toLocaleString('en-US')} events`);
    const memory = await relayProcessPeak(pool, url, 'big', ['--to', nats.url, '--nats-stream', 'MEMORY', '--subject', 'memory.{stream}.{kind}', '--create-stream']);
    if (memory) {
      rows.push([`relay process, ${big.toLocaleString('en-US')}-event backlog: peak RSS (MB)`, fmt(memory.peakMb, 1), null, null]);
      goals.push({ goal: `relay RSS while draining ${big.toLocaleString('en-US')} events`, target: '< 150 MB', measured: `${fmt(memory.peakMb, 1)} MB in ${fmt(memory.seconds, 1)} s`, met: memory.peakMb < 150 });
      notes.push(`The memory run is \`${memory.command}\` as a child process; its peak is VmHWM from /proc.`);
    } else {
      notes.push('The memory run needs /proc and a built CLI (npm run build); it was skipped.');
    }
  } finally {
    await pool.end();
    await nats.close();
  }
  return {
    id: 'relay',
    title: '7. Relay to NATS JetStream',
    method:
      `A private nats-server (-js, file storage). Backlog: events preloaded, then relayed by a \`Relay\` with a \`NatsSink\` (batch ${RELAY_BATCH}, a fresh cursor and JetStream stream per run) until its cursor reaches the last event; ` +
      `the plain publisher sends the same messages (subjects, headers, bodies, Nats-Msg-Id) read beforehand, ${RELAY_BATCH} at a time, each batch's acks awaited before the next. ` +
      'Runs alternate plain, relay, sink alone, sink alone, relay, plain. Live: 8 writers in a separate process commit one event per transaction at 1,000 events/s in total into a fresh database while `Watermarker.run` (defaults) publishes safe_seq; ' +
      "latency is from each writer's COMMIT returning to the relay's publish of that event resolving (all of its page's acks in), both on the machine's wall clock; the first second of load is a warm-up, not measured. Memory: `tidemark relay` in a child process drains a fresh backlog.",
    columns: ['measure', 'relay', 'plain publisher', 'ratio'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}

function skipped(t0: number, why: string): ScenarioResult {
  return { id: 'relay', title: '7. Relay to NATS JetStream', method: why, columns: [], rows: [], notes: [why], goals: [], elapsedMs: performance.now() - t0 };
}

async function loadMessages(pool: pg.Pool, stream: string): Promise<RelayMessage[]> {
  const r = await pool.query<{ seq: string; kind: string; key: string; payload: string; headers: string; occurred_at: Date }>(
    'SELECT seq, kind, key, payload::text AS payload, headers::text AS headers, occurred_at FROM tidemark.events WHERE stream = $1 ORDER BY seq',
    [stream],
  );
  return r.rows.map((row) => ({
    id: `tidemark:${row.seq}`,
    schema: 'tidemark',
    // The bench's own payloads and headers: small objects that parse exactly.
    event: {
      seq: BigInt(row.seq),
      stream,
      kind: row.kind,
      key: row.key,
      payload: JSON.parse(row.payload) as RelayMessage['event']['payload'],
      payloadText: row.payload,
      headers: JSON.parse(row.headers) as RelayMessage['event']['headers'],
      headersText: row.headers,
      occurredAt: row.occurred_at,
    },
  }));
}

/** The plain publisher: the same messages, js.publish with the same headers, a batch at a time. */
async function plainPublish(url: string, run: number, messages: RelayMessage[]): Promise<number> {
  const nc = await connect({ servers: url, noAsyncTraces: true }); // as the sink connects
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: `PLAIN_${run}`, subjects: [`plain${run}.>`] });
    const js = jetstream(nc);
    const start = performance.now();
    for (let i = 0; i < messages.length; i += RELAY_BATCH) {
      const acks = messages.slice(i, i + RELAY_BATCH).map((m) => {
        const e = m.event;
        const h = natsHeaders();
        h.set('Tidemark-Seq', e.seq.toString());
        h.set('Tidemark-Stream', e.stream);
        h.set('Tidemark-Kind', e.kind);
        h.set('Tidemark-Key', e.key);
        h.set('Tidemark-Occurred-At', e.occurredAt.toISOString());
        h.set('Tidemark-Headers', e.headersText);
        // As the sink copies them: each own header whose value is a string.
        for (const [name, value] of Object.entries(e.headers)) if (typeof value === 'string') h.set(name, value);
        return js.publish(`plain${run}.${e.stream}.${e.kind}`, e.payloadText, { msgID: m.id, headers: h });
      });
      await Promise.all(acks);
    }
    return performance.now() - start;
  } finally {
    await nc.close();
  }
}

/** The sink alone: the same messages through NatsSink.publish, a batch at a time, no database. */
async function sinkPublish(url: string, run: number, messages: RelayMessage[]): Promise<number> {
  const sink = new NatsSink({ url, stream: `SINK_${run}`, subject: `sink${run}.{stream}.{kind}`, createStream: true });
  const signal = new AbortController().signal;
  await sink.open({ schema: 'tidemark', streams: ['bench'], republishWithinMs: 100_000, origin: '00000000-0000-4000-8000-000000000001' }, signal);
  try {
    const start = performance.now();
    for (let i = 0; i < messages.length; i += RELAY_BATCH) await sink.publish(messages.slice(i, i + RELAY_BATCH), signal);
    return performance.now() - start;
  } finally {
    await sink.close();
  }
}

/** Wraps a sink to note, by the bench's event id, when each event's publish resolved (wall clock, as the writers report commits). */
class TimedSink implements Sink {
  readonly name: string;
  readonly description: string;
  readonly ackedAt = new Map<number, number>();
  constructor(private readonly inner: Sink) {
    this.name = inner.name;
    this.description = inner.description;
  }
  get ackTimeoutMs() {
    return this.inner.ackTimeoutMs;
  }
  open(target: SinkTarget, signal: AbortSignal) {
    return this.inner.open(target, signal);
  }
  async publish(messages: readonly RelayMessage[], signal: AbortSignal) {
    await this.inner.publish(messages, signal);
    const now = epochMs();
    for (const m of messages) this.ackedAt.set((m.event.payload as { id: number }).id, now);
  }
  close() {
    return this.inner.close();
  }
}

interface WriteReport {
  type: 'write';
  commits: [number, number][];
  result: { committedEvents: number; elapsedMs: number; errors: number };
}

/**
 * Commit -> JetStream ack at 1,000 events/s: 8 writers in a separate
 * process (the load generator of the end-to-end scenario, one event per
 * transaction) into a fresh database, the watermarker loop at its defaults
 * and the relay here.
 */
async function liveLatency(ctx: BenchContext, url: string, windowMs: number): Promise<{ p50: number; p99: number; max: number; count: number; missing: number }> {
  const installed = await installedDatabase(ctx.server, tidemarkContender(), 'relay_live');
  await installed.pool.end(); // a pool of 2 is for installing: the relay and the watermarker need their own connections
  const dbUrl = installed.url;
  const pool = benchPool(dbUrl, 8);
  const sink = new TimedSink(new NatsSink({ url, stream: 'LIVE', subject: 'live.{stream}.{kind}', createStream: true }));
  const relay = new Relay(pool, sink, { consumer: 'live', streams: ['bench'] });
  const watermarker = new Watermarker(pool, { owner: 'bench' });
  const stop = new AbortController();
  const running = [relay.run(stop.signal), watermarker.run(stop.signal)];
  try {
    await relay.open();
    // Warm up: the lease taken, the stream created, a first page relayed; then measure.
    const warm = await pool.query<{ seq: string }>(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('bench', 'warm.up', 'w', '{"id":-1}') RETURNING seq`);
    void warm;
    for (const deadline = performance.now() + 30_000; !sink.ackedAt.has(-1) && performance.now() < deadline; ) await new Promise((r) => setTimeout(r, 20));
    const child = spawnWorker(['write', 'tidemark', dbUrl, '8', '1000', '1', String(windowMs + WARM_UP_MS), String(9e8), 'live-']);
    const [report] = (await once(child, 'message')) as [WriteReport];
    await once(child, 'exit').catch(() => undefined);
    await settle(
      async () => {
        let left = 0;
        for (const [id] of report.commits) if (!sink.ackedAt.has(id)) left += 1;
        return { done: left === 0, progress: left };
      },
      3000,
      10_000,
    );
    // The first second of load is a warm-up: the watermarker loop comes out of its idle back-off
    // (up to pollMaxMs between looks) and the writers' connections open; measured is the steady state.
    const start = Math.min(...report.commits.map(([, at]) => at));
    const h = new Histogram();
    let missing = 0;
    for (const [id, at] of report.commits) {
      if (at < start + WARM_UP_MS) continue;
      const acked = sink.ackedAt.get(id);
      if (acked === undefined) missing += 1;
      else h.recordMs(Math.max(0, acked - at));
    }
    const s = h.summary();
    return { p50: s.p50, p99: s.p99, max: s.max, count: s.count, missing };
  } finally {
    stop.abort();
    await Promise.all(running);
    await relay.close();
    await watermarker.close();
    await pool.end();
  }
}

