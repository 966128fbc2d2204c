/**
 * The relay against a real nats-server (each test its own, started with
 * test/support/nats-server.ts), judged from the JetStream side: what the
 * stream holds after concurrent writers, relay crashes, a broker crash and
 * bad input. The truth about what was written is the events table, never
 * what writers counted; the truth about what was relayed is the stream,
 * read back whole with an ordered consumer.
 *
 * Delays in this file shape the load or pick a random kill point; no
 * assertion waits on one. Every wait polls a state (a cursor, the stream's
 * message count, a metric) with a generous deadline.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { createServer, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { after, test, type TestContext } from 'node:test';
import { jetstream, jetstreamManager, StorageType, type JetStreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type pg from 'pg';
import { append, appendMany, createMetrics, NatsSink, Pruner, Relay, Watermarker, type NewEvent, type RelayEvent, type RelayOptions } from '../../src/index.js';
import { exited, startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, insertEvent, testDb, waitFor, type Session, type TestDb } from '../support/db.js';
import { alive, checkDeliveries, EXACTLY_ONCE, startWriters, stopChild } from '../support/faults.js';
import { Recorder } from '../support/latch.js';
import { freePort, startNatsServer, type NatsServer } from '../support/nats-server.js';

after(closeAdmin);

/** The JetStream stream the relay creates by default. */
const JS_STREAM = 'TIDEMARK';

/** One message as the stream holds it: its `Nats-Msg-Id`, `Tidemark-Seq` and `Tidemark-Stream`. */
interface Stored {
  id: string;
  seq: bigint;
  stream: string;
}

const pick = <T>(xs: readonly T[]): T => xs[Math.floor(Math.random() * xs.length)]!;

