/**
 * Dead letters of consumer groups (migration 0016, docs/PROTOCOL.md
 * sections 6.3 and 6.4): an event set aside in its partition's page, under
 * the partition's fence, and replayed by the member that holds the
 * partition. SQL steps scripted on named sessions, then the library's
 * members end to end; progress awaited by polling, never by sleeping.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { replayDeadLetters, listDeadLetters, StreamClient, type ConsumerEvent } from '../../src/index.js';
import { closeAdmin, failsWith, testDb, waitFor, type Session, type TestDb } from '../support/db.js';
import { partitionOf, publish, RR } from '../support/groups.js';
import { cli } from '../support/cli.js';

after(closeAdmin);

async function beat(session: Session, member: string, ttlMs = 60_000): Promise<number[]> {
  const r = await session.query<{ partition: number }>(`SELECT partition FROM tidemark.group_beat('g', 's', 4, $1, $2)`, [member, ttlMs]);
  return r.rows.map((row) => row.partition);
}

/** Waits for `member`'s lease to end by the clock (a page's snapshot sees the lease it began under). */
async function leaseEnded(db: TestDb, member: string): Promise<void> {
  await waitFor(`${member}'s lease to end`, async () => (await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = $1 AND lease_expires_at < pg_catalog.clock_timestamp()`, [member])).rowCount === 1);
}

async function cursorOf(db: TestDb, partition: number): Promise<bigint> {
  return BigInt((await db.observer.query<{ seq: string }>('SELECT seq FROM tidemark.partition_cursors WHERE partition = $1', [partition])).rows[0]!.seq);
}

/** Runs `body` in a page of partition 0 read by `member`; rolls back unless `body` commits. */
async function inPage(session: Session, member: string, body: () => Promise<void>): Promise<void> {
  await session.query(RR);
  try {
    await session.query(`SELECT * FROM tidemark.read_partition_page('g', 's', 0, $1, 100)`, [member]);
    await body();
  } finally {
    await session.query('ROLLBACK'); // a no-op warning after a COMMIT
  }
}

const record = (session: Session, member: string, seq: bigint | undefined) =>
  session.query<{ id: string }>(`SELECT tidemark.record_partition_dead_letter('g', 's', 0, $1, $2, 3, 'Error: boom')::text AS id`, [member, seq?.toString()]);

test('record_partition_dead_letter sets a partition\'s next event aside with its partition, in the page that moves past it, and only under the partition\'s lease', async (t) => {
  const db = await testDb(t);
  const keys = Array.from({ length: 40 }, (_, i) => `key-${i}`);
  const seqs = await publish(db, keys);
  const mine = seqs.filter((_, i) => partitionOf(keys[i]!, 4) === 0);
  const other = seqs.find((_, i) => partitionOf(keys[i]!, 4) !== 0)!;
  assert.ok(mine.length >= 3);
  const a = await db.session('a');
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  const refusals: string[] = [];

  await a.query('BEGIN');
  refusals.push(await failsWith(record(a, 'a', mine[0])));
  await a.query('ROLLBACK');
  // Each refusal aborts its page: a page of its own for each.
  for (const seq of [other, mine[1], undefined]) {
    await inPage(a, 'a', async () => void refusals.push(await failsWith(record(a, 'a', seq))));
  }
  assert.deepEqual(refusals, ['TM004', 'TM005', 'TM005', 'TM005'], 'outside a page; another partition\'s event; not the next one; no seq');

  // The lease ends while the page is open: the record is refused with the cursor's move.
  assert.deepEqual(await beat(a, 'a', 1000), [0, 1, 2, 3]);
  await inPage(a, 'a', async () => {
    // Not ended by the server for idling past the TTL meanwhile (the page set that).
    await a.query('SET LOCAL idle_in_transaction_session_timeout = 0');
    await leaseEnded(db, 'a');
    refusals.push(await failsWith(record(a, 'a', mine[0])));
  });
  assert.equal(refusals.at(-1), 'TM008');
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0, 'nothing recorded');
  assert.equal(await cursorOf(db, 0), 0n);

  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  let id = '';
  await inPage(a, 'a', async () => {
    id = (await record(a, 'a', mine[0])).rows[0]!.id;
    const info = (await a.query<{ advanced_to: string }>(`SELECT advanced_to FROM tidemark.partition_page_info('g', 's', 0)`)).rows[0]!;
    assert.equal(BigInt(info.advanced_to), mine[0], 'the page is past it');
    await a.query('COMMIT');
  });
  assert.equal(await cursorOf(db, 0), mine[0]);
  const [dead] = await listDeadLetters(db.pool());
  assert.deepEqual(
    { id: String(dead!.id), consumer: dead!.consumer, partition: dead!.partition, seq: dead!.seq, key: dead!.key, attempts: dead!.attempts, error: dead!.lastError },
    { id, consumer: 'g', partition: 0, seq: mine[0], key: keys[seqs.indexOf(mine[0]!)], attempts: 3, error: 'Error: boom' },
  );

  // Not above its partition's cursor, whoever inserts it: a page would
  // deliver that event, and a replay again.
  const insert = (consumer: string, seq: bigint | undefined) =>
    db.observer.query(`INSERT INTO tidemark.dead_letters (consumer, stream, seq, kind, key, payload, headers, occurred_at, attempts, last_error, partition)
      VALUES ($1, 's', $2, 'x', 'x', '{}', '{}', now(), 1, 'e', 3)`, [consumer, seq]);
  assert.equal(await failsWith(insert('g', other)), 'TM005');
  // The partition is the key's in the group, whoever inserts the row.
  await db.observer.query('UPDATE tidemark.partition_cursors SET seq = $1 WHERE partition = $2', [other, partitionOf(keys[seqs.indexOf(other)]!, 4)]);
  await insert('g', other);
  const inserted = (await listDeadLetters(db.pool())).find((d) => d.seq === other)!;
  assert.equal(inserted.partition, partitionOf(inserted.key, 4));
  await insert('own', other);
  assert.equal((await listDeadLetters(db.pool(), { consumer: 'own' }))[0]!.partition, null, 'a consumer\'s own dead letter has none');
});

test('partition_replay gives a partition\'s dead letter only to its holder, and its transaction commits only under the lease', async (t) => {
  const db = await testDb(t);
  const keys = Array.from({ length: 40 }, (_, i) => `key-${i}`);
  const seqs = await publish(db, keys);
  const mine = seqs.filter((_, i) => partitionOf(keys[i]!, 4) === 0);
  const a = await db.session('a');
  const b = await db.session('b');
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  assert.deepEqual(await beat(b, 'b'), []);
  await inPage(a, 'a', async () => {
    await record(a, 'a', mine[0]);
    await a.query('COMMIT');
  });
  await db.observer.query('UPDATE tidemark.dead_letters SET replay_requested_at = now()');
  const replay = (s: Session, member: string, tried: string[] = []) =>
    s.query<{ id: string; seq: string }>(`SELECT id::text, seq::text FROM tidemark.partition_replay('g', 's', 0, $1, $2::bigint[])`, [member, tried]);

  await b.query(RR);
  assert.equal(await failsWith(replay(b, 'b')), 'TM008', 'not b\'s partition');
  await b.query('ROLLBACK');

  assert.deepEqual(await beat(a, 'a', 1000), [0, 2], 'b\'s by the split are given up');
  await a.query(RR);
  const row = (await replay(a, 'a')).rows[0]!;
  assert.equal(BigInt(row.seq), mine[0]);
  await a.query('DELETE FROM tidemark.dead_letters WHERE id = $1', [row.id]);
  // Not ended by the server for idling past the TTL meanwhile (the replay set that).
  await a.query('SET LOCAL idle_in_transaction_session_timeout = 0');
  await leaseEnded(db, 'a');
  assert.equal(await failsWith(a.query('COMMIT')), 'TM008', 'the fence at COMMIT');
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 1, 'still dead');

  assert.deepEqual(await beat(a, 'a'), [0, 2]);
  await a.query(RR);
  assert.equal((await replay(a, 'a', [row.id])).rowCount, 0, 'tried already in this pass');
  await a.query('ROLLBACK');
  await a.query(RR);
  assert.equal((await replay(a, 'a')).rows[0]!.id, row.id);
  await a.query('DELETE FROM tidemark.dead_letters WHERE id = $1', [row.id]);
  await a.query('COMMIT');
  assert.equal((await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount, 0, 'replayed once');
  assert.equal(await cursorOf(db, 0), mine[0], 'the cursor did not move');
});

test('tailGroup with the dead-letter policy: a poison event is set aside in its partition and the members go on; a replay delivers it once, through the member that holds it', async (t) => {
  const db = await testDb(t);
  await db.observer.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  await db.observer.query('CREATE TABLE healed (ok boolean)');
  const keys = Array.from({ length: 300 }, (_, i) => `key-${i % 30}`);
  const seqs = await publish(db, keys);
  const poison = seqs[100]!;
  const poisonKey = keys[100]!;
  const pool = db.pool({ max: 12 });
  const seen: ConsumerEvent[] = [];
  const members = ['a', 'b'].map((member) => {
    const client = new StreamClient(pool, { batchSize: 10, pollIntervalMs: 50, listen: false, observer: (e) => void seen.push(e) });
    db.defer(() => client.close());
    const stop = new AbortController();
    const run = client.tailGroup(
      'g',
      's',
      async (event, tx, context) => {
        assert.equal(context.partition, partitionOf(event.key, 4));
        if (event.seq === poison && (await tx.query('SELECT 1 FROM healed')).rowCount === 0) throw new Error('poison');
        await tx.query('INSERT INTO effects (seq, key) VALUES ($1, $2)', [event.seq.toString(), event.key]);
      },
      { partitions: 4, member, leaseTtlMs: 2000, failures: { maxAttempts: 2, backoffMinMs: 1, backoffMaxMs: 5, onExhausted: 'dead-letter' }, signal: stop.signal },
    );
    run.catch(() => undefined);
    return { stop, run };
  });
  await waitFor('every other event', async () => (await db.observer.query('SELECT 1 FROM effects')).rowCount === seqs.length - 1, 60_000);
  const [dead] = await listDeadLetters(pool, { consumer: 'g' });
  assert.deepEqual({ seq: dead!.seq, key: dead!.key, partition: dead!.partition, attempts: dead!.attempts }, { seq: poison, key: poisonKey, partition: partitionOf(poisonKey, 4), attempts: 2 });
  const event = seen.find((e) => e.type === 'dead-letter');
  assert.ok(event?.type === 'dead-letter' && event.partition === dead!.partition && event.id === dead!.id, 'the observer is told, with the partition');
  const listed = await cli(['dead-letters', 'list'], { env: { DATABASE_URL: db.url } });
  assert.match(listed.stdout, /^id +consumer +stream +partition +seq +key /);
  assert.match(listed.stdout, new RegExp(`\\n${dead!.id} +g +s +${dead!.partition} +${poison} +${poisonKey} +k +2 `));

  // `cursor delete` of the group's name deletes no cursor, and none of its dead letters.
  const deleted = await cli(['cursor', 'delete', '--consumer', 'g', '--stream', 's'], { env: { DATABASE_URL: db.url } });
  assert.match(deleted.stdout, /does not exist; nothing deleted/);
  assert.equal((await listDeadLetters(pool, { consumer: 'g' })).length, 1);

  await db.observer.query('INSERT INTO healed VALUES (true)');
  await replayDeadLetters(pool, { consumer: 'g' });
  await waitFor('the replay', async () => (await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount === 0, 30_000);
  const rows = (await db.observer.query<{ seq: string }>('SELECT seq FROM effects ORDER BY seq')).rows.map((r) => BigInt(r.seq));
  assert.deepEqual(rows, seqs, 'every event once (effects has a primary key on seq)');
  const replayed = seen.filter((e) => e.type === 'dead-letter:replay');
  assert.deepEqual(replayed.map((e) => e.type === 'dead-letter:replay' && [e.seq, e.partition, e.error]), [[poison, dead!.partition, undefined]]);
  for (const m of members) m.stop.abort(new Error('done'));
  await Promise.allSettled(members.map((m) => m.run));
});

// Long enough that the failing page, idle while its handler waits for the
// blocker, is not ended by the idle timeout (the lease TTL) under load.
const TTL_MS = 3000;


/**
 * One member over 40 events of 8 keys whose handler fails on seq 21 (after
 * `onPoison`) under the dead-letter policy, with a lease of TTL_MS.
 */
async function poisonMember(db: TestDb, onPoison: () => Promise<void> = async () => undefined) {
  await db.observer.query('CREATE TABLE effects (seq bigint PRIMARY KEY)');
  const keys = Array.from({ length: 40 }, (_, i) => `key-${i % 8}`);
  const seqs = await publish(db, keys);
  const poison = seqs[20]!;
  const seen: ConsumerEvent[] = [];
  const client = new StreamClient(db.pool({ max: 8 }), { batchSize: 5, pollIntervalMs: 50, listen: false, observer: (e) => void seen.push(e) });
  db.defer(() => client.close());
  const stop = new AbortController();
  let ended: unknown;
  const run = client.tailGroup(
    'g',
    's',
    async (event, tx) => {
      if (event.seq === poison) {
        await onPoison();
        throw new Error('poison');
      }
      await tx.query('INSERT INTO effects (seq) VALUES ($1)', [event.seq.toString()]);
    },
    { partitions: 4, member: 'a', leaseTtlMs: TTL_MS, failures: { maxAttempts: 1, onExhausted: 'dead-letter' }, signal: stop.signal },
  );
  run.catch((err: unknown) => (ended = err));
  const partition = partitionOf(keys[20]!, 4);
  return {
    poison,
    partition,
    seen,
    /** Waits by the server's clock until a lease taken before now has ended. */
    async pastLease() {
      const since = (await db.observer.query<{ t: Date }>('SELECT pg_catalog.clock_timestamp() AS t')).rows[0]!.t;
      await waitFor('the page\'s lease to end', async () =>
        (await db.observer.query(`SELECT 1 WHERE pg_catalog.clock_timestamp() > $1::timestamptz + $2 * interval '1 millisecond'`, [since, TTL_MS])).rowCount === 1);
    },
    /** The partition fenced, the member going on: every other event, and the poison set aside once. */
    async fencedAndOn(): Promise<ConsumerEvent | undefined> {
      await waitFor('the fence', async () => seen.some((e) => e.type === 'group:fenced' && e.partition === partition));
      await waitFor('every other event, and the poison set aside', async () =>
        (await db.observer.query('SELECT 1 FROM effects')).rowCount === seqs.length - 1 && (await db.observer.query('SELECT 1 FROM tidemark.dead_letters')).rowCount === 1, 30_000);
      assert.equal(ended, undefined, 'the member goes on');
      const [dead] = await listDeadLetters(db.pool());
      assert.deepEqual([dead!.seq, dead!.partition, dead!.attempts], [poison, partition, 1]);
      stop.abort(new Error('done'));
      await assert.rejects(run, { message: 'done' });
      return seen.find((e) => e.type === 'group:fenced' && e.error);
    },
  };
}

test('a dead letter\'s record refused by the fence (the lease its page began under ended before it ran) fences that partition only: the member goes on', async (t) => {
  // One run sets up the interleaving, or says it could not (false).
  const run = async (): Promise<boolean> => {
    const db = await testDb(t);
    const blocker = await db.session('blocker');
    let blocked: Promise<unknown> | undefined;
    // Queue a lock of the partition's row behind the failing page: it is
    // granted when the page rolls back, so the dead letter's page, next,
    // waits for it after its snapshot (and its lease) is taken.
    const member = await poisonMember(db, async () => {
      if (blocked !== undefined) return;
      await blocker.query('BEGIN');
      blocked = blocker.query('SELECT 1 FROM tidemark.partition_cursors WHERE partition = $1 FOR NO KEY UPDATE', [member.partition]);
      await waitFor('the blocker to queue', async () =>
        (await db.observer.query(`SELECT 1 FROM pg_catalog.pg_stat_activity WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%' AND query NOT LIKE '%pg_stat_activity%'`)).rowCount === 1);
    });
    await waitFor('the blocker to hold the partition\'s row', async () => blocked !== undefined);
    await blocked;
    // PostgreSQL does not queue row locks strictly: when the failing page
    // rolls back, the member's next page may take the row before the woken
    // blocker does (seen under load on CI). Then the dead letter was
    // recorded before the blocker held the row, and this run did not set up
    // the interleaving: try again on a fresh database.
    if (member.seen.some((e) => e.type === 'dead-letter')) {
      await blocker.query('ROLLBACK');
      return false;
    }
    // That partition's page, not another's (a page may wait a moment on a beat's row lock).
    await waitFor('the dead letter\'s page to wait on the blocker', async () =>
      (await db.observer.query(`SELECT 1 FROM pg_catalog.pg_stat_activity WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, [
        `%read_partition_page('g', 's', ${member.partition}, 'a', 1)%`,
      ])).rowCount === 1).catch(async (err: Error) => {
      // What the sessions were doing instead, and what the member reported.
      const activity = await db.observer.query(`SELECT state, wait_event_type, wait_event, left(query, 200) AS query FROM pg_catalog.pg_stat_activity WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid()`);
      throw new Error(`${err.message}; sessions: ${JSON.stringify(activity.rows)}; member events: ${JSON.stringify(member.seen.map((e) => [e.type, 'seq' in e ? String(e.seq) : undefined, 'error' in e ? String(e.error) : undefined]))}`);
    });
    await member.pastLease();
    await blocker.query('ROLLBACK');
    const fenced = await member.fencedAndOn();
    assert.ok(fenced?.type === 'group:fenced' && /no longer held by member 'a' under a live lease/.test(String(fenced.error)), 'refused at the record\'s advance, by the clock');
    return true;
  };
  for (let attempt = 1; ; attempt += 1) {
    if (await run()) return;
    assert.ok(attempt < 8, 'the member took the row ahead of the blocker in 8 runs of 8');
  }
});
