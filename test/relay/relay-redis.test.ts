/**
 * The relay CLI against a private redis-server (append-only file,
 * `appendfsync always`), judged from the Redis side: under concurrent
 * writers, with the relay process SIGKILLed three times and Redis itself
 * killed and restarted once, each Redis stream ends up holding every
 * committed event of its tidemark stream once, in seq order. The truth about
 * what was written is the events table; the truth about what was relayed is
 * XRANGE of each stream, read whole.
 *
 * Delays in this file shape the load or pick a kill point; no assertion
 * waits on one. Every wait polls a state (a cursor, a stream's length) with
 * a deadline.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { appendMany, Watermarker, type NewEvent } from '../../src/index.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { alive, checkDeliveries, EXACTLY_ONCE, stopChild } from '../support/faults.js';
import { startRedisServer } from '../support/redis-server.js';

after(closeAdmin);

const STREAMS = ['a', 'b'] as const;
const TOTAL = 10_000;

/** `Watermarker.run` for the test's duration. */
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

/**
 * `TOTAL` events from `writers` connections at once, in transactions of 1 to
 * 10 events on both streams, with a pause between transactions so the
 * writing lasts through the relay's crashes (load shaping).
 */
async function write(db: TestDb, writers: number): Promise<void> {
  const sessions = await Promise.all(Array.from({ length: writers }, (_, w) => db.session(`writer-${w}`)));
  let budget = TOTAL;
  await Promise.all(
    sessions.map(async ({ client }, w) => {
      for (let n = 0; budget > 0; n += 1) {
        // Taken from the budget before the await: the writers together write exactly TOTAL.
        const size = Math.min(budget, 1 + Math.floor(Math.random() * 10));
        budget -= size;
        const events: NewEvent[] = Array.from({ length: size }, (_, i) => ({
          stream: STREAMS[(w + i) % 2]!,
          kind: 'order.placed',
          key: `w${w}-${n}-${i}`,
          payload: { w, n, i, big: 12345678901234567890n.toString() },
        }));
        await appendMany(client, events);
        await delay(3);
      }
    }),
  );
}