/** An admin connection of the test (named, so the dedupe count can tell it from the relay's). */
async function natsAdmin(t: TestContext, server: NatsServer): Promise<{ nc: NatsConnection; jsm: JetStreamManager }> {
  const nc = await connect({ servers: server.url, name: 'test admin', maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  t.after(() => nc.close());
  return { nc, jsm: await jetstreamManager(nc) };
}

/** How many messages the stream holds; 0 before the relay created it. */
async function storedCount(jsm: JetStreamManager, stream = JS_STREAM): Promise<number> {
  try {
    return (await jsm.streams.info(stream)).state.messages;
  } catch {
    return 0;
  }
}

/**
 * The whole stream, in stream order, read with an ordered consumer on a
 * connection of its own: as many messages as the stream's state counts,
 * the last of which reports nothing pending.
 */
async function readBack(server: NatsServer, stream = JS_STREAM): Promise<Stored[]> {
  const nc = await connect({ servers: server.url, name: 'test reader' });
  try {
    const jsm = await jetstreamManager(nc);
    const { state } = await jsm.streams.info(stream);
    const out: Stored[] = [];
    if (state.messages === 0) return out;
    const consumer = await jetstream(nc).consumers.get(stream);
    const messages = await consumer.consume({ max_messages: 1000 });
    const deadline = setTimeout(() => messages.stop(new Error(`read ${out.length} of ${state.messages} messages of ${stream} in 60 s`)), 60_000);
    try {
      for await (const m of messages) {
        const h = m.headers!;
        out.push({ id: h.get('Nats-Msg-Id'), seq: BigInt(h.get('Tidemark-Seq')), stream: h.get('Tidemark-Stream') });
        if (out.length >= state.messages && m.info.pending === 0) break;
      }
    } finally {
      clearTimeout(deadline);
      messages.stop();
    }
    return out;
  } finally {
    await nc.close();
  }
}

/** Every committed seq of `streams`, per stream, ascending. */
async function committedByStream(observer: Session, streams: readonly string[]): Promise<Map<string, bigint[]>> {
  const r = await observer.query<{ stream: string; seq: string }>('SELECT stream, seq FROM tidemark.events WHERE stream = ANY($1) ORDER BY seq', [streams]);
  const out = new Map<string, bigint[]>(streams.map((s) => [s, []]));
  for (const row of r.rows) out.get(row.stream)!.push(BigInt(row.seq));
  return out;
}

async function cursors(observer: Session, consumer: string): Promise<Map<string, bigint>> {
  const r = await observer.query<{ stream: string; seq: string }>('SELECT stream, seq FROM tidemark.cursors WHERE consumer = $1', [consumer]);
  return new Map(r.rows.map((row) => [row.stream, BigInt(row.seq)]));
}

/** The sum of `consumer`'s cursors: grows with every page it commits (cheap enough to poll). */
async function cursorSum(observer: Session, consumer: string): Promise<bigint> {
  const r = await observer.query<{ sum: string | null }>('SELECT sum(seq) AS sum FROM tidemark.cursors WHERE consumer = $1', [consumer]);
  return BigInt(r.rows[0]!.sum ?? '0');
}

/** Events at or below `consumer`'s cursors: what the relay has committed as relayed. */
async function relayedCount(observer: Session, consumer: string): Promise<number> {
  const r = await observer.query<{ n: string }>(
    'SELECT count(*) AS n FROM tidemark.events e JOIN tidemark.cursors c ON c.consumer = $1 AND c.stream = e.stream WHERE e.seq <= c.seq',
    [consumer],
  );
  return Number(r.rows[0]!.n);
}

/** Waits until every cursor of `consumer` stands on its stream's last committed seq. */
async function waitForCursors(db: TestDb, consumer: string, committed: Map<string, bigint[]>, check: () => void = () => undefined): Promise<void> {
  await waitFor(
    'the relay to reach every stream\'s last committed seq',
    async () => {
      check();
      const c = await cursors(db.observer, consumer);
      return [...committed].every(([stream, seqs]) => (c.get(stream) ?? 0n) === (seqs.at(-1) ?? 0n));
    },
    60_000,
  );
}

/**
 * The stream holds every committed event exactly once (its id `tidemark:<seq>`),
 * nothing else, and each tidemark stream's events in seq order.
 */
function assertExactlyOnce(stored: readonly Stored[], committed: Map<string, bigint[]>): void {
  const total = [...committed.values()].reduce((n, seqs) => n + seqs.length, 0);
  assert.equal(stored.length, total, 'as many messages as committed events');
  assert.deepEqual(stored.filter((m) => m.id !== `tidemark:${m.seq}`).slice(0, 5), [], 'each message\'s id is tidemark:<its seq>');
  assert.equal(new Set(stored.map((m) => m.id)).size, stored.length, 'ids unique');
  const streams = new Set(stored.map((m) => m.stream));
  assert.deepEqual([...streams].filter((s) => !committed.has(s)), [], 'no message of another stream');
  for (const [stream, seqs] of committed) {
    const got = stored.filter((m) => m.stream === stream).map((m) => m.seq);
    assert.deepEqual(checkDeliveries(got, seqs), EXACTLY_ONCE, `stream ${stream}: every committed seq once, in seq order`);
  }
}

/** `Watermarker.run` for the test's duration, stopped (and its lease released) after it. */
function runWatermarker(db: TestDb): void {
  const wm = new Watermarker(db.pool({ max: 2 }), { owner: 'test' });
  const stop = new AbortController();
  const running = wm.run(stop.signal);
  db.defer(async () => {
    stop.abort();
    await running;
    await wm.close();
  });
}

/** An in-process relay, running; `stop()` ends `run` (rejecting with its error) and is called after the test too. */
function startRelay(db: TestDb, sink: NatsSink, options: RelayOptions): { relay: Relay; running: Promise<void>; stop: () => Promise<void> } {
  const relay = new Relay(db.pool({ max: options.streams.length + 3 }), sink, options);
  const abort = new AbortController();
  const running = relay.run(abort.signal);
  running.catch(() => undefined); // awaited by stop(), or by the test
  const stop = async () => {
    abort.abort();
    try {
      await running;
    } finally {
      await relay.close();
    }
  };
  db.defer(() => stop().catch(() => undefined));
  return { relay, running, stop };
}

/** One writer transaction of `size` events, its shape picked by `n`: autocommit append, plain INSERTs or appendMany, sometimes with a rolled-back seq. */
async function writeTransaction(client: pg.Client, w: number, n: number, size: number, streams: readonly string[]): Promise<void> {
  const events: NewEvent[] = Array.from({ length: size }, (_, i) => ({ stream: pick(streams), kind: 'order.placed', key: `w${w}-${n}-${i}`, payload: { w, n, i } }));
  if (size === 1 && n % 2 === 0) {
    await append(client, events[0]!); // autocommit
    return;
  }
  await client.query('BEGIN');
  if (n % 3 === 0) {
    // Plain INSERTs, one statement per event.
    for (const e of events) await client.query('INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ($1, $2, $3, $4)', [e.stream, e.kind, e.key, e.payload]);
  } else {
    await appendMany(client, events);
  }
  if (n % 7 === 3) {
    // A seq drawn and rolled back: a gap the relay must not fill or wait for.
    await client.query('SAVEPOINT gap');
    await client.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ($1, 'rolled.back', 'never')`, [pick(streams)]);
    await client.query('ROLLBACK TO SAVEPOINT gap');
  }
  await client.query('COMMIT');
}

/** `total` events from `writers` connections at once, in transactions of 1 to 10 events (half of them single). */
async function writeConcurrently(db: TestDb, total: number, writers: number, streams: readonly string[]): Promise<void> {
  const sessions = await Promise.all(Array.from({ length: writers }, (_, w) => db.session(`writer-${w}`)));
  let budget = total;
  await Promise.all(
    sessions.map(async ({ client }, w) => {
      for (let n = 0; budget > 0; n += 1) {
        // Taken from the budget before the await: the writers together write exactly `total`.
        const size = Math.min(budget, Math.random() < 0.5 ? 1 : 2 + Math.floor(Math.random() * 9));
        budget -= size;
        await writeTransaction(client, w, n, size, streams);
      }
    }),
  );
}

test('10,000 events from 8 concurrent writers on 3 streams: JetStream holds each committed seq once, each stream in seq order', async (t) => {
  const db = await testDb(t);
  const server = await startNatsServer(t);
  const streams = ['orders', 'payments', 'shipments'];
  runWatermarker(db);
  const sink = new NatsSink({ url: server.url, createStream: true });
  const published = { pages: 0, events: 0 };
  const relaying = startRelay(db, sink, {
    consumer: 'relay',
    streams,
    observer: (e) => {
      if (e.type === 'published') {
        published.pages += 1;
        published.events += e.count;
      }
    },
  });

  const started = performance.now();
  await writeConcurrently(db, 10_000, 8, streams);
  const written = performance.now();
  const committed = await committedByStream(db.observer, streams);
  assert.equal([...committed.values()].reduce((n, s) => n + s.length, 0), 10_000, 'the writers committed 10,000 events');
  await waitForCursors(db, 'relay', committed);
  const relayed = performance.now();
  await relaying.stop();

  const stored = await readBack(server);
  assertExactlyOnce(stored, committed);
  assert.equal(published.events, 10_000, 'the relay reported each event published once');
  t.diagnostic(
    `written in ${Math.round(written - started)} ms; relayed ${Math.round(relayed - written)} ms after the last commit; ` +
      `${published.pages} pages; per stream ${streams.map((s) => `${s} ${committed.get(s)!.length}`).join(', ')}`,
  );
});

/** The relay CLI's connections on the server (closed ones too) and the JetStream API requests, from the monitoring port. */
async function relayTraffic(monitor: string): Promise<{ connections: number; inMsgs: number; otherInMsgs: number; apiTotal: number }> {
  type Connz = { connections: { name?: string; in_msgs: number }[] };
  const connz = (await (await fetch(`${monitor}/connz?state=all&limit=100000`)).json()) as Connz;
  const jsz = (await (await fetch(`${monitor}/jsz`)).json()) as { api: { total: number } };
  const relay = connz.connections.filter((c) => c.name === 'tidemark relay');
  const other = connz.connections.filter((c) => c.name !== 'tidemark relay');
  return {
    connections: relay.length,
    inMsgs: relay.reduce((n, c) => n + c.in_msgs, 0),
    otherInMsgs: other.reduce((n, c) => n + c.in_msgs, 0),
    apiTotal: jsz.api.total,
  };
}

type KillPoint = 'random delay' | 'new message stored' | 'cursor moved';

/** A CLI child and its stderr. */
interface Running {
  child: ChildProcess;
  log: ReturnType<typeof watchStderr>;
}

/** One relay CLI, SIGKILLed and started again: its consumer, the JetStream stream and subjects it publishes to. */
interface CrashedRelay {
  consumer: string;
  jsStream: string;
  subject: string;
  kills: { point: KillPoint; afterMs: number; uncommitted: number }[];
}

/**
 * Starts the relay CLI `kills` times and SIGKILLs each at a random point:
 * after a random delay (in start-up, in open, in a page or between pages);
 * at once after a new message was stored (most often between JetStream's
 * acknowledgements and the cursor's commit); or a few milliseconds after a
 * cursor commit. Each one starts after the previous one died.
 */
async function crashLoop(db: TestDb, jsm: JetStreamManager, start: (r: CrashedRelay) => Running, r: CrashedRelay, kills: number): Promise<void> {
  for (let i = 0; i < kills; i += 1) {
    const before = { stored: await storedCount(jsm, r.jsStream), cursorSum: await cursorSum(db.observer, r.consumer) };
    const spawned = performance.now();
    const { child, log } = start(r);
    const until = (what: string, check: () => Promise<boolean>) =>
      waitFor(
        `${r.consumer}: ${what}`,
        async () => {
          if (!alive(child)) throw new Error(`${r.consumer} run ${i + 1} exited (${child.exitCode ?? child.signalCode}) before it was killed:\n${log.text()}`);
          return check();
        },
        60_000,
      );
    const point: KillPoint = i % 3 === 0 ? 'random delay' : i % 3 === 1 ? 'new message stored' : 'cursor moved';
    if (point === 'random delay') {
      await delay(Math.floor(Math.random() * 2500));
    } else if (point === 'new message stored') {
      await until('a new message in the stream', async () => (await storedCount(jsm, r.jsStream)) > before.stored);
    } else {
      await until('a cursor commit', async () => (await cursorSum(db.observer, r.consumer)) > before.cursorSum);
      await delay(Math.floor(Math.random() * 30));
    }
    assert.ok(alive(child), `${r.consumer} run ${i + 1} exited before it was killed:\n${log.text()}`);
    child.kill('SIGKILL');
    assert.equal(await exited(child), 'SIGKILL');
    // Stored but not committed as relayed: the next run publishes these again, and JetStream drops them.
    const uncommitted = (await storedCount(jsm, r.jsStream)) - (await relayedCount(db.observer, r.consumer));
    r.kills.push({ point, afterMs: Math.round(performance.now() - spawned), uncommitted });
  }
}

test('SIGKILL of relay CLIs at random points, 22 times, under writers: JetStream holds every committed event once, in seq order', async (t) => {
  const db = await testDb(t);
  const monitorPort = await freePort();
  const server = await startNatsServer(t, { config: `http: "127.0.0.1:${monitorPort}"` });
  const { jsm } = await natsAdmin(t, server);
  const streams = ['a', 'b'];
  runWatermarker(db);
  const writePool = db.pool({ max: 4 });
  const writers = streams.map((stream) => startWriters(writePool, { count: 2, stream, pauseMs: 10 }));
  db.defer(() => Promise.all(writers.map((w) => w.stop())));
  const children = new Set<ChildProcess>();
  db.defer(() => Promise.all([...children].map((c) => stopChild(c))));
  const start = (r: CrashedRelay): Running => {
    const relay = ['--consumer', r.consumer, '--stream', 'a', '--stream', 'b', '--batch', '50'];
    const nats = ['--to', server.url, '--nats-stream', r.jsStream, '--subject', r.subject, '--create-stream'];
    const child = startCli(['relay', '--database-url', db.url, ...relay, ...nats]);
    children.add(child);
    void exited(child).then(() => children.delete(child));
    return { child, log: watchStderr(child) };
  };

  // Two relays (two consumers, each into a JetStream stream of its own),
  // crashed side by side: twice the kills in the time start-up takes.
  const relays: CrashedRelay[] = [
    { consumer: 'relay-1', jsStream: 'ONE', subject: 'one.{stream}.{kind}', kills: [] },
    { consumer: 'relay-2', jsStream: 'TWO', subject: 'two.{stream}.{kind}', kills: [] },
  ];
  await Promise.all(relays.map((r) => crashLoop(db, jsm, start, r, 11)));

  // The writers stop; one last run of each relay catches up, and SIGTERM stops it cleanly.
  await Promise.all(writers.map((w) => w.stop()));
  const committed = await committedByStream(db.observer, streams);
  await Promise.all(
    relays.map(async (r) => {
      const { child, log } = start(r);
      await waitForCursors(db, r.consumer, committed, () => {
        if (!alive(child)) throw new Error(`the last run of ${r.consumer} exited (${child.exitCode ?? child.signalCode}):\n${log.text()}`);
      });
      child.kill('SIGTERM');
      assert.equal(await exited(child), 0, `SIGTERM: exit 0\n${log.text()}`);
      assert.match(log.text(), /tidemark relay: SIGTERM: stopping\n(.*\n)*tidemark relay: stopped\n/);
    }),
  );

  // Publishes the server received from relay connections, less their API
  // requests (stream info and create at open): the API total counts the
  // test's requests too, which are every message its own connections sent.
  const traffic = await relayTraffic(`http://127.0.0.1:${monitorPort}`);
  const sent = traffic.inMsgs - (traffic.apiTotal - traffic.otherInMsgs);
  let total = 0;
  for (const r of relays) {
    const stored = await readBack(server, r.jsStream);
    assertExactlyOnce(stored, committed);
    total += stored.length;
  }
  const kills = relays.flatMap((r) => r.kills);
  const byPoint = (p: KillPoint) => kills.filter((k) => k.point === p).length;
  const between = kills.filter((k) => k.uncommitted > 0);
  t.diagnostic(
    `${kills.length} SIGKILLs: ${byPoint('random delay')} after a random delay, ${byPoint('new message stored')} right after a new message was stored, ` +
      `${byPoint('cursor moved')} right after a cursor commit; ${between.length} of them struck between JetStream's acknowledgements and the commit ` +
      `(stored events above the cursor: ${between.map((k) => k.uncommitted).join(', ') || 'none'})`,
  );
  t.diagnostic(
    `${total / relays.length} events stored once in each stream; ${traffic.connections} relay connections sent ${sent} publishes, ` +
      `${sent - total} of them dropped by JetStream as duplicates (Nats-Msg-Id)`,
  );
  t.diagnostic(relays.map((r) => `${r.consumer} kill times (ms after start): ${r.kills.map((k) => k.afterMs).join(' ')}`).join('; '));
  assert.ok(sent >= total, 'at least one publish per stored event');
});

test('a NATS crash under load: the relay recovers by itself with nothing lost or duplicated, and the metrics show the outage', async (t) => {
  const db = await testDb(t);
  const server = await startNatsServer(t);
  const { jsm } = await natsAdmin(t, server);
  const streams = ['a', 'b'];
  runWatermarker(db);
  const pool = db.pool({ max: 6 });
  const metrics = createMetrics({ pool, schema: 'tidemark' });
  const events = new Recorder<{ at: number; event: RelayEvent }>();
  // A short acknowledgement timeout, so a page in flight at the crash fails
  // (and is retried) while the server is still down.
  const sink = new NatsSink({ url: server.url, createStream: true, ackTimeoutMs: 1000 });
  const relaying = startRelay(db, sink, {
    consumer: 'relay',
    streams,
    observer: (event) => {
      metrics.relayObserver(event);
      events.push({ at: performance.now(), event });
    },
  });
  metrics.trackRelay(relaying.relay);
  const writers = streams.map((stream) => startWriters(db.pool({ max: 2 }), { count: 2, stream, pauseMs: 3 }));
  db.defer(() => Promise.all(writers.map((w) => w.stop())));

  // Mid-stream: events have been flowing for a while.
  await waitFor('500 messages stored', async () => (await storedCount(jsm)) >= 500, 60_000);
  const fromKill = events.items.length;
  await server.kill();
  const killedAt = performance.now();
  const retry = await events.next((e) => e.event.type === 'retry' && e.event.source === 'sink', fromKill, 30_000);
  assert.ok(!server.running, 'the first sink retry came while the server was down');
  // Another stream's page acknowledged just before the crash may still commit: poll the scrape.
  const scraped = await waitFor('tidemark_relay_sink_up 0 in a scrape', async () => {
    const text = await metrics.registry.metrics();
    return /^tidemark_relay_sink_up 0$/m.test(text) && text;
  });
  assert.ok(!server.running, 'scraped during the outage');
  assert.match(scraped, /^tidemark_relay_retries_total\{stream="(a|b)",source="sink"\} [1-9]/m);
  await delay(Math.max(0, 5000 - (performance.now() - killedAt))); // the outage lasts 5 s
  const fromRestart = events.items.length;
  await server.start();
  const upAt = performance.now();
  const first = await events.next((e) => e.event.type === 'published', fromRestart, 60_000);
  const afterRestart = await storedCount(jsm);
  // Relaying goes on: more events are stored after the first publish.
  await waitFor('more messages after the restart', async () => (await storedCount(jsm)) > afterRestart + 200, 60_000);

  await Promise.all(writers.map((w) => w.stop()));
  const committed = await committedByStream(db.observer, streams);
  await waitForCursors(db, 'relay', committed);
  const text = await metrics.registry.metrics();
  await relaying.stop();
  assertExactlyOnce(await readBack(server), committed);

  const retries = [...text.matchAll(/^tidemark_relay_retries_total\{stream="\w+",source="sink"\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
  assert.ok(retries > 0, `tidemark_relay_retries_total{source="sink"} > 0 afterwards, got:\n${text}`);
  assert.match(text, /^tidemark_relay_sink_up 1$/m, 'the sink is up again');
  const outage = events.items.slice(fromKill).filter((e) => e.event.type === 'retry' && e.at < first.at);
  t.diagnostic(
    `first sink retry ${Math.round(retry.at - killedAt)} ms after the kill; server down ${Math.round(upAt - killedAt)} ms; ` +
      `first publish ${Math.round(first.at - upAt)} ms after the server accepted connections again; ` +
      `${outage.length} retries meanwhile (${retries} sink retries counted); ${[...committed.values()].reduce((n, s) => n + s.length, 0)} events relayed once`,
  );
});

/** Runs the relay CLI to its exit; its exit code and stderr. */
async function runRelay(db: TestDb, args: string[]): Promise<{ code: number | string; stderr: string; lines: string[] }> {
  const child = startCli(['relay', '--database-url', db.url, '--consumer', 'relay', ...args]);
  db.defer(() => stopChild(child));
  const log = watchStderr(child);
  const deadline = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const code = await exited(child);
  clearTimeout(deadline);
  const stderr = log.text();
  return { code, stderr, lines: stderr.split('\n').filter(Boolean) };
}

/** A TCP port that counts the connections made to it and answers nothing. */
async function countingPort(t: TestContext): Promise<{ port: number; connections: () => number }> {
  let connections = 0;
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
  });
  const address = server.address();
  return { port: typeof address === 'object' && address ? address.port : 0, connections: () => connections };
}

test('relay CLI bad input: an unreachable broker exits 4; a missing stream, a short duplicate window, uncovered subjects or an unknown template field exit 2', async (t) => {
  const db = await testDb(t);
  const server = await startNatsServer(t);
  const { jsm } = await natsAdmin(t, server);

  // Unreachable: nothing listens on the port. One line, exit 4.
  const unreachable = await runRelay(db, ['--to', `nats://127.0.0.1:${await freePort()}`, '--stream', 'orders']);
  assert.equal(unreachable.code, 4, unreachable.stderr);
  assert.equal(unreachable.lines.length, 1, unreachable.stderr);
  assert.match(unreachable.lines[0]!, /^tidemark: nats: cannot connect to NATS at 127\.0\.0\.1:\d+/);

  // The stream does not exist and may not be created: exit 2 naming it; nothing created.
  const missing = await runRelay(db, ['--to', server.url, '--stream', 'orders', '--nats-stream', 'EVENTS']);
  assert.equal(missing.code, 2, missing.stderr);
  assert.match(missing.lines.at(-1)!, /^tidemark: nats: JetStream stream EVENTS does not exist on .*--create-stream/);
  await assert.rejects(jsm.streams.info('EVENTS'), 'the stream was not created');

  // A duplicate window (30 s) shorter than the relay's republish bound (100 s at the defaults): exit 2 naming both.
  await jsm.streams.add({ name: 'SHORT', subjects: ['tidemark.>'], storage: StorageType.File, duplicate_window: 30_000 * 1e6 });
  const short = await runRelay(db, ['--to', server.url, '--stream', 'orders', '--nats-stream', 'SHORT']);
  assert.equal(short.code, 2, short.stderr);
  assert.match(short.lines.at(-1)!, /duplicate window 30s of stream SHORT is not longer than the relay's republish bound of 100 s/);

  assert.equal(await storedCount(jsm, 'SHORT'), 0, 'nothing published to SHORT');
  await jsm.streams.delete('SHORT'); // its subjects would overlap the next one's

  // The stream does not take the relay's subjects: exit 2 naming the subject and the stream.
  await jsm.streams.add({ name: 'NARROW', subjects: ['tidemark.payments.>'], storage: StorageType.File });
  const narrow = await runRelay(db, ['--to', server.url, '--stream', 'orders', '--stream', 'payments', '--nats-stream', 'NARROW']);
  assert.equal(narrow.code, 2, narrow.stderr);
  assert.match(narrow.lines.at(-1)!, /JetStream stream NARROW does not take subject tidemark\.orders\.> \(its subjects: tidemark\.payments\.>\)/);

  // An unknown template field: exit 2 before connecting to anything.
  const broker = await countingPort(t);
  const bogus = await runRelay(db, ['--to', `nats://127.0.0.1:${broker.port}`, '--stream', 'orders', '--subject', '{bogus}']);
  assert.equal(bogus.code, 2, bogus.stderr);
  assert.equal(bogus.lines.length, 1, bogus.stderr);
  assert.match(bogus.lines[0]!, /^tidemark: --subject: unknown field \{bogus\}/);
  assert.equal(broker.connections(), 0, 'no connection to the broker');
  assert.equal((await cursors(db.observer, 'relay')).size, 0, 'no cursor created: the database was not used either');
  assert.equal(await storedCount(jsm, 'NARROW'), 0, 'nothing published to NARROW');
});

test('relay CLI: an event over the server\'s max_payload stops it with exit 1 naming that seq; the cursor stays just before it', async (t) => {
  const db = await testDb(t);
  const server = await startNatsServer(t, { config: 'max_payload: 4096' });
  const writer = await db.session('writer');
  const small1 = await insertEvent(writer, 'orders');
  const big = (
    await writer.query<{ seq: string }>(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'k', 'big', $1) RETURNING seq`, [{ blob: 'x'.repeat(8192) }])
  ).rows[0]!.seq;
  const small2 = await insertEvent(writer, 'orders');
  assert.equal((await new Watermarker(db.pool({ max: 1 }), { owner: 'test' }).step()).safeSeq, small2);

  // One event per page: the first one is relayed and committed before the big one is tried.
  const run = await runRelay(db, ['--to', server.url, '--stream', 'orders', '--create-stream', '--batch', '1']);
  assert.equal(run.code, 1, run.stderr);
  assert.match(run.lines.at(-1)!, new RegExp(`^tidemark: nats: the event seq ${big} is \\d+ bytes as a NATS message .*over the server's max_payload of 4096 bytes`));
  assert.match(run.stderr, new RegExp(`tidemark relay: relay stopped: .*seq ${big}\\b`));
  assert.equal((await cursors(db.observer, 'relay')).get('orders'), small1, 'the cursor stays just before the big event');
  const stored = await readBack(server);
  assert.deepEqual(
    stored.map((m) => m.seq),
    [small1],
    'only the first event is in the stream',
  );
});

test('relay CLI: events pruned before the relay read them end it with exit 3 (resync); nothing published, the cursor unchanged', async (t) => {
  const db = await testDb(t);
  const server = await startNatsServer(t);
  const { jsm } = await natsAdmin(t, server);
  const writer = await db.session('writer');
  const wm = new Watermarker(db.pool({ max: 1 }), { owner: 'test' });
  db.defer(() => wm.close());

  // First the relay takes two events, so its cursor and the stream hold something.
  const relayedSeqs = [await insertEvent(writer, 'orders'), await insertEvent(writer, 'orders')];
  await wm.step();
  const first = startRelay(db, new NatsSink({ url: server.url, createStream: true }), { consumer: 'relay', streams: ['orders'] });
  await waitFor('the first events relayed', async () => (await cursors(db.observer, 'relay')).get('orders') === relayedSeqs[1]);
  await first.stop();

  // Then three more are published and pruned (with everything older) before the relay runs again.
  const unread: bigint[] = [];
  for (let i = 0; i < 3; i += 1) unread.push(await insertEvent(writer, 'orders'));
  assert.equal((await wm.step()).outcome, 'advanced');
  const pruned = await new Pruner(db.pool({ max: 1 }), { retentionMs: 0, allowShortRetention: true }).prune();
  assert.equal(pruned.deleted, 5);

  const run = await runRelay(db, ['--to', server.url, '--stream', 'orders']);
  assert.equal(run.code, 3, run.stderr);
  const resync = `consumer "relay" on stream "orders" is at seq ${relayedSeqs[1]}, but retention removed events through seq ${unread.at(-1)}`;
  assert.ok(
    run.lines.at(-1)!.startsWith(
      `tidemark: relay: retention removed events of stream "orders" through seq ${unread.at(-1)} before they were relayed (consumer "relay" is at seq ${relayedSeqs[1]})`,
    ),
    run.stderr,
  );
  assert.match(run.lines.at(-1)!, /to go on without them: tidemark cursor set --consumer relay --stream orders --to start$/, 'says how to go on without them');
  assert.ok(run.lines.some((l) => l.startsWith(`tidemark relay: relay stopped: ${resync}`)), run.stderr);
  assert.equal((await cursors(db.observer, 'relay')).get('orders'), relayedSeqs[1], 'cursor unchanged');
  assert.equal(await storedCount(jsm), 2, 'nothing more published');
});
