/**
 * The relay end to end, PostgreSQL to the shared RabbitMQ broker
 * (127.0.0.1:5672, guest/guest), through crashes, broker faults and bad
 * input. Each test declares an exchange and queue of its own (random
 * suffix) and deletes them after; it reads what reached the queue over a
 * connection of its own that never goes through the fault proxy.
 *
 * What the relay promises (docs/PROTOCOL.md §9): every committed event
 * reaches the broker at least once, each stream in seq order, and a copy
 * comes again only when a page was cut short (a crash, a failed publish):
 * then the page is published again from its first event, so a consumer
 * that keeps the first copy of each `message_id` sees every stream whole
 * and in order.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createServer, type AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { after, test, type TestContext } from 'node:test';
import { connect, type Channel, type ChannelModel, type Message } from 'amqplib';
import { createMetrics } from '../../src/observability/metrics.js';
import type { RelayEvent } from '../../src/relay/events.js';
import { Relay } from '../../src/relay/relay.js';
import type { RelayMessage, Sink, SinkTarget } from '../../src/relay/sink.js';
import { RabbitMqSink } from '../../src/relay/sinks/rabbitmq/sink.js';
import { Watermarker } from '../../src/watermark/watermarker.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, insertEvent, testDb, type TestDb } from '../support/db.js';
import { alive, stderrLine } from '../support/faults.js';
import { Recorder } from '../support/latch.js';
import { startProxy, type Proxy } from '../support/proxy.js';

const BROKER = { host: '127.0.0.1', port: 5672 };
const URL_DIRECT = `amqp://guest:guest@${BROKER.host}:${BROKER.port}/`;
const STREAMS = ['a', 'b'];
const TIMEOUT = { timeout: 120_000 };

after(closeAdmin);

let adminModel: Promise<ChannelModel> | undefined;
after(async () => {
  if (adminModel) await (await adminModel).close();
});

/** Runs `body` on a fresh channel of the test's own broker connection (a refused call closes a channel). */
async function admin<T>(body: (ch: Channel) => Promise<T>): Promise<T> {
  adminModel ??= connect(URL_DIRECT).then((model) => model.on('error', () => undefined));
  const ch = await (await adminModel).createChannel();
  ch.on('error', () => undefined);
  try {
    return await body(ch);
  } finally {
    await ch.close().catch(() => undefined);
  }
}

function unique(what: string): string {
  return `tidemark-test-relay-${what}-${randomUUID().slice(0, 8)}`;
}

/** A fresh durable topic exchange and, with `queue`, a durable queue bound to it by `#`; both deleted after the test. */
async function destination(t: TestContext, options: { queue: boolean }): Promise<{ exchange: string; queue: string }> {
  const exchange = unique('x');
  const queue = unique('q');
  await admin(async (ch) => {
    await ch.assertExchange(exchange, 'topic', { durable: true });
    if (options.queue) {
      await ch.assertQueue(queue, { durable: true });
      await ch.bindQueue(queue, exchange, '#');
    }
  });
  t.after(() =>
    admin(async (ch) => {
      if (options.queue) await ch.deleteQueue(queue);
      await ch.deleteExchange(exchange);
    }),
  );
  return { exchange, queue };
}

async function messageCount(queue: string): Promise<number> {
  return admin(async (ch) => (await ch.checkQueue(queue)).messageCount);
}

/** Every message in `queue` when called, in queue order (taken off it). */
async function readAll(queue: string): Promise<Message[]> {
  return admin(async (ch) => {
    const { messageCount } = await ch.checkQueue(queue);
    const out: Message[] = [];
    if (messageCount === 0) return out;
    await new Promise<void>((resolve, reject) => {
      ch.consume(queue, (m) => m && out.push(m) >= messageCount && resolve(), { noAck: true }).catch(reject);
    });
    return out.slice(0, messageCount);
  });
}

