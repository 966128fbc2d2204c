/**
 * The relay end to end, PostgreSQL to a local webhook receiver that
 * misbehaves on purpose (a seeded random, so every run sees the same
 * faults): it answers 503 to a fifth of the requests, holds one in twenty
 * past the sink's timeout (then answers into a closed connection), and
 * refuses one chosen event with 400 every time.
 *
 * What must hold: every other event reaches the receiver, signed, each
 * key's events first arrive in seq order, and every copy of an event
 * carries the same `webhook-id`. The refused event stops the relay naming
 * its seq (`onRefused: 'stop'`, the CLI's default) or becomes a dead letter
 * while everything after it is delivered (`'dead-letter'`); a replay of it
 * publishes it once the receiver takes it.
 */
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { listDeadLetters, replayDeadLetters } from '../../src/consumer/dead-letters.js';
import { SinkError } from '../../src/errors.js';
import type { RelayEvent } from '../../src/relay/events.js';
import { Relay } from '../../src/relay/relay.js';
import { HttpSink } from '../../src/relay/sinks/http/sink.js';
import { Watermarker } from '../../src/watermark/watermarker.js';
import { cli } from '../support/cli.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { Receiver, seeded, type Received, type Reply } from '../support/receiver.js';

after(closeAdmin);

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
const TIMEOUT = { timeout: 120_000 };
const FAST = { listen: false, pollIntervalMs: 20, retryMinMs: 5, retryMaxMs: 50 } as const;
const SINK = { secret: SECRET, ackTimeoutMs: 250, retryMinMs: 5, retryMaxMs: 50, concurrency: 16 } as const;

