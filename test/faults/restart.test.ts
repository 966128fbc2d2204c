/**
 * A PostgreSQL restart under load, on a private server: four writers
 * append, `tidemark serve` publishes, and two tailers follow the stream (a
 * CLI `tail --json` in follow mode, and an in-process `StreamClient.tail`
 * whose handler writes its effects in the page's transaction). The server
 * is restarted, fast (clean shutdown) or immediate (crash recovery), while
 * all of them run. Nobody restarts anything but the server: every
 * committed event must still reach both tailers exactly once, in seq
 * order, and serve and the CLI tail must still be running.
 *
 * Writers see errors during the restart and append again; an append that
 * failed on a lost connection may or may not have committed, so what was
 * written is read from the events table, never counted by the writers.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { test, type TestContext } from 'node:test';
import pg from 'pg';
import { createPool, StreamClient, type ConsumerEvent } from '../../src/index.js';
import { startCli, watchStderr } from '../support/cli.js';
import { waitFor } from '../support/db.js';
import {
  alive,
  collectNdjson,
  committedSeqs,
  effectHandler,
  checkDeliveries,
  describeError,
  describeRetries,
  effectSeqs,
  EFFECTS_TABLE_SQL,
  EXACTLY_ONCE,
  firstAfter,
  ms,
  startWriters,
  stderrLine,
  stopChild,
  timedLines,
} from '../support/faults.js';
import { startPrivatePg, type RestartMode } from '../support/private-pg.js';

/** Events both tailers deliver before the restart, and appends committed after it before writers stop. */
const BEFORE = 100;
const AFTER = 200;

async function restartScenario(t: TestContext, mode: RestartMode): Promise<void> {
  const server = await startPrivatePg();
  const cleanup: (() => Promise<unknown>)[] = [];
  t.after(async () => {
    for (const fn of cleanup.reverse()) await fn().catch(() => undefined);
    await server.stop();
  });
  const observer = async <T>(fn: (c: pg.Client) => Promise<T>): Promise<T> => {
    // A connection per look: the server goes away under long-lived ones.
    const c = new pg.Client({ connectionString: server.url });
    c.on('error', () => undefined);
    await c.connect();
    try {
      return await fn(c);
    } finally {
      await c.end().catch(() => undefined);
    }
  };
  await observer((c) => c.query(EFFECTS_TABLE_SQL));

  // serve (the watermarker) and a CLI tail in follow mode, as child processes.
  const serve = startCli(['serve', '--roles', 'watermarker', '--owner', 'serve-a', '--database-url', server.url]);
  cleanup.push(() => stopChild(serve));
  const serveLog = watchStderr(serve);
  const serveLines = timedLines(serve.stderr!);
  const cliTail = startCli(['tail', '--consumer', 'c', '--stream', 's', '--json', '--database-url', server.url]);
  cleanup.push(() => stopChild(cliTail));
  const cliLog = watchStderr(cliTail);
  const cliLines = timedLines(cliTail.stderr!);
  const cli = collectNdjson(cliTail);
  await stderrLine(serve, serveLog, /lease acquired: active/, 30_000);

  // The in-process tailer: effects and cursor commit together.
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
  const writers = startWriters(writerPool, { count: 4 });
  cleanup.push(() => writers.stop());

  const running = () => {
    if (!alive(serve)) throw new Error(`serve exited (${serve.exitCode ?? serve.signalCode}):\n${serveLog.text()}`);
    if (!alive(cliTail)) throw new Error(`the CLI tail exited (${cliTail.exitCode ?? cliTail.signalCode}):\n${cliLog.text()}`);
    if (libraryEnded !== undefined) throw new Error('StreamClient.tail ended', { cause: libraryEnded });
  };
  const libraryCount = () => observed.reduce((n, o) => n + (o.event.type === 'page' ? o.event.delivered : 0), 0);
  await waitFor(
    `both tailers to deliver ${BEFORE} events`,
    async () => {
      running();
      return cli.seqs.length >= BEFORE && libraryCount() >= BEFORE;
    },
    30_000,
  );

  // The restart, with everything running.
  const cliBefore = cli.seqs.length;
  const times = await server.restart(mode);
  let committed: bigint[] = [];
  try {
    await waitFor(`${AFTER} appends to commit after the restart`, async () => writers.okSince(times.acceptedAt) >= AFTER, 30_000);
    await writers.stop();

    committed = await observer((c) => committedSeqs(c));
    await waitFor(
      `both tailers to deliver all ${committed.length} committed events`,
      async () => {
        running();
        const effects = await observer((c) => c.query<{ n: string }>(`SELECT count(DISTINCT seq) AS n FROM public.fault_effects WHERE consumer = 'lib'`));
        return new Set(cli.seqs).size >= committed.length && Number(effects.rows[0]!.n) >= committed.length;
      },
      45_000,
    );
    running();

    assert.deepEqual(checkDeliveries(cli.seqs, committed), EXACTLY_ONCE, 'the CLI tail printed every committed event once, in seq order');
    assert.deepEqual(cli.junk, [], 'the CLI tail printed nothing but events on stdout');
    const effects = await observer((c) => effectSeqs(c, 'lib'));
    assert.deepEqual(checkDeliveries(effects, committed), EXACTLY_ONCE, 'StreamClient.tail applied every committed event once, in seq order');
    assert.ok(alive(serve), 'serve is still running');
    assert.ok(alive(cliTail), 'the CLI tail is still running');
  } finally {
    // Figures: reported, not judged (and reported when an assertion failed).
    const libraryDeliveries = observed.filter((o) => o.event.type === 'page' && o.event.delivered > 0).map((o) => o.at);
    t.diagnostic(`${mode} restart: server down for ${ms(times.acceptedAt - times.stopIssuedAt)} (stop issued to accepting again)`);
    // From the instant the server answered the test's poll to the first
    // delivery after the server was down (taken from the instant it stopped,
    // so a tailer quicker than the poll is not missed: then it is negative).
    const recovery = (deliveries: readonly number[]) => {
      const first = firstAfter(deliveries, times.stoppedAt);
      return first === undefined ? undefined : first - times.acceptedAt;
    };
    t.diagnostic(`recovery, accepting again -> first delivery after it: CLI tail ${ms(recovery(cli.times))}, StreamClient.tail ${ms(recovery(libraryDeliveries))}`);
    t.diagnostic(
      `${committed.length} events committed, ${cli.seqs.length} lines printed (${cliBefore} before the restart); ` +
        `writers: ${writers.ok} appends returned, ${writers.errors} failed (${[...writers.errorCodes].map(([c, n]) => `${c}: ${n}`).join(', ')})`,
    );
    t.diagnostic(`StreamClient retries (times from accepting again):\n${describeRetries(observed, times.acceptedAt).join('\n')}\nonError: ${errors.map(describeError).join('; ')}`);
    t.diagnostic(`serve stderr from the restart on (times from accepting again):\n${serveLines.since(times.stopIssuedAt, times.acceptedAt)}`);
    t.diagnostic(`CLI tail stderr from the restart on (times from accepting again):\n${cliLines.since(times.stopIssuedAt, times.acceptedAt)}`);
  }
}

test('a fast restart under load: both tailers deliver every committed event once, in order; serve and the CLI tail keep running', async (t) => {
  await restartScenario(t, 'fast');
});

test('an immediate restart (crash recovery) under load: both tailers deliver every committed event once, in order; serve and the CLI tail keep running', async (t) => {
  await restartScenario(t, 'immediate');
});