/** Polls `check` every 10 ms until it holds; fails after `timeoutMs`. */
async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await delay(10);
  }
}

/** A port on 127.0.0.1 where nothing listens (it was free a moment ago). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A TCP server that counts the connections it gets and closes each: proof that a command connected to nothing. */
async function countingServer(t: TestContext): Promise<{ port: number; connections: () => number }> {
  let connections = 0;
  const server = createServer((socket) => {
    connections += 1;
    socket.destroy();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as AddressInfo).port, connections: () => connections };
}

/** A seeded PRNG (mulberry32): the crash test's kill points are reproducible from the seed it reports. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let x = Math.imul(s ^ (s >>> 15), 1 | s);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4_294_967_296;
  };
}

interface SqlWriters {
  readonly written: number;
  /** Stops the loops; resolves when none is writing any more. */
  stop(): Promise<void>;
}

/**
 * `count` sessions inserting events with plain SQL into both streams, each
 * committing one event at a time and, every fifth round, three events over
 * both streams in one transaction. The pause is load shaping, not
 * synchronisation.
 */
async function startSqlWriters(db: TestDb, count = 2, pauseMs = 3): Promise<SqlWriters> {
  const sessions = await Promise.all(Array.from({ length: count }, (_, w) => db.session(`writer-${w}`)));
  let running = true;
  let written = 0;
  const loops = sessions.map(async (session, w) => {
    for (let n = 0; running; n += 1) {
      if (n % 5 === 4) {
        await session.query('BEGIN');
        for (const stream of ['a', 'b', 'a']) await insertEvent(session, stream);
        await session.query('COMMIT');
        written += 3;
      } else {
        await insertEvent(session, STREAMS[(n + w) % STREAMS.length]);
        written += 1;
      }
      await delay(pauseMs);
    }
  });
  const stopped = Promise.all(loops);
  stopped.catch(() => undefined); // awaited by stop()
  return {
    get written() {
      return written;
    },
    async stop() {
      running = false;
      await stopped;
    },
  };
}

/** The watermarker publishing safe_seq for the writers, until `stop()`. */
function startWatermarker(db: TestDb): { stop(): Promise<void> } {
  const wm = new Watermarker(db.pool({ max: 2 }), { owner: 'test' });
  const abort = new AbortController();
  const running = wm.run(abort.signal);
  return {
    async stop() {
      abort.abort();
      await running;
      await wm.close();
    },
  };
}

/** Every committed seq of `stream`, ascending. */
async function committed(db: TestDb, stream: string): Promise<bigint[]> {
  const r = await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.events WHERE stream = $1 ORDER BY seq', [stream]);
  return r.rows.map((row) => BigInt(row.seq));
}

async function cursor(db: TestDb, consumer: string, stream: string): Promise<bigint> {
  const r = await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = $2', [consumer, stream]);
  return BigInt(r.rows[0]?.seq ?? '0');
}

/** Waits until `consumer`'s cursor on each stream reaches that stream's last committed seq (writers stopped). */
async function caughtUp(db: TestDb, consumer: string, timeoutMs = 60_000): Promise<void> {
  const last = new Map<string, bigint>();
  for (const stream of STREAMS) last.set(stream, (await committed(db, stream)).at(-1) ?? 0n);
  await until(
    `the relay's cursors to reach ${[...last].map(([s, seq]) => `${s}:${seq}`).join(' ')}`,
    async () => {
      for (const [stream, seq] of last) if ((await cursor(db, consumer, stream)) < seq) return false;
      return true;
    },
    timeoutMs,
  );
}

/** How one stream's messages in the queue compare with its committed events. */
interface StreamCheck {
  /** Committed seqs with no message (at most 20 listed). */
  missing: string[];
  /** Message ids that are not committed events of this stream (at most 20 listed). */
  unknown: string[];
  /** First copies of a lower seq after a higher one. */
  outOfOrder: number;
  /** Copies beyond the first of some id. */
  duplicates: number;
  /** Messages whose seq is below the one before (a page published again from its start). */
  rewinds: number;
}

