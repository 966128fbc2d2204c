/**
 * An operator's `BEGIN; SELECT * FROM tidemark.watermark FOR UPDATE`, held
 * for 5 s while writers write and a tailer tails. The watermarker cannot
 * publish or renew its lease meanwhile (both write that row): its step
 * gives up on the row lock after 200 ms with 55P03 and the loop retries.
 * It must say so and keep running, and once the operator commits, safe_seq
 * catches up and the tailer delivers everything exactly once.
 *
 * That the watermarker waits on the operator is observed in pg_locks
 * (pg_blocking_pids), not assumed from the hold's length; the 5 s hold is
 * the scenario, not the pass criterion.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, test, type TestContext } from 'node:test';
import { StreamClient, Watermarker, type ConsumerEvent, type WatermarkerEvent } from '../../src/index.js';
import { startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, safeSeq, testDb, waitFor, type Session, type TestDb } from '../support/db.js';
import {
  alive,
  checkDeliveries,
  committedSeqs,
  effectHandler,
  effectSeqs,
  EFFECTS_TABLE_SQL,
  EXACTLY_ONCE,
  errorCode,
  ms,
  startWriters,
  stderrLine,
  stopChild,
  type Writers,
} from '../support/faults.js';

after(closeAdmin);

const HOLD_MS = 5000;

/** The in-process tailer, with what it reported. */
function startTailer(db: TestDb) {
  const observed: { at: number; event: ConsumerEvent }[] = [];
  const client = new StreamClient(db.pool({ max: 4, application_name: 'fault-tailer' }), {
    observer: (event) => void observed.push({ at: performance.now(), event }),
  });
  const stop = new AbortController();
  let ended: unknown;
  const done = client.tail('lib', 's', effectHandler('lib'), { signal: stop.signal }).catch((err: unknown) => {
    if (!stop.signal.aborted) ended = err ?? new Error('tail ended');
  });
  db.defer(async () => {
    stop.abort();
    await done;
    await client.close();
  });
  return {
    observed,
    delivered: () => observed.reduce((n, o) => n + (o.event.type === 'page' ? o.event.delivered : 0), 0),
    check: () => {
      if (ended !== undefined) throw new Error('StreamClient.tail ended', { cause: ended });
    },
  };
}

