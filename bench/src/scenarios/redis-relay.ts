import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type pg from 'pg';
import { RedisSink, Watermarker, type RelayMessage } from 'tidemark';
import { freePort } from 'tidemark/embedded';
import { benchPool } from '../db.js';
import { preloadBacklog, RELAY_BATCH, relayBacklog, relayProcessPeak } from '../relay-runs.js';
import type { BenchContext } from '../context.js';
import { fmt, ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';

const ID = 'redis-relay';
const TITLE = 'Relay to Redis Streams';

/**
 * The relay to Redis Streams, against a private redis-server:
 * (a) a backlog relayed by `Relay` + `RedisSink`, against a plain ioredis
 *     loop sending the same entries (same keys, ids, fields) as pipelines
 *     of 500 XADDs, no database involved; runs alternate plain, relay,
 *     relay, plain;
 * (b) memory: peak RSS of a `tidemark relay --to redis://...` process
 *     draining a backlog.
 */
export async function redisRelayScenario(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const rows: (string | number | null)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  let redis: BenchRedis;
  try {
    redis = await startBenchRedis();
  } catch (err) {
    const why = `no redis-server: ${(err as Error).message}`;
    return { id: ID, title: TITLE, method: why, columns: [], rows: [], notes: [why], goals: [], elapsedMs: performance.now() - t0 };
  }
  const url = await ctx.server.freshDatabase('redis_relay');
  const pool = benchPool(url, 8);
  try {
    await tidemarkContender().install(pool);
    const backlog = ctx.pick(5_000, 100_000);
    ctx.progress.step(`${ID}: preloading ${backlog.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'bench', backlog);
    await pool.query('VACUUM ANALYZE tidemark.events');
    await new Watermarker(pool, { owner: 'bench' }).step();

    // (a) Backlog throughput, side by side.
    const entries = await loadEntries(pool, 'bench');
    // Untimed warm-up: a tenth of the backlog each way, so no side is measured while the JIT compiles ioredis's code.
    ctx.progress.step(`${ID}: warm-up`);
    const warm = Math.ceil(entries.count / 10);
    await plainXadd(redis.url, 0, { ...entries, count: warm });
    await sinkPublish(redis.url, 0, entries.messages.slice(0, warm));
    await relayBacklog(pool, new RedisSink({ url: redis.url, stream: 'warm:{stream}' }), 'bench-redis-warm', entries.messages[warm - 1]!.event.seq);
    const rate = { plain: { events: 0, ms: 0 }, relay: { events: 0, ms: 0 }, sink: { events: 0, ms: 0 } };
    const perRun: string[] = [];
    let run = 0;
    for (const side of ['plain', 'relay', 'sink', 'sink', 'relay', 'plain'] as const) {
      run += 1;
      ctx.progress.step(`${ID}: backlog of ${backlog.toLocaleString('en-US')}, ${side} (run ${run} of 6)`);
      const ms =
        side === 'plain' ? await plainXadd(redis.url, run, entries)
        : side === 'sink' ? await sinkPublish(redis.url, run, entries.messages)
        : await relayBacklog(pool, new RedisSink({ url: redis.url, stream: `relay${run}:{stream}` }), `bench-redis-${run}`, entries.last);
      rate[side].events += entries.count;
      rate[side].ms += ms;
      perRun.push(`${side} ${Math.round((entries.count / ms) * 1000).toLocaleString('en-US')}`);
    }
    notes.push(`Events/s of each run, in order: ${perRun.join(', ')}.`);
    const perSec = (x: { events: number; ms: number }) => (x.events / x.ms) * 1000;
    const ratio = perSec(rate.relay) / perSec(rate.plain);
    rows.push([`backlog ${backlog.toLocaleString('en-US')}: events/s`, Math.round(perSec(rate.relay)), Math.round(perSec(rate.plain)), fmt(ratio)]);
    rows.push(['the same through RedisSink alone, no database: events/s (relay / this)', Math.round(perSec(rate.sink)), null, fmt(perSec(rate.relay) / perSec(rate.sink))]);
    notes.push(
      'The second row isolates the database side: the same events through RedisSink.publish with no database. The relay reads, parses and publishes in one thread, so its rate is about 1 / (1 / database rate + 1 / sink rate).',
    );
    goals.push({ goal: 'relay backlog to Redis Streams: relay / plain pipelined XADD', target: '>= 0.8', measured: ratioText(ratio, 0.8), met: ratio >= 0.8 });

    // (b) Peak RSS of the relay process over a large backlog.
    const big = ctx.pick(20_000, 1_000_000);
    ctx.progress.step(`${ID}: memory, preloading ${big.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'big', big);
    await new Watermarker(pool, { owner: 'bench' }).step();
    ctx.progress.step(`${ID}: memory, draining ${big.toLocaleString('en-US')} events`);
    const memory = await relayProcessPeak(pool, url, 'big', ['--to', redis.url, '--redis-stream', 'memory:{stream}', '--max-len', '100000']);
    if (memory) {
      rows.push([`relay process, ${big.toLocaleString('en-US')}-event backlog: peak RSS (MB)`, fmt(memory.peakMb, 1), null, null]);
      goals.push({ goal: `redis relay RSS while draining ${big.toLocaleString('en-US')} events`, target: '< 150 MB', measured: `${fmt(memory.peakMb, 1)} MB in ${fmt(memory.seconds, 1)} s`, met: memory.peakMb < 150 });
      notes.push(`The memory run is \`${memory.command}\` as a child process; its peak is VmHWM from /proc.`);
    } else {
      notes.push('The memory run needs /proc and a built CLI (npm run build); it was skipped.');
    }
  } finally {
    await pool.end();
    await redis.close();
  }
  return {
    id: ID,
    title: TITLE,
    method:
      `A private redis-server (no persistence: the bench measures the relay, not the disk). Backlog: events preloaded, then relayed by a \`Relay\` with a \`RedisSink\` (batch ${RELAY_BATCH}, a page as pipelined page-script calls of up to 128 entries, a fresh cursor and key per run) until its cursor reaches the last event; ` +
      `the plain side sends the same entries (key, id <seq>-0, the same fields, read beforehand) with ioredis, ${RELAY_BATCH} XADDs per pipeline, each pipeline awaited before the next. ` +
      'After an untimed warm-up of a tenth of the backlog each way, runs alternate plain, relay, sink alone, sink alone, relay, plain. ' +
      'Memory: `tidemark relay` in a child process drains a fresh backlog.',
    columns: ['measure', 'relay', 'plain XADD', 'ratio'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}

interface BenchRedis {
  url: string;
  close(): Promise<void>;
}

/** A redis-server of the bench's own on a free port (`redis-server` on PATH or /usr/bin). */
async function startBenchRedis(): Promise<BenchRedis> {
  const bin = ['/usr/bin/redis-server', '/usr/local/bin/redis-server'].find((p) => existsSync(p));
  if (!bin) throw new Error('redis-server not found in /usr/bin or /usr/local/bin');
  const dir = await mkdtemp(join(tmpdir(), 'tidemark-bench-redis-'));
  const port = await freePort();
  const child: ChildProcess = spawn(bin, ['--bind', '127.0.0.1', '--port', String(port), '--dir', dir, '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const deadline = Date.now() + 20_000;
  while (!(await pongs(port))) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`redis-server on port ${port} did not start`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    async close() {
      child.kill('SIGKILL');
      await exited;
      await rm(dir, { recursive: true, force: true });
    },
  };
}

function pongs(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: '127.0.0.1', port }, () => socket.write('PING\r\n'));
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.on('data', (d: Buffer) => done(d.toString('latin1').startsWith('+PONG')));
    socket.on('error', () => done(false));
  });
}

/** The backlog's entries as RedisSink writes them: id and field list per event. */
interface Entries {
  count: number;
  last: bigint;
  ids: string[];
  fields: string[][];
  /** The same events as the relay hands them to the sink. */
  messages: RelayMessage[];
}

async function loadEntries(pool: pg.Pool, stream: string): Promise<Entries> {
  const r = await pool.query<{ seq: string; kind: string; key: string; payload: string; headers: string; occurred_at: Date }>(
    'SELECT seq, kind, key, payload::text AS payload, headers::text AS headers, occurred_at FROM tidemark.events WHERE stream = $1 ORDER BY seq',
    [stream],
  );
  const ids: string[] = [];
  const fields: string[][] = [];
  const messages: RelayMessage[] = [];
  for (const row of r.rows) {
    ids.push(`${row.seq}-0`);
    messages.push({
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
    });
    const traceparent = (JSON.parse(row.headers) as { traceparent?: string }).traceparent;
    fields.push([
      'id', `tidemark:${row.seq}`, 'seq', row.seq, 'stream', stream, 'kind', row.kind, 'key', row.key,
      'occurred_at', row.occurred_at.toISOString(), 'payload', row.payload, 'headers', row.headers,
      ...(traceparent ? ['traceparent', traceparent] : []),
    ]);
  }
  return { count: r.rows.length, last: BigInt(r.rows.at(-1)!.seq), ids, fields, messages };
}

/** The plain side: the same entries, XADD with explicit ids, 500 per ioredis pipeline. */
async function plainXadd(url: string, run: number, entries: Entries): Promise<number> {
  const client = new Redis(url, { lazyConnect: true, protocol: 2 });
  await client.connect();
  try {
    const key = `plain:${run}`;
    const start = performance.now();
    for (let i = 0; i < entries.count; i += RELAY_BATCH) {
      const pipeline = client.pipeline();
      for (let j = i; j < Math.min(entries.count, i + RELAY_BATCH); j += 1) pipeline.xadd(key, entries.ids[j]!, ...(entries.fields[j] as [string, string]));
      const replies = await pipeline.exec();
      const failed = replies?.find(([err]) => err);
      if (failed) throw failed[0];
    }
    const ms = performance.now() - start;
    await client.del(key);
    return ms;
  } finally {
    client.disconnect();
  }
}

/** The sink alone: the same events through RedisSink.publish, a batch at a time, no database. */
async function sinkPublish(url: string, run: number, messages: RelayMessage[]): Promise<number> {
  const sink = new RedisSink({ url, stream: `sink${run}:{stream}` });
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

