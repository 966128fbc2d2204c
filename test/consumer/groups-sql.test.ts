/**
 * Consumer groups in SQL (migration 0015, docs/PROTOCOL.md section 6.4):
 * the partition of a key, membership by lease and rebalancing by beats, a
 * partition's page and its fence, scripted step by step on named sessions
 * (no sleeps: lease ends are set by hand, waits poll pg_stat_activity).
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { closeAdmin, failsWith, testDb, testRole, waitFor, type TestDb } from '../support/db.js';
import { beat, page, partitionOf, publish, RR } from '../support/groups.js';

after(closeAdmin);

/** Ends `member`'s lease now, as if its process had died a TTL ago. */
async function expire(db: TestDb, member: string): Promise<void> {
  await db.observer.query(`UPDATE tidemark.group_members SET lease_expires_at = pg_catalog.clock_timestamp() - interval '1 second' WHERE member = $1`, [member]);
}

async function holders(db: TestDb): Promise<Record<number, string | null>> {
  const r = await db.observer.query<{ partition: number; holder: string | null }>(`SELECT partition, holder FROM tidemark.partition_cursors ORDER BY partition`);
  return Object.fromEntries(r.rows.map((row) => [row.partition, row.holder]));
}

async function partitionCursor(db: TestDb, partition: number): Promise<bigint> {
  const r = await db.observer.query<{ seq: string }>(`SELECT seq FROM tidemark.partition_cursors WHERE partition = $1`, [partition]);
  return BigInt(r.rows[0]!.seq);
}


test('key_partition is the first four bytes of MD5(key), big-endian, modulo the count: fixed vectors, and JavaScript agrees on any key', async (t) => {
  const db = await testDb(t);
  // Fixed vectors: a change of the function (or of this file's reading of
  // it) fails here, whatever JavaScript computes.
  const vectors: [string, number, number][] = [
    ['k1', 4294967295, 3057103226],
    ['', 4294967295, 3558706393],
    ['order-42', 4294967295, 1329687308],
    ['ключ', 4294967295, 3278207846],
    ['order-42', 16, 12],
    ['k1', 16, 10],
    ['ключ', 1024, 3278207846 % 1024],
  ];
  for (const [key, n, expected] of vectors) {
    if (n > 1024) {
      const r = await db.observer.query<{ h: string }>(`SELECT (('x' || substr(md5($1), 1, 8))::bit(32)::bigint)::text AS h`, [key]);
      assert.equal(Number(r.rows[0]!.h), expected, `md5 prefix of ${JSON.stringify(key)}`);
      assert.equal(partitionOf(key, 2 ** 32), expected);
    } else {
      const r = await db.observer.query<{ p: number }>('SELECT tidemark.key_partition($1, $2) AS p', [key, n]);
      assert.equal(r.rows[0]!.p, expected, `key_partition(${JSON.stringify(key)}, ${n})`);
    }
  }
  const keys = Array.from({ length: 300 }, (_, i) => `key-${i}-${'é'.repeat(i % 3)}-${i * 7919}`);
  for (const n of [1, 3, 16, 1024]) {
    const r = await db.observer.query<{ p: number }>('SELECT tidemark.key_partition(k, $2) AS p FROM unnest($1::text[]) WITH ORDINALITY u(k, i) ORDER BY i', [keys, n]);
    assert.deepEqual(r.rows.map((row) => row.p), keys.map((k) => partitionOf(k, n)), `${n} partitions`);
  }
  assert.equal(await failsWith(db.observer.query('SELECT tidemark.key_partition($1, 0)', ['k'])), '22023');
});