/** Checks one stream's messages (in queue order) against its committed seqs; ids are `tidemark:<seq>`, matching `tidemark-seq`. */
function checkStream(messages: readonly Message[], stream: string, seqs: readonly bigint[]): StreamCheck {
  const mine = messages.filter((m) => m.properties.headers?.['tidemark-stream'] === stream);
  const first: bigint[] = [];
  const seen = new Set<string>();
  const unknown: string[] = [];
  const wanted = new Set(seqs.map((seq) => `tidemark:${seq}`));
  let rewinds = 0;
  let previous = -1n;
  for (const m of mine) {
    const id = m.properties.messageId as string;
    const seq = BigInt(String(m.properties.headers?.['tidemark-seq']));
    assert.equal(id, `tidemark:${seq}`, 'message_id is <schema>:<seq>, the seq of its tidemark-seq header');
    if (!wanted.has(id)) unknown.push(id);
    if (seq < previous) rewinds += 1;
    previous = seq;
    if (seen.has(id)) continue;
    seen.add(id);
    first.push(seq);
  }
  return {
    missing: seqs.filter((seq) => !seen.has(`tidemark:${seq}`)).slice(0, 20).map(String),
    unknown: unknown.slice(0, 20),
    outOfOrder: first.filter((seq, i) => i > 0 && seq < first[i - 1]!).length,
    duplicates: mine.length - seen.size,
    rewinds,
  };
}

/** The value of the sample `name{labels}` in Prometheus text; undefined when absent. Labels match as a subset. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return undefined;
}

/** The sum of every `name` sample whose labels include `labels`. */
function total(text: string, name: string, labels: Record<string, string> = {}): number {
  return STREAMS.reduce((sum, stream) => sum + (sample(text, name, { ...labels, stream }) ?? 0), 0);
}

/**
 * The RabbitMQ sink as the relay sees it, plus the publishes it is waiting
 * on: a test cuts the path to the broker while a page is known to be in
 * flight. It changes nothing the relay or the sink do.
 */
class WatchedSink implements Sink {
  readonly name: string;
  readonly description: string;
  readonly ackTimeoutMs: number | undefined;
  /** Start instants (`performance.now()`) of the publishes not settled yet. */
  private readonly pending = new Set<{ at: number }>();

  constructor(private readonly inner: RabbitMqSink) {
    this.name = inner.name;
    this.description = inner.description;
    this.ackTimeoutMs = inner.ackTimeoutMs;
  }

  open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    return this.inner.open(target, signal);
  }

  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    const entry = { at: performance.now() };
    this.pending.add(entry);
    try {
      await this.inner.publish(messages, signal);
    } finally {
      this.pending.delete(entry);
    }
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  /** Whether a publish that started after `since` is still waiting for its confirms. */
  inFlightSince(since: number): boolean {
    return [...this.pending].some((p) => p.at > since);
  }
}

/** An in-process relay of both streams through `proxy`, with metrics and a record of its events (and their instants). */
function proxiedRelay(db: TestDb, proxy: Proxy, exchange: string, sinkOptions: { ackTimeoutMs?: number; connectTimeoutMs?: number } = {}) {
  const pool = db.pool({ max: 6 });
  const metrics = createMetrics({ pool, processMetrics: false });
  const sink = new WatchedSink(new RabbitMqSink({ url: proxy.url(URL_DIRECT), exchange, ...sinkOptions }));
  const events = new Recorder<{ at: number; event: RelayEvent }>();
  const relay = new Relay(pool, sink, {
    consumer: 'relay',
    streams: STREAMS,
    batchSize: 100,
    retryMinMs: 20,
    retryMaxMs: 500,
    observer: (event) => {
      metrics.relayObserver(event);
      events.push({ at: performance.now(), event });
    },
  });
  metrics.trackRelay(relay);
  db.defer(() => relay.close());
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  running.catch(() => undefined); // awaited by finish()
  return {
    relay,
    sink,
    metrics,
    events,
    /** Stops the relay after its page in flight and closes it. */
    async finish() {
      stop.abort();
      await running;
      await relay.close();
    },
  };
}

