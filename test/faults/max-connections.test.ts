/**
 * max_connections exhausted while everything runs, on a private server
 * with 20 connection slots: the test takes every free slot, then ends the
 * roles' sessions (serve's watermarker, the in-process tailer) and takes
 * their slots too, so every reconnect they try meets 53300 "too many
 * clients". Writers open a connection per append and fail the same way.
 * Once the test lets go, the roles must come back by themselves: safe_seq
 * reaches the last committed event and the tailer delivers everything
 * exactly once.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import pg from 'pg';
import { createPool, StreamClient, type ConsumerEvent } from '../../src/index.js';
import { startCli, watchStderr } from '../support/cli.js';
import { waitFor } from '../support/db.js';
import {
  alive,
  checkDeliveries,
  committedSeqs,
  effectHandler,
  describeError,
  describeRetries,
  effectSeqs,
  EFFECTS_TABLE_SQL,
  EXACTLY_ONCE,
  errorCode,
  firstAfter,
  ms,
  startWriters,
  stderrLine,
  stopChild,
  timedLines,
} from '../support/faults.js';
import { startPrivatePg } from '../support/private-pg.js';

const MAX_CONNECTIONS = 20;

test('max_connections exhausted while running: writers fail, the roles retry and recover once slots free up; nothing is lost or repeated', async (t) => {
  const server = await startPrivatePg({ settings: { max_connections: MAX_CONNECTIONS, superuser_reserved_connections: 1 } });
  const cleanup: (() => Promise<unknown>)[] = [];
  t.after(async () => {
    for (const fn of cleanup.reverse()) await fn().catch(() => undefined);
    await server.stop();
  });
  const connect = async (name: string): Promise<pg.Client> => {
    const c = new pg.Client({ connectionString: server.url, application_name: name });
    c.on('error', () => undefined);
    try {
      await c.connect();
    } catch (err) {
      await c.end().catch(() => undefined);
      throw err;
    }
    return c;
  };
  const observer = await connect('fault-observer');
  cleanup.push(() => observer.end());
  await observer.query(EFFECTS_TABLE_SQL);

  const serve = startCli(['serve', '--roles', 'watermarker', '--owner', 'serve-a', '--database-url', server.url]);
  cleanup.push(() => stopChild(serve));
  const serveLog = watchStderr(serve);
  const serveLines = timedLines(serve.stderr!);
  await stderrLine(serve, serveLog, /lease acquired: active/, 30_000);

  const pool = createPool({ connectionString: server.url, max: 4, application_name: 'fault-tailer' });
  cleanup.push(() => pool.end());
  const observed: { at: number; event: ConsumerEvent }[] = [];
  const errors: unknown[] = [];
  const client = new StreamClient(pool, { observer: (event) => void observed.push({ at: performance.now(), event }), onError: (err) => void errors.push(err) });
  const stop = new AbortController();
  let libraryEnded: unknown;
  const libraryTail = client.tail('lib', 's', effectHandler('lib'), { signal: stop.signal }).catch((err: unknown) => {
    if (!stop.signal.aborted) libraryEnded = err ?? new Error('tail ended');
  });
  cleanup.push(async () => {
    stop.abort();
    await libraryTail;
    await client.close();
  });

  const writerPool = createPool({ connectionString: server.url, max: 4, application_name: 'fault-writers' });
  cleanup.push(() => writerPool.end());
  const writers = startWriters(writerPool, { count: 4, freshConnection: true });
  cleanup.push(() => writers.stop());

  const running = () => {
    if (!alive(serve)) throw new Error(`serve exited (${serve.exitCode ?? serve.signalCode}):\n${serveLog.text()}`);
    if (libraryEnded !== undefined) throw new Error('StreamClient.tail ended', { cause: libraryEnded });
  };
  const delivered = () => observed.reduce((n, o) => n + (o.event.type === 'page' ? o.event.delivered : 0), 0);
  await waitFor(
    'the tailer to deliver 50 events',
    async () => {
      running();
      return delivered() >= 50;
    },
    30_000,
  );

  // Take every free slot. Writers release theirs after each append and
  // wait before trying again, so the test ends up with all of them: it
  // stops after ten refusals in a row. While the test holds the slots,
  // `grab` keeps taking any slot that frees up.
  const hogs: pg.Client[] = [];
  cleanup.push(() => Promise.all(hogs.map((h) => h.end().catch(() => undefined))));
  const exhaust = async () => {
    for (let refusals = 0; refusals < 10; ) {
      try {
        hogs.push(await connect('fault-hog'));
        refusals = 0;
      } catch (err) {
        if (errorCode(err) !== '53300') throw err;
        refusals += 1;
      }
    }
  };
  let holding = true;
  const grab = async () => {
    while (holding) {
      try {
        hogs.push(await connect('fault-hog'));
      } catch (err) {
        if (errorCode(err) !== '53300') throw err;
        await delay(5);
      }
    }
  };
  const serveLogAt = serveLog.text().length;
  const exhaustedAt = performance.now();
  const writerRefusalsBefore = writers.errorCodes.get('53300') ?? 0;
  await exhaust();
  const ours = [(observer as unknown as { processID: number }).processID, ...hogs.map((h) => (h as unknown as { processID: number }).processID)];
  // End the roles' sessions (waiting until each has exited and freed its
  // slot), and take those slots too: every reconnect now meets 53300.
  const ended = await observer.query<{ pid: number; application_name: string }>(
    `WITH victims AS MATERIALIZED (
       SELECT pid, application_name FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> ALL($1::int[])
     )
     SELECT pid, application_name FROM victims WHERE pg_terminate_backend(pid, 5000)`,
    [ours],
  );
  const terminatedAt = performance.now();
  const grabbing = grab();
  cleanup.push(async () => {
    holding = false;
    await grabbing;
  });

  // Hold while writers keep failing and the roles try to reconnect, for at
  // least 3 s after their sessions ended (several back-off rounds), at
  // most 10 s (the assertions below say whether a retry was reported).
  const libraryRetries = () => observed.filter((o) => (o.event as { type: string }).type === 'retry');
  // serve logs one line per retry of the watermarker: `watermarker: <what failed>; retrying in N ms`.
  const serveRetries = () => serveLog.text().slice(serveLogAt).split('\n').filter((l) => /watermarker: .*retrying in \d+ ms/.test(l));
  await waitFor(
    'writers to be refused 20 times and a role to report a retry, 3 s at least',
    async () => {
      running();
      const refused = (writers.errorCodes.get('53300') ?? 0) - writerRefusalsBefore >= 20;
      const libraryRefused = libraryRetries().some((o) => errorCode((o.event as { error?: unknown }).error) === '53300');
      return refused && (libraryRefused || serveRetries().length >= 2) && performance.now() - terminatedAt >= 3000;
    },
    10_000,
  ).catch(() => undefined);
  holding = false;
  await grabbing;
  const heldMs = performance.now() - exhaustedAt;
  const heldSlots = hogs.length;
  const writerRefusals = (writers.errorCodes.get('53300') ?? 0) - writerRefusalsBefore;

  const releasedAt = performance.now();
  await Promise.all(hogs.splice(0).map((h) => h.end().catch(() => undefined)));
  await waitFor('50 appends to commit after the release', async () => writers.okSince(releasedAt) >= 50, 30_000);
  await writers.stop();
  const writersStoppedAt = performance.now();

  const committed = await committedSeqs(observer);
  const last = committed.at(-1)!;
  let publishedAt: number | undefined;
  await waitFor(
    `safe_seq to reach ${last} and the tailer to deliver all ${committed.length} events`,
    async () => {
      running();
      const safe = BigInt((await observer.query<{ s: string }>('SELECT safe_seq AS s FROM tidemark.watermark')).rows[0]!.s);
      if (safe >= last) publishedAt ??= performance.now();
      const effects = await observer.query<{ n: string }>(`SELECT count(DISTINCT seq) AS n FROM public.fault_effects WHERE consumer = 'lib'`);
      return safe >= last && Number(effects.rows[0]!.n) >= committed.length;
    },
    45_000,
  );
  running();

  assert.ok(writerRefusals > 0, 'writers were refused connections while the slots were held');
  assert.deepEqual(checkDeliveries(await effectSeqs(observer, 'lib'), committed), EXACTLY_ONCE, 'the tailer applied every committed event once, in seq order');
  assert.ok(alive(serve), 'serve is still running');
  const retries = libraryRetries();
  const watermarkerRetries = serveRetries();
  assert.ok(retries.length + watermarkerRetries.length >= 1, 'the tailer or the watermarker reported a retry');

  const libraryDeliveries = observed.filter((o) => o.event.type === 'page' && o.event.delivered > 0).map((o) => o.at);
  t.diagnostic(`max_connections ${MAX_CONNECTIONS}: the test held ${heldSlots} slots for ${ms(heldMs)}; ended ${ended.rows.length} role sessions (${ended.rows.map((r) => r.application_name).join(', ')})`);
  t.diagnostic(`writers: ${writerRefusals} appends refused with 53300 while held; all failures: ${[...writers.errorCodes].map(([c, n]) => `${c}: ${n}`).join(', ')}`);
  t.diagnostic(`StreamClient retries: ${retries.length} (times from the release); onError: ${errors.map(describeError).join('; ')}\n${describeRetries(observed, releasedAt).join('\n')}`);
  t.diagnostic(`serve (watermarker) retries: ${watermarkerRetries.length}; its stderr from the exhaustion on (times from the release):\n${serveLines.since(exhaustedAt, releasedAt)}`);
  const firstDelivery = firstAfter(libraryDeliveries, releasedAt);
  t.diagnostic(`after the release: first delivery ${ms(firstDelivery === undefined ? undefined : firstDelivery - releasedAt)}, writers stopped at ${ms(writersStoppedAt - releasedAt)} (50 more appends, a connection each), safe_seq reached the last committed event ${ms(publishedAt === undefined ? undefined : publishedAt - writersStoppedAt)} after that`);
});