test('beats rebalance: a joiner gets nothing its live peer holds until that peer gives it up at its own beat; a leaver or an expired member frees its partitions', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const b = await db.session('b');
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3], 'the first member takes every partition');
  assert.deepEqual(await beat(b, 'b'), [], 'b targets 1 and 3, but a holds them under a live lease');
  assert.deepEqual(await holders(db), { 0: 'a', 1: 'a', 2: 'a', 3: 'a' });
  assert.deepEqual(await beat(a, 'a'), [0, 2], 'a gives up what is b\'s now');
  assert.deepEqual(await holders(db), { 0: 'a', 1: null, 2: 'a', 3: null });
  assert.deepEqual(await beat(b, 'b'), [1, 3]);
  assert.deepEqual(await beat(a, 'a'), [0, 2], 'stable');
  assert.deepEqual(await beat(b, 'b'), [1, 3], 'stable');

  // b dies: its lease ends; a's next beat takes everything.
  await expire(db, 'b');
  assert.deepEqual(await beat(a, 'a'), [0, 1, 2, 3]);
  const moves = await db.observer.query<{ partition: number; moves: string }>('SELECT partition, moves FROM tidemark.partition_cursors ORDER BY partition');
  assert.deepEqual(moves.rows.map((r) => Number(r.moves)), [1, 3, 1, 3], 'each change of hands is counted');
  assert.equal((await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'b'`)).rowCount, 0, 'the expired member is forgotten');

  // b comes back, then a leaves: b takes everything at its next beat.
  assert.deepEqual(await beat(b, 'b'), []);
  assert.deepEqual(await beat(a, 'a'), [0, 2]);
  assert.deepEqual(await beat(b, 'b'), [1, 3]);
  assert.equal((await a.query<{ n: number }>(`SELECT tidemark.leave_group('g', 's', 'a') AS n`)).rows[0]!.n, 2);
  assert.deepEqual(await beat(b, 'b'), [0, 1, 2, 3]);

  // Three members of another group: partition p to member p % 3, by name.
  const c = await db.session('c');
  for (const [s, m] of [[a, 'a'], [b, 'b'], [c, 'c'], [a, 'a'], [b, 'b'], [c, 'c']] as const) await beat(s, m, 4, 60_000, 'g3');
  assert.deepEqual(await beat(a, 'a', 4, 60_000, 'g3'), [0, 3]);
  assert.deepEqual(await beat(b, 'b', 4, 60_000, 'g3'), [1]);
  assert.deepEqual(await beat(c, 'c', 4, 60_000, 'g3'), [2]);
});

test('a partition\'s page is fenced: a member whose lease ended cannot commit it, and no one takes the partition while the page holds its row', async (t) => {
  const db = await testDb(t);
  const keys = Array.from({ length: 40 }, (_, i) => `key-${i}`);
  const seqs = await publish(db, keys);
  const a = await db.session('a');
  const b = await db.session('b');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  // a's lease is short: it will end while a's page is open.
  assert.deepEqual(await beat(a, 'a', 4, 1000), [0, 1, 2, 3]);
  assert.deepEqual(await beat(b, 'b'), []);
  const mine = seqs.filter((_, i) => partitionOf(keys[i]!, 4) === 0);

  // a opens a page of partition 0 (its own by the split) and applies it;
  // then its lease ends.
  await a.query(RR);
  const read = await a.query<{ seq: string; key: string }>('SELECT seq, key FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', 100]);
  assert.deepEqual(read.rows.map((r) => BigInt(r.seq)), mine, 'the partition\'s events, in seq order, and only those');
  assert.ok(read.rows.every((r) => partitionOf(r.key, 4) === 0));
  await a.query('INSERT INTO effects (seq, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [read.rows.map((x) => x.seq), read.rows.map((x) => x.key)]);
  // Not ended by the server for idling past the TTL meanwhile (the page set that): the fence alone refuses it.
  await a.query('SET LOCAL idle_in_transaction_session_timeout = 0');
  await waitFor('a\'s lease to end', async () => (await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'a' AND lease_expires_at < pg_catalog.clock_timestamp()`)).rowCount === 1);

  // b's beats go on while the page is open (nothing waits for its row),
  // take what is free, and skip the row the page holds.
  assert.deepEqual(await beat(b, 'b'), [1, 2, 3], 'partition 0 stays with the open page');
  assert.equal(await failsWith(a.query('SELECT tidemark.advance_partition($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', mine.at(-1)])), 'TM008', 'the fence');
  await a.query('ROLLBACK');
  assert.equal((await db.observer.query('SELECT 1 FROM effects')).rowCount, 0, 'the page\'s effects rolled back with it');
  assert.equal(await partitionCursor(db, 0), 0n);

  assert.deepEqual(await beat(b, 'b'), [0, 1, 2, 3], 'the page ended: b takes the partition');
  assert.equal(await failsWith(page(a, 'a', 0)), 'TM008', 'a no longer holds it');
  assert.deepEqual(await page(b, 'b', 0), mine, 'b delivers the events a could not commit, once');
  const safe = BigInt((await db.observer.query<{ s: string }>('SELECT safe_seq AS s FROM tidemark.watermark')).rows[0]!.s);
  assert.equal(await partitionCursor(db, 0), safe, 'a short page moves the cursor to safe_seq');
});