test('10,000 events under concurrent writers, the relay CLI SIGKILLed 3 times and Redis restarted once: each Redis stream holds every committed event once, in seq order', async (t) => {
  const db = await testDb(t);
  const server = await startRedisServer(t);
  const admin = new Redis({ port: server.port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => 20, maxRetriesPerRequest: null });
  admin.on('error', () => undefined);
  await admin.connect();
  t.after(() => admin.disconnect());
  runWatermarker(db);

  const stored = async () => (await Promise.all(STREAMS.map((s) => admin.xlen(`tidemark:${s}`)))).reduce((n, x) => n + x, 0);
  const cursorSum = async () => BigInt((await db.observer.query<{ sum: string | null }>("SELECT sum(seq) AS sum FROM tidemark.cursors WHERE consumer = 'relay'")).rows[0]!.sum ?? '0');
  const children = new Set<ChildProcess>();
  db.defer(() => Promise.all([...children].map((c) => stopChild(c))));
  const start = () => {
    const child = startCli(['relay', '--database-url', db.url, '--to', server.url, '--consumer', 'relay', '--stream', 'a', '--stream', 'b', '--batch', '100', '--ack-timeout', '2s']);
    children.add(child);
    void exited(child).then(() => children.delete(child));
    return { child, log: watchStderr(child) };
  };
  const until = (run: ReturnType<typeof start>, what: string, check: () => Promise<boolean>) =>
    waitFor(
      what,
      async () => {
        if (!alive(run.child)) throw new Error(`the relay exited (${run.child.exitCode ?? run.child.signalCode}) before it was killed:\n${run.log.text()}`);
        return check();
      },
      60_000,
    );
  const kill = async (run: ReturnType<typeof start>) => {
    assert.ok(alive(run.child), `the relay exited before it was killed:\n${run.log.text()}`);
    run.child.kill('SIGKILL');
    assert.equal(await exited(run.child), 'SIGKILL');
  };

  const began = performance.now();
  const writing = write(db, 8);
  const notes: string[] = [];

  // Kill 1: right after new entries were stored (most often between Redis's reply and the cursor's commit).
  let before = await stored();
  const run1 = start();
  await until(run1, 'new entries stored', async () => (await stored()) > before);
  await kill(run1);
  notes.push(`kill 1 with ${(await stored()) - before} entries stored by run 1`);

  // Kill 2: a few milliseconds after a cursor commit.
  const sum = await cursorSum();
  const run2 = start();
  await until(run2, 'a cursor commit', async () => (await cursorSum()) > sum);
  await delay(Math.floor(Math.random() * 30));
  await kill(run2);

  // Redis killed (SIGKILL) and restarted under a running relay, which retries and goes on; then kill 3.
  before = await stored();
  const run3 = start();
  await until(run3, 'new entries stored by run 3', async () => (await stored()) > before);
  await server.restart();
  const afterRestart = await stored();
  await until(run3, 'entries stored after the Redis restart', async () => (await stored()) > afterRestart);
  await kill(run3);
  notes.push(`Redis restarted with ${afterRestart} entries kept`);

  // The writers finish; a last run catches up, and SIGTERM stops it cleanly.
  await writing;
  const written = performance.now();
  const r = await db.observer.query<{ stream: string; seq: string }>("SELECT stream, seq FROM tidemark.events WHERE stream IN ('a', 'b') ORDER BY seq");
  assert.equal(r.rows.length, TOTAL, 'the writers committed 10,000 events');
  const committed = new Map<string, bigint[]>(STREAMS.map((s) => [s, []]));
  for (const row of r.rows) committed.get(row.stream)!.push(BigInt(row.seq));
  const last = start();
  await until(last, 'both cursors at their stream\'s last seq', async () => {
    const c = await db.observer.query<{ stream: string; seq: string }>("SELECT stream, seq FROM tidemark.cursors WHERE consumer = 'relay'");
    const at = new Map(c.rows.map((row) => [row.stream, BigInt(row.seq)]));
    return STREAMS.every((s) => at.get(s) === committed.get(s)!.at(-1));
  });
  last.child.kill('SIGTERM');
  assert.equal(await exited(last.child), 0, `SIGTERM: exit 0\n${last.log.text()}`);

  for (const s of STREAMS) {
    const entries = (await admin.xrange(`tidemark:${s}`, '-', '+')) as [string, string[]][];
    const seqs = entries.map(([id]) => BigInt(id.slice(0, -2)));
    assert.deepEqual(checkDeliveries(seqs, committed.get(s)!), EXACTLY_ONCE, `stream ${s}: every committed seq once, in seq order`);
    assert.deepEqual(seqs, committed.get(s), `stream ${s}: exactly the committed seqs, ids strictly increasing`);
    const mismatched = entries.filter(([id, fields]) => fields[1] !== `tidemark:${id.slice(0, -2)}` || fields[3] !== id.slice(0, -2) || fields[5] !== s);
    assert.deepEqual(mismatched.slice(0, 3), [], 'each entry\'s id, seq and stream fields match its entry id');
  }
  t.diagnostic(`${notes.join('; ')}; written in ${Math.round(written - began)} ms; caught up ${Math.round(performance.now() - written)} ms after the last commit`);
});

test('tidemark relay --to redis:// --on-refused dead-letter exits 2 with one line, before connecting: a replay could not go below the top', async (t) => {
  const db = await testDb(t);
  const r = await cli(['relay', '--to', 'redis://127.0.0.1:1', '--consumer', 'r', '--stream', 's', '--on-refused', 'dead-letter', '--database-url', db.url]);
  assert.equal(r.code, 2, r.stderr);
  assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  assert.match(r.stderr, /^tidemark: --on-refused dead-letter: .*a Redis stream takes an entry only above its top.*use --on-refused stop/);
});