/** The first `published` event of `stream` (any stream when undefined) recorded at index `from` or later. */
function nextPublished(events: Recorder<{ at: number; event: RelayEvent }>, from: number, stream?: string, timeoutMs = 30_000) {
  return events.next((e) => e.event.type === 'published' && (stream === undefined || e.event.stream === stream), from, timeoutMs);
}

/** Describes the retries recorded from index `from`, one per line, for diagnostics. */
function describeRetries(events: Recorder<{ at: number; event: RelayEvent }>, from: number, origin: number): string {
  return events.items
    .slice(from)
    .filter((e) => e.event.type === 'retry')
    .map(({ at, event }) => {
      const e = event as Extract<RelayEvent, { type: 'retry' }>;
      return `+${Math.round(at - origin)} ms ${e.stream} ${e.source} #${e.attempt}: ${e.error instanceof Error ? e.error.message : String(e.error)}`;
    })
    .join('\n');
}

test('SIGKILLed over and over while writers commit, the relay CLI loses no event; copies are only pages published again after a kill, and first copies are in seq order', { timeout: 240_000 }, async (t) => {
  const KILLS = 20;
  const BATCH = 50;
  const seed = Math.floor(Math.random() * 2 ** 31);
  const rand = random(seed);
  const db = await testDb(t);
  const { exchange, queue } = await destination(t, { queue: true });
  const children = new Set<ChildProcess>();
  t.after(async () => {
    for (const child of children) if (alive(child)) child.kill('SIGKILL');
  });
  const args = ['relay', '--to', URL_DIRECT, '--consumer', 'relay', '--stream', 'a', '--stream', 'b', '--exchange', exchange, '--batch', String(BATCH), '--database-url', db.url];
  const start = (extra: string[] = []) => {
    const child = startCli([...args, ...extra]);
    children.add(child);
    return { child, log: watchStderr(child) };
  };

  // Writers at a modest pace: the relay is starting or dead most of the
  // time, so most events wait for the last start, which must not take long.
  const writers = await startSqlWriters(db, 2, 15);
  const watermarker = startWatermarker(db);
  db.defer(() => writers.stop());
  db.defer(() => watermarker.stop());
  const began = performance.now();

  // Kill points: a random instant after the start (anywhere from node's
  // start-up to the middle of a page), or once the queue holds a random
  // number of messages more than at the start (mid-page, as often as not).
  const kinds = { delay: 0, published: 0, afterOpen: 0 };
  const rounds: number[] = [];
  const opens: number[] = [];
  let retried = 0;
  for (let kill = 0; kill < KILLS; kill += 1) {
    const roundAt = performance.now();
    const before = await messageCount(queue);
    const { child, log } = start();
    const spawnedAt = performance.now();
    log.next(/relay: publishing to/).then(() => opens.push(performance.now() - spawnedAt), () => undefined);
    if (rand() < 0.5) {
      kinds.delay += 1;
      await delay(Math.floor(rand() * 1200));
    } else {
      kinds.published += 1;
      const target = before + 1 + Math.floor(rand() * 2 * BATCH);
      await until(
        `the relay to publish up to ${target} messages (kill ${kill + 1})`,
        async () => {
          if (!alive(child)) assert.fail(`the relay exited (${child.exitCode}) before it was killed:\n${log.text()}`);
          return (await messageCount(queue)) >= target;
        },
      );
    }
    assert.ok(alive(child), `the relay is still running at kill ${kill + 1}:\n${log.text()}`);
    if (/relay: publishing to/.test(log.text())) kinds.afterOpen += 1;
    // The command names itself once: `tidemark relay: publishing to ...`, never `relay: relay:`.
    assert.doesNotMatch(log.text(), /relay: relay:/, `a doubled prefix:\n${log.text()}`);
    retried += log.text().split('\n').filter((line) => line.includes('; retrying in ')).length;
    child.kill('SIGKILL');
    assert.equal(await exited(child), 'SIGKILL');
    rounds.push(performance.now() - roundAt);
  }
  const killedAt = performance.now();

  await writers.stop();
  const written = writers.written;
  let backlog = 0;
  for (const stream of STREAMS) {
    const c = await cursor(db, 'relay', stream);
    backlog += (await committed(db, stream)).filter((seq) => seq > c).length;
  }
  // The last start catches up with every committed event, then stops on SIGTERM
  // after its page in flight; /metrics and /healthz report it caught up.
  const last = start(['--http', '127.0.0.1:0']);
  const http = await stderrLine(last.child, last.log, /http on ([\d.]+:\d+)/);
  await caughtUp(db, 'relay');
  const catchUpMs = performance.now() - killedAt;
  const metrics = await (await fetch(`http://${http[1]}/metrics`)).text();
  const health = (await (await fetch(`http://${http[1]}/healthz`)).json()) as { relay: { healthy: boolean } };
  last.child.kill('SIGTERM');
  assert.equal(await exited(last.child), 0, last.log.text());
  assert.match(last.log.text(), /tidemark relay: stopped/);
  await watermarker.stop();
  for (const stream of STREAMS) assert.equal(sample(metrics, 'tidemark_relay_lag_events', { stream }), 0, `no lag on ${stream} once caught up`);
  assert.equal(health.relay.healthy, true);

  const messages = await readAll(queue);
  const report: string[] = [];
  for (const stream of STREAMS) {
    const seqs = await committed(db, stream);
    const check = checkStream(messages, stream, seqs);
    assert.deepEqual(check.missing, [], `${stream}: every committed event is in the queue`);
    assert.deepEqual(check.unknown, [], `${stream}: only committed events are`);
    assert.equal(check.outOfOrder, 0, `${stream}: first copies in seq order`);
    assert.ok(check.rewinds <= KILLS, `${stream}: ${check.rewinds} republished runs, at most one per kill (${KILLS})`);
    assert.ok(check.duplicates <= KILLS * BATCH, `${stream}: ${check.duplicates} copies, at most one page per kill (${KILLS} x ${BATCH})`);
    assert.equal(await cursor(db, 'relay', stream), seqs.at(-1));
    report.push(`${stream}: ${seqs.length} events, ${check.duplicates} duplicate copies in ${check.rewinds} republished runs`);
  }
  assert.ok(kinds.afterOpen > 0, 'some relay logged its sink open (so the prefix check above saw a line)');
  t.diagnostic(`seed ${seed}: ${KILLS} kills (${kinds.delay} at a random instant, ${kinds.published} after new messages; ${kinds.afterOpen} after the sink opened)`);
  t.diagnostic(
    `rounds ${Math.round(Math.min(...rounds))}-${Math.round(Math.max(...rounds))} ms (mean ${Math.round(rounds.reduce((a, b) => a + b, 0) / rounds.length)}); ` +
      `start to open ${opens.length ? `${Math.round(Math.min(...opens))}-${Math.round(Math.max(...opens))}` : '-'} ms; ` +
      `${retried} retry lines from killed relays; last start caught up in ${Math.round(catchUpMs)} ms (backlog ${backlog} events)`,
  );
  t.diagnostic(`${written} events written, ${messages.length} messages in the queue; ${report.join('; ')}; ${Math.round(performance.now() - began)} ms`);
});