test('a member paused between its advance and COMMIT past the lease its page began under does not commit (the fence again at COMMIT)', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, ['x', 'y']);
  const a = await db.session('a');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  assert.deepEqual(await beat(a, 'a', 1, 1000), [0]);
  await a.query(RR);
  await a.query(`INSERT INTO effects (seq, key) SELECT seq, key FROM tidemark.read_partition_page('g', 's', 0, 'a', 10)`);
  await a.query(`SELECT tidemark.advance_partition('g', 's', 0, 'a', $1)`, [seqs.at(-1)]);
  await a.query('SET LOCAL idle_in_transaction_session_timeout = 0'); // the fence alone refuses it
  await waitFor('a\'s lease to end', async () => (await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'a' AND lease_expires_at < pg_catalog.clock_timestamp()`)).rowCount === 1);
  assert.equal(await failsWith(a.query('COMMIT')), 'TM008');
  assert.equal((await db.observer.query('SELECT 1 FROM effects')).rowCount, 0);
  assert.equal(await partitionCursor(db, 0), 0n);
});

test('a member that stops with a page open loses it once its lease TTL passes idle: the server ends its session and the partition moves', async (t) => {
  const db = await testDb(t);
  await publish(db, ['x', 'y', 'z']);
  const a = await db.session('a');
  const b = await db.session('b');
  await b.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  a.client.on('error', () => undefined); // the server ends this session
  assert.deepEqual(await beat(a, 'a', 1, 300), [0]);
  await a.query(RR);
  await a.query('SELECT seq FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', 100]);
  const setting = await a.query<{ v: string }>(`SELECT current_setting('idle_in_transaction_session_timeout') AS v`);
  assert.equal(setting.rows[0]!.v, '300ms', 'the page set the idle timeout to the lease TTL');
  // a is now idle in its transaction, as a paused process would be.
  await waitFor('the idle member\'s session to end', async () => {
    const r = await db.observer.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [a.pid]);
    return r.rowCount === 0;
  });
  assert.deepEqual(await beat(b, 'b', 1), [0], 'its lease over and its page gone, the partition is b\'s');
  assert.equal((await page(b, 'b', 0)).length, 3);
});

test('every event of the stream once, per-key order kept, across members that join, leave and die mid-stream', async (t) => {
  const db = await testDb(t);
  const keys = Array.from({ length: 300 }, (_, i) => `key-${i % 30}`);
  const seqs = await publish(db, keys);
  const sessions = { a: await db.session('a'), b: await db.session('b'), c: await db.session('c') };
  await sessions.a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  const partitions = 5;
  const live = new Set<keyof typeof sessions>(['a', 'b']);
  const round = async (max: number) => {
    for (const m of live) {
      for (const p of await beat(sessions[m], m, partitions)) await page(sessions[m], m, p, max);
    }
  };
  await round(3);
  live.add('c');
  await round(4);
  await round(2);
  await expire(db, 'b'); // b dies
  live.delete('b');
  await round(5);
  await sessions.c.query(`SELECT tidemark.leave_group('g', 's', 'c')`);
  live.delete('c');
  for (let i = 0; i < 40; i += 1) await round(10);
  const r = await db.observer.query<{ seq: string; key: string }>('SELECT seq, key FROM effects ORDER BY at');
  assert.deepEqual(r.rows.map((x) => BigInt(x.seq)).sort((x, y) => (x < y ? -1 : 1)), seqs, 'each event once');
  const lastByKey = new Map<string, bigint>();
  for (const row of r.rows) {
    const seq = BigInt(row.seq);
    assert.ok((lastByKey.get(row.key) ?? 0n) < seq, `key ${row.key} in order`);
    lastByKey.set(row.key, seq);
  }
});

test('a partition page is one range scan of the group\'s partition index, once it exists', async (t) => {
  const db = await testDb(t);
  await publish(db, Array.from({ length: 4000 }, (_, i) => `key-${i}`));
  await db.observer.query('ANALYZE tidemark.events');
  const ddl = (await db.observer.query<{ ddl: string }>('SELECT tidemark.partition_index_ddl(4) AS ddl')).rows[0]!.ddl;
  assert.match(ddl, /^CREATE INDEX CONCURRENTLY IF NOT EXISTS events_partition_4 ON "tidemark"\.events \(stream, /);
  await db.observer.query(ddl);
  await db.observer.query('ANALYZE tidemark.events');
  const a = await db.session('a');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  await beat(a, 'a');
  // The statement as read_partition_page builds it, planned with the same
  // values.
  const expression = (await a.query<{ e: string }>(`SELECT tidemark.partition_expression('e.key', 4) AS e`)).rows[0]!.e;
  const safe = (await a.query<{ s: string }>('SELECT safe_seq AS s FROM tidemark.watermark')).rows[0]!.s;
  const plan = await a.query<{ 'QUERY PLAN': string }>(
    `EXPLAIN SELECT e.seq FROM tidemark.events e WHERE e.stream = 's' AND e.seq > 0 AND e.seq <= ${safe} AND ${expression} = 2 ORDER BY e.seq LIMIT 100`,
  );
  const text = plan.rows.map((r) => r['QUERY PLAN']).join('\n');
  assert.match(text, /Index (Only )?Scan using events_partition_4/);
  assert.doesNotMatch(text, /Sort|Filter/, 'no rows read and discarded, no sort');
  const before = await indexScans(db);
  const got = await page(a, 'a', 2);
  assert.ok(got.length > 0);
  await a.query('SELECT pg_catalog.pg_stat_force_next_flush()');
  await waitFor('the page\'s index scans to be counted', async () => (await indexScans(db)) > before);
});

async function indexScans(db: TestDb): Promise<number> {
  await db.observer.query('SELECT pg_catalog.pg_stat_clear_snapshot()');
  const r = await db.observer.query<{ n: string }>(`SELECT idx_scan AS n FROM pg_stat_user_indexes WHERE indexrelname = 'events_partition_4'`);
  return Number(r.rows[0]?.n ?? 0);
}

test('refused with a clear error and nothing written: another partition count, a name that has a cursor of its own, bad arguments, a misused page', async (t) => {
  const db = await testDb(t);
  const a = await db.session('a');
  const none = async () => {
    const r = await db.observer.query<{ n: string }>(`SELECT (SELECT count(*) FROM tidemark.groups) + (SELECT count(*) FROM tidemark.group_members) + (SELECT count(*) FROM tidemark.partition_cursors) AS n`);
    return Number(r.rows[0]!.n);
  };
  for (const [args, state] of [
    [['g', 's', 0, 'a', 1000], '22023'],
    [['g', 's', 1025, 'a', 1000], '22023'],
    [['g', 's', 4, '', 1000], '22023'],
    [['g', 's', 4, 'a', 5], '22023'],
    [['', 's', 4, 'a', 1000], '22023'],
  ] as const) {
    assert.equal(await failsWith(a.query('SELECT * FROM tidemark.group_beat($1, $2, $3, $4, $5)', [...args])), state, JSON.stringify(args));
  }
  assert.equal(await none(), 0);

  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('solo', 's')`);
  assert.equal(await failsWith(beat(a, 'a', 4, 60_000, 'solo')), 'TM007');
  assert.equal(await none(), 0);

  assert.deepEqual(await beat(a, 'a', 4), [0, 1, 2, 3]);
  const err = await a.query('SELECT * FROM tidemark.group_beat($1, $2, $3, $4, $5)', ['g', 's', 8, 'b', 1000]).catch((e: Error & { code: string }) => e);
  assert.equal((err as { code?: string }).code, 'TM007');
  assert.match((err as Error).message, /has 4 partitions, not 8/);
  assert.equal((await db.observer.query(`SELECT 1 FROM tidemark.group_members WHERE member = 'b'`)).rowCount, 0);

  // Outside REPEATABLE READ; a partition the group does not have; twice
  // without advancing; an advance without a page.
  assert.equal(await failsWith(a.query('SELECT * FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', 10])), 'TM003');
  await a.query(RR);
  assert.equal(await failsWith(a.query('SELECT * FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', 4, 'a', 10])), 'TM008');
  await a.query('ROLLBACK');
  await publish(db, ['x', 'y', 'z', 'w', 'v', 'u', 't']);
  await a.query(RR);
  const first = await a.query('SELECT seq FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', partitionOf('x', 4), 'a', 1]);
  assert.equal(first.rowCount, 1);
  assert.equal(await failsWith(a.query('SELECT * FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', partitionOf('x', 4), 'a', 1])), 'TM006');
  await a.query('ROLLBACK');
  await a.query(RR);
  assert.equal(await failsWith(a.query('SELECT tidemark.advance_partition($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', 1])), 'TM004');
  await a.query('ROLLBACK');
});

