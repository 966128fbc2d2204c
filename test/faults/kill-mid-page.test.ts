/**
 * SIGKILL of a tailer process in the middle of a page: after its handler
 * wrote an effect in the page's transaction and before the page commits.
 * The effects of that page and its cursor move are one transaction, so
 * both must be absent; a consumer started again delivers each event
 * exactly once. The moment is scripted: the child's handler reports its
 * backend pid and waits; the parent sees in pg_stat_activity / pg_locks
 * that the session sits idle in its transaction holding the effect insert,
 * then kills it.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker } from '../../src/index.js';
import { exited } from '../support/cli.js';
import { closeAdmin, testDb, waitFor, type Session } from '../support/db.js';
import { alive, committedSeqs, effectSeqs, EFFECTS_TABLE_SQL, startFixture, stopChild, type FixtureProcess } from '../support/faults.js';

after(closeAdmin);

const fixture = new URL('./fixtures/block-in-handler.ts', import.meta.url).pathname;

/** Starts the fixture tailer; its stdout lines are collected. */
function startTailer(args: string[]): FixtureProcess {
  return startFixture(fixture, args);
}

async function cursor(observer: Session, consumer: string): Promise<bigint | undefined> {
  const r = await observer.query<{ seq: string }>(`SELECT seq FROM tidemark.cursors WHERE consumer = $1 AND stream = 's'`, [consumer]);
  return r.rows[0] ? BigInt(r.rows[0].seq) : undefined;
}

test('SIGKILL between the handler writes and the commit: neither the effects nor the cursor of that page survive; a restarted consumer delivers each event once', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  await observer.query(EFFECTS_TABLE_SQL);
  // 35 events, all published before the tailer starts: pages of 10 are
  // then seqs 1-10, 11-20, 21-30, 31-35 (as positions in the stream).
  await observer.query(`INSERT INTO tidemark.events (stream, kind, key) SELECT 's', 'k', 'x' || i FROM generate_series(1, 35) i`);
  const seqs = await committedSeqs(observer);
  const wm = new Watermarker(db.pool({ max: 1 }));
  assert.equal((await wm.step()).safeSeq, seqs.at(-1));
  await wm.close();
  const blockAt = seqs[24]!; // the fifth event of the third page

  // Scripted: the child writes effects for 21..25 in its third page, then
  // reports its backend and waits inside the open transaction.
  const first = startTailer([db.url, 'mid', 's', '10', blockAt.toString()]);
  db.defer(() => stopChild(first.child));
  const line = await waitFor(
    'the child tailer to block in its handler',
    async () => {
      if (!alive(first.child)) throw new Error(`the child tailer exited (${first.child.exitCode ?? first.child.signalCode}):\n${first.stderr()}`);
      return first.lines.find((l) => l.startsWith('blocked '));
    },
    30_000,
  );
  const pid = Number(line.split(' ')[2]);
  assert.equal(line.split(' ')[1], blockAt.toString());
  await waitFor('the page session to sit idle in its transaction, holding the effect insert', async () => {
    const r = await observer.query(
      `SELECT 1 FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
        WHERE a.pid = $1 AND a.state = 'idle in transaction'
          AND l.relation = 'public.fault_effects'::regclass AND l.mode = 'RowExclusiveLock' AND l.granted`,
      [pid],
    );
    return r.rowCount === 1;
  });
  // Seen from outside, only the committed pages' effects exist so far.
  assert.deepEqual(await effectSeqs(observer, 'mid'), seqs.slice(0, 20));

  first.child.kill('SIGKILL');
  assert.equal(await exited(first.child), 'SIGKILL');
  await waitFor('the killed tailer session to end', async () => {
    const r = await observer.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid]);
    return r.rowCount === 0;
  });

  // Both absent for the killed page: the cursor stayed at the last
  // committed page, and no effect of the page past it exists.
  const after = await cursor(observer, 'mid');
  assert.equal(after, seqs[19], 'the cursor stays at the end of the last committed page');
  const effects = await effectSeqs(observer, 'mid');
  assert.deepEqual(effects, seqs.filter((s) => s <= after!), 'effects exist exactly for the events at or below the cursor');

  // A consumer started again delivers the rest, each event exactly once.
  const second = startTailer([db.url, 'mid', 's', '10']);
  db.defer(() => stopChild(second.child));
  await waitFor(
    'the restarted tailer to reach the last event',
    async () => {
      if (!alive(second.child)) throw new Error(`the restarted tailer exited (${second.child.exitCode ?? second.child.signalCode}):\n${second.stderr()}`);
      return (await cursor(observer, 'mid')) === seqs.at(-1);
    },
    30_000,
  );
  await stopChild(second.child);
  assert.equal(second.child.exitCode, 0, `the restarted tailer stops cleanly on SIGTERM:\n${second.stderr()}`);
  assert.deepEqual(await effectSeqs(observer, 'mid'), seqs, 'every event applied exactly once, in seq order');
});
