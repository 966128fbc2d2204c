import { spawn, type ChildProcess } from 'node:child_process';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import type pg from 'pg';
import { HttpSink, Watermarker } from 'tidemark';
import { Pool as UndiciPool } from 'undici';
import { benchPool } from '../db.js';
import { preloadBacklog, RELAY_BATCH, relayBacklog, relayProcessPeak } from '../relay-runs.js';
import type { BenchContext } from '../context.js';
import { fmt, median, ratioText, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';

const CONCURRENCY = 16;
/**
 * The timed runs: four adjacent groups of the three sides, the order
 * alternating. Each ratio is the median over the groups of the relay's
 * rate over a plain loop's in that group: this machine's HTTP rate drifts
 * by half within one scenario, and one group's runs share its speed.
 * `plain` is the keep-alive POST loop of node:http (the goal's baseline);
 * `undici` is the same loop on the client the sink sends with.
 */
const RUNS = ['plain', 'relay', 'undici', 'undici', 'relay', 'plain', 'plain', 'relay', 'undici', 'undici', 'relay', 'plain'] as const;
const GROUP = 3;
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

/**
 * The relay to an HTTP webhook, against a local node:http receiver in a
 * child process of its own (answering 204 to every POST, counting them), so
 * it does not share the event loop or core of the side measured:
 * (a) a backlog relayed by `Relay` + `HttpSink` (signed, 16 keys in flight,
 *     one event per request), against plain keep-alive POST loops (node:http
 *     and undici) sending the same bodies with the same concurrency and no
 *     database; after a warm-up, four adjacent groups of runs, each ratio
 *     the median over the groups;
 * (b) memory: peak RSS of a `tidemark relay --to http://...` process
 *     draining a backlog.
 */
export async function webhookRelayScenario(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const rows: (string | number | null)[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  const receiver = await startReceiver();
  const url = await ctx.server.freshDatabase('webhook');
  const pool = benchPool(url, 8);
  try {
    await tidemarkContender().install(pool);
    const backlog = ctx.pick(5_000, 100_000);
    ctx.progress.step(`webhook-relay: preloading ${backlog.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'bench', backlog);
    await pool.query('VACUUM ANALYZE tidemark.events');
    await new Watermarker(pool, { owner: 'bench' }).step();
    const bodies = await loadRequests(pool, 'bench');
    const last = BigInt((await pool.query<{ max: string }>("SELECT max(seq)::text AS max FROM tidemark.events WHERE stream = 'bench'")).rows[0]!.max);

    // Untimed warm-up: a tenth of the backlog each way, so no side is measured while the JIT compiles the HTTP client's code.
    ctx.progress.step('webhook-relay: warm-up');
    const warm = bodies.slice(0, Math.ceil(bodies.length / 10));
    await plainPost(receiver.url, warm);
    await undiciPost(receiver.url, warm);
    await relayBacklog(pool, new HttpSink({ url: receiver.url, secret: SECRET, concurrency: CONCURRENCY }), 'bench-warm', BigInt(warm.at(-1)!.seq));
    const rate = { plain: { events: 0, ms: 0 }, undici: { events: 0, ms: 0 }, relay: { events: 0, ms: 0 } };
    const perRun: string[] = [];
    const runs: number[] = [];
    let run = 0;
    for (const side of RUNS) {
      run += 1;
      ctx.progress.step(`webhook-relay: backlog of ${backlog.toLocaleString('en-US')}, ${side} (run ${run} of ${RUNS.length})`);
      const ms =
        side === 'plain' ? await plainPost(receiver.url, bodies)
        : side === 'undici' ? await undiciPost(receiver.url, bodies)
        : await relayBacklog(pool, new HttpSink({ url: receiver.url, secret: SECRET, concurrency: CONCURRENCY }), `bench-${run}`, last);
      rate[side].events += bodies.length;
      rate[side].ms += ms;
      runs.push(ms);
      perRun.push(`${side} ${Math.round((bodies.length / ms) * 1000).toLocaleString('en-US')}`);
    }
    const perSec = (x: { events: number; ms: number }) => (x.events / x.ms) * 1000;
    // Each group's relay rate over a plain loop's rate: the loop's ms / the relay's ms.
    const groups = Array.from({ length: RUNS.length / GROUP }, (_, g) => RUNS.slice(g * GROUP, g * GROUP + GROUP).map((side, i) => ({ side, ms: runs[g * GROUP + i]! })));
    const ratios = (base: 'plain' | 'undici') => groups.map((group) => group.find((r) => r.side === base)!.ms / group.find((r) => r.side === 'relay')!.ms);
    const overPlain = ratios('plain');
    const overUndici = ratios('undici');
    const ratio = median(overPlain);
    notes.push(
      `Events/s of each run, in order: ${perRun.join(', ')}. Relay / node:http loop in each group: ${overPlain.map((r) => fmt(r)).join(', ')}; ` +
        `over all runs together: ${fmt(perSec(rate.relay) / perSec(rate.plain))}. Relay / undici loop in each group: ${overUndici.map((r) => fmt(r)).join(', ')}; ` +
        `over all runs together: ${fmt(perSec(rate.relay) / perSec(rate.undici))}.`,
    );
    rows.push([`backlog ${backlog.toLocaleString('en-US')}: events/s, node:http loop (ratio: median of ${groups.length} groups)`, Math.round(perSec(rate.relay)), Math.round(perSec(rate.plain)), fmt(ratio)]);
    rows.push([`backlog ${backlog.toLocaleString('en-US')}: events/s, the same loop on undici (ratio: median of ${groups.length} groups)`, Math.round(perSec(rate.relay)), Math.round(perSec(rate.undici)), fmt(median(overUndici))]);
    goals.push({ goal: 'relay backlog to a webhook: relay / plain keep-alive POST loop (node:http)', target: '>= 0.8', measured: ratioText(ratio, 0.8), met: ratio >= 0.8 });
    notes.push(
      `Both sides POST one event per request over ${CONCURRENCY} keep-alive connections, with the same body and headers (webhook-id, -timestamp, -signature, tidemark-*, traceparent). ` +
        `The relay reads the events, builds and signs each request as it sends it, keeps each key's events in order (64 keys in the backlog), and commits pages of ${RELAY_BATCH}; ` +
        'the plain loops build and sign each request as they send it too, from events read beforehand, in any order. ' +
        "The goal's baseline is the loop a hand-written sender writes with node:http. The sink sends with undici's dispatch API, which costs about half the CPU time a request of node:http does; " +
        "the undici row is the same loop on that client, so the relay's own cost (reading and committing pages) shows there.",
    );

    const big = ctx.pick(20_000, 1_000_000);
    ctx.progress.step(`webhook-relay: memory, preloading ${big.toLocaleString('en-US')} events`);
    await preloadBacklog(pool, 'big', big);
    await new Watermarker(pool, { owner: 'bench' }).step();
    ctx.progress.step(`webhook-relay: memory, draining ${big.toLocaleString('en-US')} events`);
    const memory = await relayProcessPeak(pool, url, 'big', ['--to', receiver.url], { TIDEMARK_WEBHOOK_SECRET: SECRET }, 'TIDEMARK_WEBHOOK_SECRET=... ');
    if (memory) {
      rows.push([`relay process, ${big.toLocaleString('en-US')}-event backlog: peak RSS (MB)`, fmt(memory.peakMb, 1), null, null]);
      rows.push([`relay process, ${big.toLocaleString('en-US')}-event backlog: events/s`, Math.round(big / memory.seconds), null, null]);
      goals.push({ goal: `webhook relay RSS while draining ${big.toLocaleString('en-US')} events`, target: '< 150 MB', measured: `${fmt(memory.peakMb, 1)} MB in ${fmt(memory.seconds, 1)} s`, met: memory.peakMb < 150 });
      notes.push(`The memory run is \`${memory.command}\` as a child process; its peak is VmHWM from /proc. The receiver runs in another child process.`);
    } else {
      notes.push('The memory run needs /proc and a built CLI (npm run build); it was skipped.');
    }
  } finally {
    await pool.end();
    await receiver.stop();
  }
  notes.push(`The receiver answered ${receiver.count().toLocaleString('en-US')} requests in all.`);
  return {
    id: 'webhook-relay',
    title: 'Relay to an HTTP webhook',
    method:
      'A node:http receiver in a child process answers 204 to every POST. Backlog: events preloaded (64 keys), then relayed by a `Relay` with an `HttpSink` ' +
      `(page ${RELAY_BATCH}, concurrency ${CONCURRENCY}, signed, a fresh cursor per run) until its cursor reaches the last event; the plain loops POST the same requests (bodies and headers, built and signed as they send them, from events read beforehand) ` +
      `from ${CONCURRENCY} workers over ${CONCURRENCY} keep-alive connections: node:http's agent (the goal's baseline), and undici's pool (the sink's client). After an untimed warm-up of a tenth of the backlog each way, four adjacent groups of the three (the order alternating); each ratio is the median of the groups' ratios. Memory: \`tidemark relay --to http://...\` in a child process drains a fresh backlog.`,
    columns: ['measure', 'relay', 'plain POST loop', 'ratio'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}

/** The receiver, in a child process: answers 204, counts requests, prints its port first and its count on demand (SIGUSR2). */
const RECEIVER = `
const http = require('node:http');
let n = 0;
const server = http.createServer((req, res) => { req.resume(); req.on('end', () => { n += 1; res.writeHead(204).end(); }); });
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
process.on('SIGUSR2', () => console.log('count ' + n));
process.on('SIGTERM', () => { server.close(); server.closeAllConnections(); });
`;

async function startReceiver(): Promise<{ url: string; count: () => number; stop: () => Promise<void> }> {
  const child: ChildProcess = spawn(process.execPath, ['-e', RECEIVER], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  let count = 0;
  const port = await new Promise<number>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the receiver exited with ${code}`)));
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const first = /^(\d+)\n/.exec(out);
      if (first) resolve(Number(first[1]));
      for (const m of out.matchAll(/count (\d+)\n/g)) count = Number(m[1]);
    });
  });
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    count: () => count,
    stop: async () => {
      const counted = new Promise<void>((resolve) => child.stdout!.on('data', () => /count \d+\n/.test(out) && resolve()));
      child.kill('SIGUSR2');
      await Promise.race([counted, new Promise((resolve) => setTimeout(resolve, 2000))]);
      child.kill('SIGTERM');
      if (child.exitCode === null) await new Promise((resolve) => child.once('exit', resolve));
    },
  };
}

/** An event as the plain loop reads it beforehand. */
interface PlainRequest {
  seq: string;
  kind: string;
  key: string;
  payload: string;
  headers: string;
  occurredAt: Date;
}

async function loadRequests(pool: pg.Pool, stream: string): Promise<PlainRequest[]> {
  const r = await pool.query<{ seq: string; kind: string; key: string; payload: string; headers: string; occurred_at: Date }>(
    'SELECT seq, kind, key, payload::text AS payload, headers::text AS headers, occurred_at FROM tidemark.events WHERE stream = $1 ORDER BY seq',
    [stream],
  );
  return r.rows.map((row) => ({ seq: row.seq, kind: row.kind, key: row.key, payload: row.payload, headers: row.headers, occurredAt: row.occurred_at }));
}

const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');

/** The request the sink sends for `e`, built and signed as a hand-written sender would, when it is sent. */
function plainRequest(e: PlainRequest, stream: string): { body: Buffer; headers: Record<string, string> } {
  const body = Buffer.from(e.payload);
  const id = `bench:${e.seq}`;
  const timestamp = String(Math.floor(Date.now() / 1000));
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'content-length': String(body.length),
    'webhook-id': id,
    'webhook-timestamp': timestamp,
    'webhook-signature': `v1,${createHmac('sha256', KEY).update(`${id}.${timestamp}.`).update(body).digest('base64')}`,
    'tidemark-seq': e.seq,
    'tidemark-stream': stream,
    'tidemark-kind': e.kind,
    'tidemark-key': e.key,
    'tidemark-occurred-at': e.occurredAt.toISOString(),
    'tidemark-headers': e.headers,
  };
  for (const [name, value] of Object.entries(JSON.parse(e.headers) as Record<string, unknown>)) if (typeof value === 'string') headers[name] = value;
  return { body, headers };
}

/** The time CONCURRENCY workers take to `post` every request, each taking the next one free (no order kept). */
async function workers(bodies: PlainRequest[], post: (event: PlainRequest) => Promise<void>): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < bodies.length) await post(bodies[next++]!);
    }),
  );
  return performance.now() - start;
}

/** The plain side on undici, the sink's client: the same requests by CONCURRENCY workers over a pool of CONCURRENCY connections, no order kept. */
async function undiciPost(url: string, bodies: PlainRequest[]): Promise<number> {
  const target = new URL(url);
  const pool = new UndiciPool(target.origin, { connections: CONCURRENCY, pipelining: 1 });
  const post = (event: PlainRequest) =>
    new Promise<void>((resolve, reject) => {
      const { body, headers } = plainRequest(event, 'bench');
      delete headers['content-length'];
      let status = 0;
      pool.dispatch(
        { method: 'POST', path: target.pathname, headers, body },
        {
          onRequestStart() {},
          onResponseStart(_c, statusCode) {
            status = statusCode;
          },
          onResponseData() {},
          onResponseEnd: () => (status < 300 ? resolve() : reject(new Error(`answered ${status}`))),
          onResponseError: (_c, err) => reject(err),
        },
      );
    });
  const ms = await workers(bodies, post);
  await pool.close();
  return ms;
}

/** The plain side: the same requests POSTed by CONCURRENCY workers over a keep-alive agent, no order kept. */
async function plainPost(url: string, bodies: PlainRequest[]): Promise<number> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY, maxFreeSockets: CONCURRENCY });
  const target = new URL(url);
  const post = (event: PlainRequest) =>
    new Promise<void>((resolve, reject) => {
      const { body, headers } = plainRequest(event, 'bench');
      const req = http.request(target, { method: 'POST', agent, headers }, (res) => {
        res.resume();
        res.once('end', () => (res.statusCode! < 300 ? resolve() : reject(new Error(`answered ${res.statusCode}`))));
      });
      req.once('error', reject);
      req.end(body);
    });
  const ms = await workers(bodies, post);
  agent.destroy();
  return ms;
}