test('connections to the broker reset mid-page: the in-process relay reconnects by itself, loses nothing, and its metrics count the retries and failed events', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const { exchange, queue } = await destination(t, { queue: true });
  const proxy = await startProxy({ target: BROKER });
  t.after(() => proxy.close());
  const writers = await startSqlWriters(db);
  const watermarker = startWatermarker(db);
  db.defer(() => writers.stop());
  db.defer(() => watermarker.stop());
  const run = proxiedRelay(db, proxy, exchange);

  const recoveries: number[] = [];
  // Three cuts pinned in the middle of a page (a reset, then an orderly
  // close, then a reset), then two while bytes flow, wherever they land.
  const cuts: { how: 'reset' | 'drop'; pinned: boolean }[] = [
    { how: 'reset', pinned: true },
    { how: 'drop', pinned: true },
    { how: 'reset', pinned: true },
    { how: 'reset', pinned: false },
    { how: 'drop', pinned: false },
  ];
  for (const [round, cut] of cuts.entries()) {
    // A page went through since the last cut; then hold every byte and wait
    // for a page published into the held path: it cannot be confirmed, so
    // the reset that follows lands in the middle of it.
    await nextPublished(run.events, run.events.items.length);
    const heldAt = performance.now();
    if (cut.pinned) proxy.blackhole();
    await until('a page in flight', () => run.sink.inFlightSince(heldAt));
    const from = run.events.items.length;
    const cutAt = performance.now();
    if (cut.how === 'reset') proxy.reset();
    else proxy.drop();
    proxy.heal();
    let stream: string | undefined;
    if (cut.pinned) {
      const retry = await run.events.next((e) => e.event.type === 'retry' && e.event.source === 'sink', from);
      await run.events.next((e) => e.event.type === 'failed', from);
      stream = retry.event.type === 'retry' ? retry.event.stream : undefined;
    }
    const back = await nextPublished(run.events, from, stream);
    recoveries.push(back.at - cutAt);
    const retries = describeRetries(run.events, from, cutAt);
    t.diagnostic(`cut ${round + 1} (${cut.how}${cut.pinned ? ', pinned mid-page' : ''}): published again after ${Math.round(back.at - cutAt)} ms${retries ? `\n${retries}` : ', no page failed'}`);
  }

  await writers.stop();
  await caughtUp(db, 'relay');
  await run.finish(); // the last page's published event comes just after its commit
  const text = await run.metrics.registry.metrics();
  await watermarker.stop();

  const retries = total(text, 'tidemark_relay_retries_total', { source: 'sink' });
  const failed = total(text, 'tidemark_relay_failed_events_total');
  assert.ok(retries >= 3, `tidemark_relay_retries_total{source="sink"} counts the resets, got ${retries}`);
  assert.ok(failed > 0, `tidemark_relay_failed_events_total counts the pages cut short, got ${failed}`);
  assert.equal(sample(text, 'tidemark_relay_sink_up'), 1, 'the sink is up again');
  const messages = await readAll(queue);
  let duplicates = 0;
  for (const stream of STREAMS) {
    const seqs = await committed(db, stream);
    const check = checkStream(messages, stream, seqs);
    assert.deepEqual(check.missing, [], `${stream}: every committed event is in the queue`);
    assert.deepEqual(check.unknown, [], `${stream}: only committed events are`);
    assert.equal(check.outOfOrder, 0, `${stream}: first copies in seq order`);
    assert.equal(sample(text, 'tidemark_relay_published_events_total', { stream }), seqs.length, `${stream}: each event counted published once`);
    duplicates += check.duplicates;
  }
  t.diagnostic(
    `${writers.written} events, ${messages.length} messages (${duplicates} duplicate copies); ${retries} sink retries, ${failed} failed events; ` +
      `recovered ${recoveries.map((ms) => `${Math.round(ms)} ms`).join(', ')} after each cut`,
  );
});