/** Writes `count` events to each of `streams`, keys spread over `keys`, and moves safe_seq past them. */
async function write(db: TestDb, streams: string[], count: number, keys: number): Promise<void> {
  const pool = db.pool();
  for (const stream of streams) {
    await pool.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload, headers)
       SELECT $1, 'order.placed', 'k' || (g % $3), pg_catalog.jsonb_build_object('i', g, 'note', 'ünï'),
              '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'::jsonb
         FROM pg_catalog.generate_series(1, $2) AS g`,
      [stream, count, keys],
    );
  }
  const watermarker = new Watermarker(pool, { owner: 'test' });
  await waitFor('safe_seq past the events', async () => (await watermarker.step()).outcome !== 'advanced' || undefined);
}

async function seqs(db: TestDb, stream: string): Promise<bigint[]> {
  const r = await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.events WHERE stream = $1 ORDER BY seq', [stream]);
  return r.rows.map((row) => BigInt(row.seq));
}

/** The misbehaving receiver: `refuse` is answered 400, the rest 503 (20%), held past the timeout (5%), or 200. */
function flaky(refuse: Set<string>, random = seeded(2026)): (r: Received) => Reply {
  return (r) => {
    if (refuse.has(r.headers['tidemark-seq'] as string)) return { status: 400, body: '{"error":"unknown product"}' };
    const p = random();
    if (p < 0.2) return { status: 503, headers: random() < 0.5 ? { 'retry-after': '0' } : ({} as Record<string, string>) };
    // Past ackTimeoutMs (250); the answer then finds the connection closed, or, by chance, still open.
    if (p < 0.25) return random() < 0.5 ? { hold: true } : { status: 200, delayMs: 300 };
    return { status: 200 };
  };
}

function signed(r: Received): boolean {
  const expected = createHmac('sha256', KEY).update(`${r.headers['webhook-id']}.${r.headers['webhook-timestamp']}.`).update(r.body).digest('base64');
  return r.headers['webhook-signature'] === `v1,${expected}`;
}

/**
 * Checks what the receiver got: every event of `expected` (seqs per
 * stream) arrived and was answered 2xx, signed, each key's events first
 * arrived in seq order, and copies of an event share its webhook-id.
 */
function checkReceived(receiver: Receiver, origin: string, expected: Map<string, bigint[]>): void {
  const firstBySeq = new Map<string, Received>();
  for (const r of receiver.requests) {
    assert.ok(signed(r), `request ${r.n} signed`);
    const seq = r.headers['tidemark-seq'] as string;
    assert.equal(r.headers['webhook-id'], `${origin}:${seq}`, 'every copy of an event: the same webhook-id');
    if (!firstBySeq.has(seq)) firstBySeq.set(seq, r);
  }
  const taken = new Set(receiver.requests.filter((r) => r.status !== undefined && r.status < 300).map((r) => r.headers['tidemark-seq'] as string));
  for (const [stream, want] of expected) {
    for (const seq of want) assert.ok(taken.has(String(seq)), `stream ${stream} seq ${seq} taken by the receiver`);
    const byKey = new Map<string, bigint[]>();
    for (const r of [...firstBySeq.values()].sort((a, b) => a.n - b.n)) {
      if (r.headers['tidemark-stream'] !== stream) continue;
      const key = r.headers['tidemark-key'] as string;
      byKey.set(key, [...(byKey.get(key) ?? []), BigInt(r.headers['tidemark-seq'] as string)]);
    }
    for (const [key, order] of byKey) assert.deepEqual(order, [...order].sort((a, b) => (a < b ? -1 : 1)), `stream ${stream} key ${key}: first copies in seq order`);
  }
}

async function origin(db: TestDb): Promise<string> {
  return (await db.observer.query<{ origin: string }>('SELECT origin::text AS origin FROM tidemark.watermark')).rows[0]!.origin;
}

test('a flaky receiver gets every event, in order per key; the refused one becomes a dead letter, everything after it delivered, and a replay publishes it', TIMEOUT, async (t) => {
  const db = await testDb(t);
  const streams = ['orders', 'payments'];
  await write(db, streams, 1500, 150);
  const all = new Map(await Promise.all(streams.map(async (s) => [s, await seqs(db, s)] as const)));
  const refused = all.get('orders')![700]!;
  const refuse = new Set([String(refused)]);
  const receiver = await new Receiver(flaky(refuse)).start();
  t.after(() => receiver.stop());
  const events: RelayEvent[] = [];
  const relay = new Relay(db.pool(), new HttpSink({ url: receiver.url, ...SINK }), { ...FAST, consumer: 'relay', streams, batchSize: 200, onRefused: 'dead-letter', observer: (e) => events.push(e) });
  db.defer(() => relay.close());
  const stop = new AbortController();
  const running = relay.run(stop.signal);
  const cursorAtEnd = async () => {
    const r = await db.observer.query<{ n: string }>(
      `SELECT count(*) AS n FROM tidemark.cursors c WHERE c.consumer = 'relay' AND c.seq = (SELECT max(seq) FROM tidemark.events e WHERE e.stream = c.stream)`,
    );
    return r.rows[0]!.n === '2';
  };
  await waitFor('both cursors at their stream\'s last event', cursorAtEnd, 60_000);

  const dead = await listDeadLetters(db.pool(), { consumer: 'relay' });
  assert.deepEqual(dead.map((d) => [d.stream, d.seq]), [['orders', refused]], 'the refused event, and only it, is a dead letter');
  assert.match(dead[0]!.lastError, /SinkError SINK_FAILED: http: seq \d+: .* answered 400: .*unknown product/, "its error: the sink's");
  const others = new Map([...all].map(([s, list]) => [s, list.filter((seq) => seq !== refused)]));
  const o = await origin(db);
  checkReceived(receiver, o, others);
  assert.ok(events.some((e) => e.type === 'dead-letter' && e.seq === refused && e.error instanceof SinkError), 'reported as a dead-letter event');
  const retries = events.filter((e) => e.type === 'retry' && e.seq !== undefined).length;
  assert.ok(retries > 300, `the sink's own retries are reported (${retries})`);
  const copies = receiver.requests.length - 3000;
  t.diagnostic(`${receiver.requests.length} requests for 3000 events (${copies} sent again), ${retries} retries reported`);

  // Replayed while the receiver still refuses it: it stays, one try more.
  await replayDeadLetters(db.pool(), { consumer: 'relay' });
  await waitFor('the replay refused', async () => events.some((e) => e.type === 'dead-letter:replay' && e.error !== undefined));
  const again = await listDeadLetters(db.pool(), { consumer: 'relay' });
  assert.equal(again[0]!.attempts, 2);
  assert.equal(again[0]!.replayRequestedAt, null);
  // The receiver takes it now: the replay publishes it and the dead letter is gone.
  refuse.clear();
  await replayDeadLetters(db.pool(), { consumer: 'relay' });
  await waitFor('the dead letter replayed', async () => (await listDeadLetters(db.pool(), { consumer: 'relay' })).length === 0);
  const last = receiver.requests.filter((r) => r.headers['tidemark-seq'] === String(refused) && r.status === 200);
  assert.ok(last.length >= 1, 'published by the replay');
  assert.equal(last[0]!.headers['webhook-id'], `${o}:${refused}`);
  stop.abort();
  await running;
});