test('a consumer role is a member of the groups of the consumers granted to it, and of no other', async (t) => {
  const db = await testDb(t);
  await publish(db, ['x', 'y']);
  const role = testRole(t, 'groupmember');
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['billing'])`, [role]);
  const c = await db.session('member');
  await c.query(`SET ROLE "${role}"`);
  assert.deepEqual(await beat(c, 'm', 1, 60_000, 'billing'), [0]);
  await c.query(RR);
  const r = await c.query<{ seq: string }>('SELECT seq FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['billing', 's', 0, 'm', 10]);
  assert.equal(r.rowCount, 2);
  await c.query(`SELECT tidemark.advance_partition('billing', 's', 0, 'm', (SELECT through FROM tidemark.partition_page_info('billing', 's', 0)))`);
  await c.query('COMMIT');
  assert.equal(await failsWith(beat(c, 'm', 1, 60_000, 'other')), '42501');
});

test('a page commits across its own member\'s beats: a renewal during the page neither moves the partition nor fails the page', async (t) => {
  const db = await testDb(t);
  const seqs = await publish(db, ['x', 'y', 'z']);
  const a = await db.session('a pages');
  const beats = await db.session('a beats');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  assert.deepEqual(await beat(beats, 'a', 1), [0]);
  await a.query(RR);
  const r = await a.query<{ seq: string; key: string }>('SELECT seq, key FROM tidemark.read_partition_page($1, $2, $3, $4, $5)', ['g', 's', 0, 'a', 100]);
  await a.query('INSERT INTO effects (seq, key) SELECT * FROM unnest($1::bigint[], $2::text[])', [r.rows.map((x) => x.seq), r.rows.map((x) => x.key)]);
  // The member's beat renews its lease while the page is open (its
  // group_members row changes after the page's snapshot); it keeps the
  // partition and does not wait for the page.
  assert.deepEqual(await beat(beats, 'a', 1), [0]);
  assert.deepEqual(await beat(beats, 'a', 1), [0]);
  await a.query(`SELECT tidemark.advance_partition('g', 's', 0, 'a', (SELECT through FROM tidemark.partition_page_info('g', 's', 0)))`);
  await a.query('COMMIT');
  assert.deepEqual((await db.observer.query<{ seq: string }>('SELECT seq FROM effects ORDER BY seq')).rows.map((x) => BigInt(x.seq)), seqs);
  assert.equal(await partitionCursor(db, 0), seqs.at(-1));
});

test('a quiet partition\'s empty page moves its cursor to safe_seq (at most every 10 s), so retention past the other partitions\' events asks it for no resync', async (t) => {
  const db = await testDb(t);
  // Every event in partition 1 of 2: partition 0 has none.
  const keys = Array.from({ length: 200 }, (_, i) => `key-${i}`).filter((k) => partitionOf(k, 2) === 1).slice(0, 5);
  const seqs = await publish(db, keys);
  const a = await db.session('a');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  assert.deepEqual(await beat(a, 'a', 2), [0, 1]);
  // An empty page that commits without an advance, as StreamClient's does.
  const emptyPage = async () => {
    await a.query(RR);
    assert.equal((await a.query(`SELECT 1 FROM tidemark.read_partition_page('g', 's', 0, 'a', 100)`)).rowCount, 0);
    await a.query('COMMIT');
  };
  await emptyPage();
  assert.equal(await partitionCursor(db, 0), 0n, 'not within 10 s of the cursor\'s last move');
  await db.observer.query(`UPDATE tidemark.partition_cursors SET updated_at = pg_catalog.now() - interval '11 seconds' WHERE partition = 0`);
  await emptyPage();
  assert.equal(await partitionCursor(db, 0), seqs.at(-1), 'an empty page moved it to safe_seq');
  assert.deepEqual(await page(a, 'a', 1), seqs);
  // Retention removes every event; neither partition is behind the horizon.
  await db.observer.query(`INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('s', $1)`, [seqs.at(-1)]);
  assert.deepEqual(await page(a, 'a', 0), []);
  assert.deepEqual(await page(a, 'a', 1), []);
});

test('a holder stops paging a partition that is another member\'s by the split now, so that its next beat can give it up (even paged back to back)', async (t) => {
  const db = await testDb(t);
  await publish(db, ['x', 'y', 'z']);
  const a = await db.session('a');
  const b = await db.session('b');
  await a.query('CREATE TABLE effects (seq bigint PRIMARY KEY, key text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY)');
  assert.deepEqual(await beat(a, 'a', 2), [0, 1]);
  assert.deepEqual(await beat(b, 'b', 2), [], 'partition 1 is b\'s by the split, and a still holds it');
  assert.deepEqual(await holders(db), { 0: 'a', 1: 'a' });
  // a holds partition 1 but may not page it any more; partition 0 is still its own.
  assert.equal(await failsWith(page(a, 'a', 1)), 'TM008');
  await page(a, 'a', 0);
  // With no page of a open on it, a's next beat gives it up, and b's takes it.
  assert.deepEqual(await beat(a, 'a', 2), [0]);
  assert.deepEqual(await beat(b, 'b', 2), [1]);
  await page(b, 'b', 1);
});
