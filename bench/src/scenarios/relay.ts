import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { connect, headers as natsHeaders } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import type pg from 'pg';
import { NatsSink, Relay, Watermarker, type RelayMessage, type Sink, type SinkTarget } from 'tidemark';
import { benchPool } from '../db.js';
import { installedDatabase, settle, type BenchContext } from '../context.js';
import { epochMs } from '../load.js';
import { spawnWorker } from '../worker.js';
import { once } from 'node:events';
import { Histogram } from '../histogram.js';
import { fmt, ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';
import { startBenchNats, type BenchNats } from '../nats.js';

const BATCH = 500;
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
    await preload(pool, 'bench', backlog);
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
        side === 'plain' ? await plainPublish(nats.url, run, messages) : side === 'sink' ? await sinkPublish(nats.url, run, messages) : await relayBacklog(pool, nats.url, run, messages.at(-1)!.event.seq);
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
    await preload(pool, 'big', big);
    await new Watermarker(pool, { owner: 'bench' }).step();
    ctx.progress.step(`relay: memory, draining ${big.toLocaleString('en-US')} events`);
    const memory = await relayProcessPeak(pool, url, nats.url, 'big');
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
      `A private nats-server (-js, file storage). Backlog: events preloaded, then relayed by a \`Relay\` with a \`NatsSink\` (batch ${BATCH}, a fresh cursor and JetStream stream per run) until its cursor reaches the last event; ` +
      `the plain publisher sends the same messages (subjects, headers, bodies, Nats-Msg-Id) read beforehand, ${BATCH} at a time, each batch's acks awaited before the next. ` +
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

async function preload(pool: pg.Pool, stream: string, n: number): Promise<void> {
  for (let done = 0; done < n; done += 100_000) {
    await pool.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload, headers)
       SELECT $1, 'order.placed', 'k' || (g % 64), jsonb_build_object('id', g, 'total', g % 1000, 'note', 'a typical small event body'), '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
         FROM generate_series($2::bigint, $3::bigint) g`,
      [stream, done + 1, Math.min(n, done + 100_000)],
    );
  }
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
    for (let i = 0; i < messages.length; i += BATCH) {
      const acks = messages.slice(i, i + BATCH).map((m) => {
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
    for (let i = 0; i < messages.length; i += BATCH) await sink.publish(messages.slice(i, i + BATCH), signal);
    return performance.now() - start;
  } finally {
    await sink.close();
  }
}

/** Relays the backlog with a fresh cursor and JetStream stream; the time until its cursor reached `last`. */
async function relayBacklog(pool: pg.Pool, url: string, run: number, last: bigint): Promise<number> {
  const sink = new NatsSink({ url, stream: `RELAY_${run}`, subject: `relay${run}.{stream}.{kind}`, createStream: true });
  let reached!: () => void;
  const done = new Promise<void>((resolve) => (reached = resolve));
  const relay = new Relay(pool, sink, {
    consumer: `bench-${run}`,
    streams: ['bench'],
    batchSize: BATCH,
    listen: false,
    observer: (e) => {
      if (e.type === 'published' && e.cursor >= last) reached();
    },
  });
  const stop = new AbortController();
  const start = performance.now();
  const running = relay.run(stop.signal);
  await Promise.race([done, running]);
  const ms = performance.now() - start;
  stop.abort();
  await running;
  await relay.close();
  return ms;
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

/** Runs `tidemark relay` as a child process until its cursor reaches the stream's last event; its peak RSS. */
async function relayProcessPeak(pool: pg.Pool, dbUrl: string, natsUrl: string, stream: string): Promise<{ peakMb: number; seconds: number; command: string } | undefined> {
  const bin = fileURLToPath(new URL('../../../bin/tidemark.js', import.meta.url));
  const built = fileURLToPath(new URL('../../../dist/cli/main.js', import.meta.url));
  if (!existsSync('/proc/self/status') || !existsSync(built)) return undefined;
  const last = BigInt((await pool.query<{ max: string }>('SELECT max(seq)::text AS max FROM tidemark.events WHERE stream = $1', [stream])).rows[0]!.max);
  const args = ['relay', '--database-url', dbUrl, '--to', natsUrl, '--consumer', 'memory', '--stream', stream, '--nats-stream', 'MEMORY', '--subject', 'memory.{stream}.{kind}', '--create-stream'];
  // Run as a user runs it: through its shebang (env execs node in place, so the pid is node's).
  const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const start = performance.now();
  let peakKb = 0;
  try {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`tidemark relay exited with ${child.exitCode}: ${stderr.trim()}`);
      const status = await readFile(`/proc/${child.pid}/status`, 'utf8').catch(() => '');
      peakKb = Math.max(peakKb, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
      const r = await pool.query<{ seq: string }>(`SELECT seq FROM tidemark.cursors WHERE consumer = 'memory' AND stream = $1`, [stream]);
      if (r.rows[0] && BigInt(r.rows[0].seq) >= last) break;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    const seconds = (performance.now() - start) / 1000;
    const status = await readFile(`/proc/${child.pid}/status`, 'utf8');
    peakKb = Math.max(peakKb, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
    return { peakMb: peakKb / 1024, seconds, command: `tidemark ${args.map((a) => (a === dbUrl ? '<db>' : a)).join(' ')}` };
  } finally {
    child.kill('SIGTERM');
    await exited;
  }
}