test('onRefused stop: the relay stops on the refused event naming its seq, everything before it in its stream delivered', TIMEOUT, async (t) => {
  const db = await testDb(t);
  await write(db, ['s'], 600, 40);
  const all = await seqs(db, 's');
  const refused = all[400]!;
  const receiver = await new Receiver(flaky(new Set([String(refused)]))).start();
  t.after(() => receiver.stop());
  const relay = new Relay(db.pool(), new HttpSink({ url: receiver.url, ...SINK }), { ...FAST, consumer: 'relay', streams: ['s'], batchSize: 100 });
  db.defer(() => relay.close());
  await assert.rejects(relay.run(), (err: unknown) => err instanceof SinkError && err.seq === refused && !err.retryable && /answered 400/.test(err.message));
  const cursor = BigInt((await db.observer.query<{ seq: string }>("SELECT seq FROM tidemark.cursors WHERE consumer = 'relay'")).rows[0]!.seq);
  assert.ok(cursor < refused, 'the cursor stays below the refused event');
  checkReceived(receiver, await origin(db), new Map([['s', all.filter((seq) => seq < refused)]]));
  assert.equal((await listDeadLetters(db.pool(), {})).length, 0);
});

test('tidemark relay --to http://: signed with the secret file, stops on a refusal with one line naming the seq; --on-refused dead-letter goes on', TIMEOUT, async (t) => {
  const db = await testDb(t);
  await write(db, ['s'], 300, 20);
  const all = await seqs(db, 's');
  const refused = all[150]!;
  const receiver = await new Receiver(flaky(new Set([String(refused)]))).start();
  t.after(() => receiver.stop());
  const secretFile = join(tmpdir(), `tidemark-webhook-secret-${process.pid}-${Date.now()}`);
  await writeFile(secretFile, `${SECRET}\n`, { mode: 0o600 });
  const base = ['relay', '--to', receiver.url, '--stream', 's', '--database-url', db.url, '--ack-timeout', '250ms', '--poll', '50ms'];

  const stopped = await cli([...base, '--consumer', 'stop', '--webhook-secret-file', secretFile]);
  assert.equal(stopped.code, 1, stopped.stderr);
  assert.match(stopped.stderr, /publishing to POST http:\/\/127\.0\.0\.1:\d+\/hook, signed/);
  assert.match(stopped.stderr, new RegExp(`relay stopped: http: seq ${refused}: .* answered 400`));
  const stoppedAt = await listDeadLetters(db.pool(), { consumer: 'stop' });
  assert.equal(stoppedAt.length, 0);

  // The same with the secret from the environment and --on-refused dead-letter, in the background until it has relayed everything.
  const { startCli, watchStderr } = await import('../support/cli.js');
  const child = startCli([...base, '--consumer', 'dl', '--on-refused', 'dead-letter'], { env: { TIDEMARK_WEBHOOK_SECRET: SECRET } });
  const stderr = watchStderr(child);
  t.after(() => child.kill('SIGKILL'));
  await stderr.next(new RegExp(`seq ${refused} refused \\(.*answered 400.*\\); recorded as dead letter \\d+, going on`));
  await waitFor('the cursor at the last event', async () => {
    const r = await db.observer.query<{ seq: string }>("SELECT seq FROM tidemark.cursors WHERE consumer = 'dl'");
    return r.rows[0]?.seq === String(all.at(-1));
  });
  child.kill('SIGTERM');
  await new Promise((resolve) => child.once('exit', resolve));
  assert.deepEqual((await listDeadLetters(db.pool(), { consumer: 'dl' })).map((d) => d.seq), [refused]);
  checkReceived(receiver, await origin(db), new Map([['s', all.filter((seq) => seq !== refused)]]));
});

test('tidemark relay --to http:// refuses flags of other destinations, a bad --on-refused, and an unreadable secret file, before connecting', async () => {
  const base = ['relay', '--to', 'https://hooks.example.com/in', '--consumer', 'c', '--stream', 's', '--database-url', 'postgres://nobody@127.0.0.1:1/x'];
  const subject = await cli([...base, '--subject', 'x']);
  assert.equal(subject.code, 2);
  assert.match(subject.stderr, /--subject: applies to nats:\/\/ destinations, not https:\/\//);
  const onRefused = await cli([...base, '--on-refused', 'skip']);
  assert.match(onRefused.stderr, /--on-refused: expected stop or dead-letter, got "skip"/);
  const file = await cli([...base, '--webhook-secret-file', '/nonexistent/secret']);
  assert.match(file.stderr, /--webhook-secret-file: cannot read "\/nonexistent\/secret" \(ENOENT\)/);
  const short = await cli([...base], { env: { TIDEMARK_WEBHOOK_SECRET: 'short' } });
  assert.match(short.stderr, /TIDEMARK_WEBHOOK_SECRET: the key is 5 bytes/);
  assert.ok(!short.stderr.includes('short"'));
  const amqp = await cli(['relay', '--to', 'amqp://guest:guest@127.0.0.1:1/', '--consumer', 'c', '--stream', 's', '--concurrency', '4', '--database-url', 'postgres://nobody@127.0.0.1:1/x']);
  assert.match(amqp.stderr, /--concurrency: applies to http\(s\):\/\/ destinations, not amqp:\/\//);
});