test('a stalled broker connection fails the page within ackTimeoutMs and reports the sink down; once the path heals the relay catches up with nothing lost', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const { exchange, queue } = await destination(t, { queue: true });
  const proxy = await startProxy({ target: BROKER });
  t.after(() => proxy.close());
  const writers = await startSqlWriters(db);
  const watermarker = startWatermarker(db);
  db.defer(() => writers.stop());
  db.defer(() => watermarker.stop());
  const ackTimeoutMs = 1000;
  const run = proxiedRelay(db, proxy, exchange, { ackTimeoutMs, connectTimeoutMs: 1000 });

  await nextPublished(run.events, 0);
  const from = run.events.items.length;
  const stalledAt = performance.now();
  proxy.blackhole();
  // The page in flight gets no confirms: it fails after ackTimeoutMs, and
  // reconnecting gets no answer within connectTimeoutMs. Both are sink retries.
  const first = await run.events.next((e) => e.event.type === 'retry' && e.event.source === 'sink', from);
  const during = await run.metrics.registry.metrics();
  assert.equal(sample(during, 'tidemark_relay_sink_up'), 0, 'the sink is down during the stall');
  assert.ok(total(during, 'tidemark_relay_failed_events_total') > 0, 'the page cut short is counted failed');
  const firstError = first.event.type === 'retry' ? first.event.error : undefined;
  assert.match(firstError instanceof Error ? firstError.message : '', /not confirmed within 1000 ms \(ackTimeoutMs\)/);
  assert.ok(first.at - stalledAt >= ackTimeoutMs - 50, `failed ${Math.round(first.at - stalledAt)} ms into the stall`);
  // The stall goes on for a few seconds: until reconnecting failed twice more.
  await run.events.next((e) => e.event.type === 'retry' && e.event.attempt >= 3, from);
  const stallRetries = run.events.items.slice(from).filter((e) => e.event.type === 'retry');
  assert.ok(stallRetries.every((e) => e.event.type === 'retry' && e.event.source === 'sink'), 'every retry is the broker\'s');
  assert.equal(sample(await run.metrics.registry.metrics(), 'tidemark_relay_sink_up'), 0, 'still down while reconnecting fails');
  // A page confirmed just before the path froze may commit after; none after the first failure.
  const early = run.events.items.slice(from).filter((e) => e.event.type === 'published');
  assert.deepEqual(early.filter((e) => e.at > first.at), [], 'nothing is published during the stall');

  const healedAt = performance.now();
  proxy.heal();
  const back = await nextPublished(run.events, run.events.items.length);
  const recoveryMs = back.at - healedAt;
  if (early.length > 0) t.diagnostic(`pages confirmed before the stall and committed in it: ${early.map((e) => `+${Math.round(e.at - stalledAt)} ms`).join(', ')}`);
  t.diagnostic(`stalled ${Math.round(healedAt - stalledAt)} ms; recovered ${Math.round(recoveryMs)} ms after the path healed\n${describeRetries(run.events, from, stalledAt)}`);

  await writers.stop();
  await caughtUp(db, 'relay');
  await run.finish(); // the last page's published event comes just after its commit
  const text = await run.metrics.registry.metrics();
  await watermarker.stop();
  assert.equal(sample(text, 'tidemark_relay_sink_up'), 1, 'the sink is up again');
  const messages = await readAll(queue);
  let duplicates = 0;
  for (const stream of STREAMS) {
    const seqs = await committed(db, stream);
    const check = checkStream(messages, stream, seqs);
    assert.deepEqual(check.missing, [], `${stream}: every committed event is in the queue`);
    assert.deepEqual(check.unknown, [], `${stream}: only committed events are`);
    assert.equal(check.outOfOrder, 0, `${stream}: first copies in seq order`);
    duplicates += check.duplicates;
  }
  t.diagnostic(`${writers.written} events, ${messages.length} messages (${duplicates} duplicate copies)`);
});