/** Backends of a watermarker loop (application_name tidemark-watermarker) that `holder` blocks. */
async function blockedWatermarkers(observer: Session, holder: number): Promise<number[]> {
  const r = await observer.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND application_name = 'tidemark-watermarker' AND $1 = ANY(pg_catalog.pg_blocking_pids(pid))`,
    [holder],
  );
  return r.rows.map((row) => row.pid);
}

/**
 * The scenario around `roles`: writers and the tailer run; the operator
 * takes the row; the hold lasts until the watermarker was seen waiting on
 * it and `reported()` is true, and at least HOLD_MS (at most 20 s); then the
 * operator commits, writers append a little more and stop, and safe_seq
 * and the tailer must catch up with every committed event.
 */
async function rowLockedScenario(
  t: TestContext,
  db: TestDb,
  roles: { check: () => void; beforeLock?: () => void; reported: (lockedAt: number) => boolean },
): Promise<{ lockedAt: number; sawWaiterAt: number | undefined; releasedAt: number; caughtUpAt: number; writers: Writers }> {
  const { observer } = db;
  const tailer = startTailer(db);
  const writers = startWriters(db.pool({ max: 4, application_name: 'fault-writers' }), { count: 4 });
  db.defer(() => writers.stop());
  const check = () => {
    roles.check();
    tailer.check();
  };
  await waitFor(
    'the tailer to deliver 50 events',
    async () => {
      check();
      return tailer.delivered() >= 50;
    },
    30_000,
  );

  const operator = await db.session('operator');
  roles.beforeLock?.();
  await operator.query('BEGIN');
  await operator.query('SELECT * FROM tidemark.watermark FOR UPDATE');
  const lockedAt = performance.now();
  const heldSafeSeq = await safeSeq(observer);
  let sawWaiterAt: number | undefined;
  await waitFor(
    'the watermarker to wait on the operator and report it',
    async () => {
      check();
      if (sawWaiterAt === undefined && (await blockedWatermarkers(observer, operator.pid)).length > 0) sawWaiterAt = performance.now();
      return sawWaiterAt !== undefined && roles.reported(lockedAt) && performance.now() - lockedAt >= HOLD_MS;
    },
    20_000,
  );
  assert.equal(await safeSeq(observer), heldSafeSeq, 'nothing was published while the operator held the row');
  await operator.query('COMMIT');
  const releasedAt = performance.now();

  await waitFor('50 appends to commit after the operator let go', async () => writers.okSince(releasedAt) >= 50, 30_000);
  await writers.stop();
  const committed = await committedSeqs(observer);
  const last = committed.at(-1)!;
  let caughtUpAt: number | undefined;
  await waitFor(
    `safe_seq to reach ${last} and the tailer to deliver all ${committed.length} events`,
    async () => {
      check();
      if ((await safeSeq(observer)) >= last) caughtUpAt ??= performance.now();
      const effects = await observer.query<{ n: string }>(`SELECT count(DISTINCT seq) AS n FROM public.fault_effects WHERE consumer = 'lib'`);
      return caughtUpAt !== undefined && Number(effects.rows[0]!.n) >= committed.length;
    },
    30_000,
  );
  check();
  assert.deepEqual(checkDeliveries(await effectSeqs(observer, 'lib'), committed), EXACTLY_ONCE, 'the tailer applied every committed event once, in seq order');
  t.diagnostic(`${committed.length} events; writers: ${writers.ok} appends, ${writers.errors} failures`);
  return { lockedAt, sawWaiterAt, releasedAt, caughtUpAt: caughtUpAt!, writers };
}

test('the watermark row locked FOR UPDATE by an operator for 5 s: the watermarker reports 55P03 and keeps running; afterwards safe_seq catches up and the tail delivers everything once', async (t) => {
  const db = await testDb(t);
  await db.observer.query(EFFECTS_TABLE_SQL);
  const errors: { at: number; err: unknown }[] = [];
  const events: { at: number; event: WatermarkerEvent }[] = [];
  const wm = new Watermarker(db.pool({ max: 3 }), {
    owner: 'wm-a',
    onError: (err) => void errors.push({ at: performance.now(), err }),
    observer: (event) => void events.push({ at: performance.now(), event }),
  });
  const stop = new AbortController();
  let runEnded: unknown;
  const run = wm.run(stop.signal).then(
    () => (runEnded ??= new Error('run() resolved before it was stopped')),
    (err: unknown) => (runEnded ??= err),
  );
  db.defer(async () => {
    stop.abort();
    await run;
    await wm.close();
  });
  const lockErrors = (since: number) => errors.filter((e) => e.at > since && errorCode(e.err) === '55P03');

  const r = await rowLockedScenario(t, db, {
    check: () => {
      if (runEnded !== undefined) throw new Error('Watermarker.run() ended', { cause: runEnded });
    },
    reported: (lockedAt) => lockErrors(lockedAt).length > 0,
  });

  const reports = lockErrors(r.lockedAt).filter((e) => e.at < r.releasedAt);
  assert.ok(reports.length > 0, 'onError received the row lock timeout (55P03) while the operator held the row');
  const retries = events.filter((e) => e.event.type === 'retry' && e.at > r.lockedAt && e.at < r.releasedAt);
  assert.ok(retries.length > 0, "the observer saw the loop's retries while the row was held");
  assert.equal(runEnded, undefined, 'run() is still running');
  t.diagnostic(
    `operator held the row ${ms(r.releasedAt - r.lockedAt)}; watermarker seen waiting on it after ${ms(r.sawWaiterAt === undefined ? undefined : r.sawWaiterAt - r.lockedAt)}; ` +
      `first 55P03 report after ${ms(reports[0]!.at - r.lockedAt)}; ${reports.length} reports, ${retries.length} retries while held ` +
      `(codes: ${[...new Set(errors.filter((e) => e.at > r.lockedAt && e.at < r.releasedAt).map((e) => errorCode(e.err) ?? 'none'))].join(', ')})`,
  );
  t.diagnostic(`safe_seq caught up ${ms(r.caughtUpAt - r.releasedAt)} after the commit`);
});

test('the watermark row locked FOR UPDATE for 5 s under `tidemark serve`: serve keeps running and logs the failed runs; afterwards safe_seq catches up', async (t) => {
  const db = await testDb(t);
  await db.observer.query(EFFECTS_TABLE_SQL);
  const serve = startCli(['serve', '--roles', 'watermarker', '--owner', 'serve-a', '--database-url', db.url]);
  db.defer(() => stopChild(serve));
  const log = watchStderr(serve);
  await stderrLine(serve, log, /lease acquired: active/, 30_000);
  let logAt = 0;
  const watermarkerLines = () => log.text().slice(logAt).split('\n').filter((l) => /watermarker: /.test(l));

  const r = await rowLockedScenario(t, db, {
    check: () => {
      if (!alive(serve)) throw new Error(`serve exited (${serve.exitCode ?? serve.signalCode}):\n${log.text()}`);
    },
    beforeLock: () => (logAt = log.text().length),
    reported: () => watermarkerLines().length > 0,
  });
  assert.ok(alive(serve), 'serve is still running');
  const lines = watermarkerLines();
  assert.ok(lines.length > 0, 'serve logged the watermarker failing while the operator held the row');
  t.diagnostic(`operator held the row ${ms(r.releasedAt - r.lockedAt)}; serve's watermarker seen waiting after ${ms(r.sawWaiterAt === undefined ? undefined : r.sawWaiterAt - r.lockedAt)}; safe_seq caught up ${ms(r.caughtUpAt - r.releasedAt)} after the commit`);
  t.diagnostic(`serve stderr while held and after:\n${lines.join('\n')}`);
});
