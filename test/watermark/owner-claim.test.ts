import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { OwnerInUseError, Watermarker } from '../../src/index.js';
import { closeAdmin, insertEvent, safeSeq, testDb, waitFor, waitUntilWaiting, type TestDb } from '../support/db.js';

after(closeAdmin);

async function state(db: TestDb): Promise<{ leaseOwner: string | null; claim: { instance: string; claimed_at: Date; expires_at: Date } | undefined }> {
  const lease = await db.observer.query(`SELECT lease_owner FROM tidemark.watermark`);
  const claim = await db.observer.query(`SELECT instance, claimed_at, expires_at FROM tidemark.owner_claims WHERE owner = 'same'`);
  return { leaseOwner: lease.rows[0].lease_owner, claim: claim.rows[0] };
}

/** Another process's live claim of `owner`, with its lease, kept renewed by the test until `stop()`: what a second serve sees. */
async function liveOtherProcess(db: TestDb, owner = 'same'): Promise<{ instance: string; stop: () => Promise<void> }> {
  const instance = 'elsewhere:4242:0badc0de';
  await db.observer.query(
    `UPDATE tidemark.watermark SET lease_owner = $1, lease_expires_at = clock_timestamp() + interval '3 s';
     INSERT INTO tidemark.owner_claims (owner, instance, claimed_at, expires_at) VALUES ($1, $2, clock_timestamp(), clock_timestamp() + interval '3 s')`
      .replace('$1', `'${owner}'`).replace('$1', `'${owner}'`).replace('$2', `'${instance}'`),
  );
  let renewing = true;
  const renewer = (async () => {
    while (renewing) {
      await db.observer.query(`UPDATE tidemark.owner_claims SET expires_at = clock_timestamp() + interval '3 s' WHERE instance = $1`, [instance]);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  })().catch(() => undefined); // the test's database goes first when the test failed
  return { instance, stop: async () => ((renewing = false), await renewer) };
}

test('another live process\'s owner is refused: step() at once, run() once it sees the claim renewed; nothing runs, and close() leaves its lease and claim', async (t) => {
  const db = await testDb(t);
  const other = await liveOtherProcess(db);
  const options = { owner: 'same', leaseTtlMs: 3000, leaseRenewMs: 900, summaryIntervalMs: 300 };
  const events: string[] = [];
  const mine = new Watermarker(db.pool(), { ...options, observer: (event) => void events.push(event.type) });
  await assert.rejects(mine.step(), (err: unknown) => err instanceof OwnerInUseError && err.owner === 'same' && err.holder === other.instance && err.code === 'OWNER_IN_USE');
  assert.equal(mine.isLeader, false);
  await assert.rejects(mine.run(new AbortController().signal), (err: unknown) => {
    assert.ok(err instanceof OwnerInUseError);
    assert.equal(err.holder, other.instance);
    assert.match(err.message, /^owner "same" is in use by another live watermarker \(instance elsewhere:4242:0badc0de, claimed since \S+\); give each process its own owner, or stop the other$/);
    return true;
  });
  assert.deepEqual(events, [], 'the refused process never ran the loop');
  await mine.close();
  const after = await state(db);
  assert.equal(after.leaseOwner, 'same', 'close() left the other process\'s lease');
  assert.equal(after.claim?.instance, other.instance, 'and its claim');
  await other.stop();
});

test('the fence: once another process has claimed the owner, this one writes nothing more (no publication), and its next claim is refused; run() is refused too', async (t) => {
  const db = await testDb(t);
  const options = { owner: 'same', leaseTtlMs: 3000, leaseRenewMs: 900, summaryIntervalMs: 300 };
  const mine = new Watermarker(db.pool(), options);
  assert.equal((await mine.step()).leader, true);
  assert.equal((await state(db)).claim?.instance, mine.instance);
  // What a process stalled past its claim meets: another process took the claim meanwhile.
  const instance = 'elsewhere:4242:0badc0de';
  await db.observer.query(`UPDATE tidemark.owner_claims SET instance = $1, claimed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '3 s'`, [instance]);
  await insertEvent(await db.session('writer'));
  // Within leaseRenewMs this process does not claim again before stepping: the fence alone refuses the publication.
  await assert.rejects(mine.step(), (err: unknown) => (err as { code?: string }).code === '55006' && /owner same is claimed by another live watermarker instance/.test(String(err)));
  assert.equal(await safeSeq(db.observer), 0n, 'the fenced step published nothing');
  assert.equal(mine.isLeader, false);
  await assert.rejects(mine.step(), (err: unknown) => err instanceof OwnerInUseError && err.holder === instance);

  let renewing = true;
  const renewer = (async () => {
    while (renewing) {
      await db.observer.query(`UPDATE tidemark.owner_claims SET expires_at = clock_timestamp() + interval '3 s' WHERE instance = $1`, [instance]);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  })().catch(() => undefined);
  await assert.rejects(mine.run(new AbortController().signal), (err: unknown) => err instanceof OwnerInUseError && err.holder === instance);
  renewing = false;
  await renewer;
  assert.equal(await safeSeq(db.observer), 0n);
  await mine.close();
  assert.equal((await state(db)).claim?.instance, instance);
});

test('the claim of an instance that died is taken over once it expires, not before; the replacement then leads with the same owner', async (t) => {
  const db = await testDb(t);
  // What a process killed with its lease and claim leaves behind.
  await db.observer.query(
    `UPDATE tidemark.watermark SET lease_owner = 'same', lease_expires_at = clock_timestamp() + interval '1.5 s';
     INSERT INTO tidemark.owner_claims (owner, instance, claimed_at, expires_at)
     VALUES ('same', 'gone:1:00000000', clock_timestamp() - interval '1 minute', clock_timestamp() + interval '1.5 s')`,
  );
  const { dead } = (await db.observer.query(`SELECT expires_at AS dead FROM tidemark.owner_claims`)).rows[0];
  await insertEvent(await db.session('writer'));
  const replacement = new Watermarker(db.pool(), { owner: 'same', leaseTtlMs: 3000, leaseRenewMs: 900, summaryIntervalMs: 300 });
  const stop = new AbortController();
  let failed: unknown;
  const running = replacement.run(stop.signal).catch((err: unknown) => (failed = err));
  await waitFor('the replacement to publish', async () => (await safeSeq(db.observer)) === 1n);
  const claim = (await state(db)).claim!;
  assert.equal(claim.instance, replacement.instance);
  assert.ok(claim.claimed_at >= dead, `claimed at ${claim.claimed_at.toISOString()}, before the dead claim expired at ${dead.toISOString()}`);
  await waitFor('the replacement\'s run to report it leads', async () => replacement.isLeader);
  stop.abort();
  await running;
  assert.equal(failed, undefined, 'run() waited for the dead claim instead of refusing');
  await replacement.close();
});

test('claim_owner: two claims of a free owner at once, one wins and the other is refused with the winner\'s claim; its own claim is renewed past a quarter of its TTL, keeping claimed_at; release_owner gives up only its own claim', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const b = await db.session('b');
  const claim = (s: typeof a, instance: string) =>
    s.query(`SELECT claimed, instance, claimed_at, expires_at FROM tidemark.claim_owner('o', $1, 10000)`, [instance]).then((r) => r.rows[0]);

  await a.query('BEGIN');
  assert.equal((await claim(a, 'i1')).claimed, true);
  const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  const racing = claim(b, 'i2');
  await waitUntilWaiting(db.observer, bPid, 'the second claim to wait for the first one\'s insert');
  await a.query('COMMIT');
  const refused = await racing;
  assert.equal(refused.claimed, false);
  assert.equal(refused.instance, 'i1');

  const first = (await db.observer.query(`SELECT claimed_at, expires_at, xmin::text FROM tidemark.owner_claims WHERE owner = 'o'`)).rows[0];
  const fresh = await claim(a, 'i1');
  assert.equal(fresh.claimed, true, 'its own claim, answered as it is');
  assert.deepEqual([fresh.claimed_at, fresh.expires_at], [first.claimed_at, first.expires_at]);
  assert.equal((await db.observer.query(`SELECT xmin::text FROM tidemark.owner_claims`)).rows[0].xmin, first.xmin, 'not written again within a quarter of its TTL');
  await db.observer.query(`UPDATE tidemark.owner_claims SET expires_at = clock_timestamp() + interval '4 s'`);
  const renewed = await claim(a, 'i1');
  assert.equal(renewed.claimed, true);
  assert.deepEqual(renewed.claimed_at, first.claimed_at, 'a renewal keeps claimed_at');
  assert.ok(renewed.expires_at > first.expires_at);

  await db.observer.query(`UPDATE tidemark.watermark SET lease_owner = 'o', lease_expires_at = clock_timestamp() + interval '1 minute'`);
  assert.equal((await b.query(`SELECT tidemark.release_owner('o', 'i2') AS r`)).rows[0].r, false, 'not its claim: nothing released');
  assert.equal((await db.observer.query(`SELECT lease_owner FROM tidemark.watermark`)).rows[0].lease_owner, 'o');
  assert.equal((await a.query(`SELECT tidemark.release_owner('o', 'i1') AS r`)).rows[0].r, true);
  assert.equal((await db.observer.query(`SELECT lease_owner FROM tidemark.watermark`)).rows[0].lease_owner, null);
  assert.equal((await db.observer.query(`SELECT count(*)::int AS n FROM tidemark.owner_claims`)).rows[0].n, 0);

  await assert.rejects(a.query(`SELECT * FROM tidemark.claim_owner('', 'i1', 1000)`), /claim_owner: need an owner name/);
  await assert.rejects(a.query(`SELECT * FROM tidemark.claim_owner('o', 'i1', 0)`), /claim_owner: need an owner name/);
});

test('the fence waits for a claim being taken and then refuses: a write racing another process\'s takeover of a lapsed claim fails (55006)', async (t) => {
  const db = await testDb(t);
  await db.observer.query(
    `UPDATE tidemark.watermark SET lease_owner = 'same', lease_expires_at = clock_timestamp() + interval '1 minute';
     INSERT INTO tidemark.owner_claims VALUES ('same', 'lapsed:1:aaaaaaaa', clock_timestamp() - interval '1 minute', clock_timestamp() - interval '1 second')`,
  );
  const taker = await db.session('taker');
  const lapsed = await db.session('lapsed');
  await lapsed.query(`SELECT set_config('tidemark.instance', 'lapsed:1:aaaaaaaa', false)`);
  await taker.query('BEGIN');
  assert.equal((await taker.query(`SELECT claimed FROM tidemark.claim_owner('same', 'taker:2:bbbbbbbb', 10000)`)).rows[0].claimed, true);
  const pid = (await lapsed.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  const write = lapsed.query(`UPDATE tidemark.watermark SET lease_expires_at = clock_timestamp() + interval '2 minutes'`).then(
    () => 'written',
    (err: { code?: string }) => err.code,
  );
  await waitUntilWaiting(db.observer, pid, 'the lapsed process\'s write to wait for the claim being taken');
  await taker.query('COMMIT');
  assert.equal(await write, '55006');
  const row = (await db.observer.query(`SELECT l.lease_expires_at > clock_timestamp() + interval '90 seconds' AS moved, c.instance FROM tidemark.watermark l, tidemark.owner_claims c`)).rows[0];
  assert.deepEqual(row, { moved: false, instance: 'taker:2:bbbbbbbb' });
});