/** The lines a command printed on stderr. */
function lines(stderr: string): string[] {
  return stderr.split('\n').filter((line) => line !== '');
}

test('relay CLI: a missing exchange without --create-exchange exits 2 with one line naming it', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const missing = unique('missing');
  const r = await cli(['relay', '--to', URL_DIRECT, '--consumer', 'relay', '--stream', 's', '--exchange', missing, '--database-url', db.url]);
  assert.equal(r.code, 2, r.stderr);
  assert.equal(lines(r.stderr).length, 1, r.stderr);
  assert.ok(r.stderr.startsWith('tidemark: ') && r.stderr.includes(JSON.stringify(missing)), r.stderr);
  assert.match(r.stderr, /--create-exchange/);
  assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack');
  t.diagnostic(r.stderr.trim());
  assert.equal(await admin((ch) => ch.checkExchange(missing).then(() => true, () => false)), false, 'nothing declared');
});

test('relay CLI: an event no queue takes (unroutable) exits 1 naming its seq; the cursor stays before it', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const { exchange } = await destination(t, { queue: false });
  const writer = await db.session('writer');
  const seqs = [await insertEvent(writer, 's'), await insertEvent(writer, 's')];
  assert.equal((await new Watermarker(db.pool({ max: 1 }), { owner: 'test' }).step()).outcome, 'advanced');
  const r = await cli(['relay', '--to', URL_DIRECT, '--consumer', 'relay', '--stream', 's', '--exchange', exchange, '--database-url', db.url]);
  assert.equal(r.code, 1, r.stderr);
  const last = lines(r.stderr).at(-1)!;
  assert.ok(last.startsWith('tidemark: ') && last.includes(`seq ${seqs[0]}`), r.stderr);
  assert.match(last, /no queue is bound/);
  assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack');
  assert.ok((await cursor(db, 'relay', 's')) < seqs[0]!, 'the cursor stays before the event');
  t.diagnostic(r.stderr.trim());
});

test('relay CLI: nothing listening at the --to port exits 4 with one line naming host:port', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const port = await freePort();
  const r = await cli(['relay', '--to', `amqp://guest:guest@127.0.0.1:${port}/`, '--consumer', 'relay', '--stream', 's', '--database-url', db.url]);
  assert.equal(r.code, 4, r.stderr);
  assert.equal(lines(r.stderr).length, 1, r.stderr);
  assert.ok(r.stderr.startsWith('tidemark: ') && r.stderr.includes(`127.0.0.1:${port}`), r.stderr);
  t.diagnostic(r.stderr.trim());
});

test('relay CLI: a NATS flag with an amqp:// destination, or an unknown template field, exits 2 before connecting to anything', TIMEOUT, async (t) => {
  // Both the broker and the database URL point at a server that counts connections.
  const server = await countingServer(t);
  const to = `amqp://guest:guest@127.0.0.1:${server.port}/`;
  const database = `postgres://nobody@127.0.0.1:${server.port}/nothing`;
  const base = ['relay', '--to', to, '--consumer', 'relay', '--stream', 's', '--database-url', database];

  const subject = await cli([...base, '--subject', 'x.{stream}']);
  assert.equal(subject.code, 2, subject.stderr);
  assert.equal(lines(subject.stderr).length, 1, subject.stderr);
  assert.match(subject.stderr, /^tidemark: --subject: applies to nats:\/\/ destinations/);

  const bogus = await cli([...base, '--routing-key', '{bogus}']);
  assert.equal(bogus.code, 2, bogus.stderr);
  assert.equal(lines(bogus.stderr).length, 1, bogus.stderr);
  assert.match(bogus.stderr, /routing-?key/i);
  assert.match(bogus.stderr, /\{bogus\}/);

  assert.equal(server.connections(), 0, 'neither the broker nor the database was contacted');
  t.diagnostic(`${subject.stderr.trim()}\n${bogus.stderr.trim()}`);
});
