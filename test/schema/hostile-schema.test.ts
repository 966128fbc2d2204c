/**
 * Everything tidemark sends, run on the default search_path ("$user",
 * public) beside a public schema full of better-matching decoys
 * (test/support/hostile.ts): migrations, appends, the step and its loop,
 * tailing with LISTEN and read-ahead, bootstrap, the SQL consumer
 * contract, the relay, status, retention and the CLI. No decoy may run:
 * each one that did would have run with the rights of whoever called it.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { append, appendMany, migrate, Pruner, readStatus, Relay, ResyncRequiredError, StreamClient, Watermarker } from '../../src/index.js';
import { quoteIdent } from '../../src/db/queryable.js';
import { cli } from '../support/cli.js';
import { closeAdmin, insertEvent, safeSeq, testDb, testRole, waitFor } from '../support/db.js';
import { decoyCount, decoyHits, plantDecoys } from '../support/hostile.js';
import { MemorySink } from '../support/memory-sink.js';

after(closeAdmin);

test('a public schema of better-matching decoys changes nothing tidemark does, from migrate to prune: no decoy runs', async (t) => {
  const db = await testDb(t, { migrated: false });
  const { observer } = db;
  // The test's own reads stay off the decoys; tidemark's connections do not.
  await observer.query('SET search_path = pg_catalog, pg_temp');
  const attacker = testRole(t, 'attacker');
  await observer.query(`CREATE ROLE ${quoteIdent(attacker)}`);
  await observer.query(`GRANT CREATE ON SCHEMA public TO ${quoteIdent(attacker)}`);
  await plantDecoys(observer, attacker);
  const planted = await decoyCount(observer);
  assert.ok(planted.functions > 1000 && planted.aggregates > 10 && planted.operators > 10_000, `decoys planted: ${JSON.stringify(planted)}`);
  const hits = () => decoyHits(observer);

  // Another tool's ledger where tidemark's goes: migrate reads its columns and rows, and leaves it.
  await observer.query(`CREATE SCHEMA tidemark; CREATE TABLE tidemark.migrations (id integer PRIMARY KEY, name text NOT NULL); INSERT INTO tidemark.migrations VALUES (1, 'their_first.sql')`);

  // Installed, and run again, by the superuser.
  const pool = db.pool();
  assert.equal((await pool.query('SHOW search_path')).rows[0].search_path, '"$user", public');
  assert.ok((await migrate(pool)).applied.length >= 7);
  assert.deepEqual((await migrate(pool)).applied, []);
  // The attacker is the application's writer role: it may name tidemark's types.
  await observer.query('SELECT tidemark.grant_writer($1)', [attacker]);
  await plantDecoys(observer, attacker, ['tidemark.watermark_candidate', 'tidemark.watermark_candidate[]', 'tidemark.locked_cursor', 'tidemark.watermarker_loop']);
  assert.equal(await hits(), 0, 'migrate');

  // Writers: the TypeScript helpers in a transaction, plain SQL, and one
  // writer left open across the steps below.
  const tx = await pool.connect();
  await tx.query('BEGIN');
  assert.equal(await append(tx, { stream: 's', kind: 'k', key: 'a', payload: { n: 1 } }), 1n);
  assert.deepEqual(await appendMany(tx, [2, 3, 4].map((n) => ({ stream: 's', kind: 'k', key: `b${n}`, payload: { n } }))), [2n, 3n, 4n]);
  await tx.query('COMMIT');
  tx.release();
  const open = await db.session('open');
  await open.query('BEGIN');
  assert.equal(await insertEvent(open), 5n);
  assert.equal(await insertEvent(await db.session('writer')), 6n);
  assert.equal(await hits(), 0, 'appends');

  // The watermarker: one step, then the loop, which the abort cancels on the server.
  const wm = new Watermarker(pool, { owner: 'wm', summaryIntervalMs: 200 });
  assert.deepEqual([(await wm.step()).outcome, await safeSeq(observer)], ['pending', 0n]);
  const stop = new AbortController();
  const running = wm.run(stop.signal);
  await waitFor('the loop to take the lease', async () => wm.isLeader);
  assert.equal(await safeSeq(observer), 0n, 'the loop waits for the open writer');
  await open.query('COMMIT');
  await waitFor('safe_seq to reach 6', async () => (await safeSeq(observer)) === 6n);
  stop.abort();
  await running;
  await wm.close();
  assert.equal(await hits(), 0, 'watermarker');

  // Consumers: a tailer with LISTEN and read-ahead, a bootstrap, and the
  // contract in SQL.
  const client = new StreamClient(pool, { listen: true, prefetch: true, batchSize: 2, pollIntervalMs: 20 });
  db.defer(() => client.close());
  const seen: bigint[] = [];
  assert.equal((await client.drain('c1', 's', (e) => void seen.push(e.seq))).cursor, 6n);
  assert.deepEqual(seen, [1n, 2n, 3n, 4n, 5n, 6n]);
  const snap = await client.bootstrap('c2', 's');
  assert.equal(snap.safeSeq, 6n);
  await snap.commit();
  await snap.close();
  const sql = await db.session('sql-consumer');
  await sql.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  const page = (await sql.query(`SELECT seq::int FROM tidemark.read_page('c3', 's', 4)`)).rows.map((r) => r.seq as number);
  assert.deepEqual(page, [1, 2, 3, 4]);
  await sql.query(`SELECT tidemark.advance_cursor('c3', 's', 4)`);
  await sql.query('COMMIT');
  assert.equal(await hits(), 0, 'consumers');

  // A group member: its beats, the partition index it builds (a decoy
  // chosen in its check would fail the statement before it runs, and the
  // index would never come), its pages.
  const groupSeen: bigint[] = [];
  const groupStop = new AbortController();
  const member = client.tailGroup('g1', 's', (e) => void groupSeen.push(e.seq), { partitions: 2, member: 'm', signal: groupStop.signal });
  member.catch(() => undefined);
  await waitFor('the member to handle all six and build its partition index', async () => {
    const index = await observer.query(`SELECT 1 FROM pg_catalog.pg_index i WHERE i.indexrelid = pg_catalog.to_regclass('tidemark.events_partition_2') AND i.indisvalid`);
    return groupSeen.length === 6 && index.rowCount === 1;
  });
  groupStop.abort(new Error('done'));
  await assert.rejects(member, { message: 'done' });
  assert.deepEqual(groupSeen.sort((a, b) => (a < b ? -1 : 1)), [1n, 2n, 3n, 4n, 5n, 6n]);
  assert.equal(await hits(), 0, 'group member');

  // The relay, status and retention.
  const sink = new MemorySink();
  const relay = new Relay(pool, sink, { consumer: 'relay', streams: ['s'], listen: false, pollIntervalMs: 20 });
  const relayStop = new AbortController();
  const relaying = relay.run(relayStop.signal);
  // The broker acknowledges a page before the relay commits its cursor.
  await waitFor('the relay to forward every event and commit its cursor', async () => sink.acked.length === 6 && (await relay.lag())[0]?.cursor === 6n);
  assert.deepEqual((await relay.lag()).map((l) => [l.stream, l.cursor, l.events]), [['s', 6n, 0]]);
  relayStop.abort();
  await relaying;
  await relay.close();
  const status = await readStatus(pool, 'tidemark');
  assert.equal(status.safeSeq, 6n);
  assert.deepEqual(status.consumers.map((c) => [c.consumer, c.seq]), [['c1', 6n], ['c2', 6n], ['c3', 4n], ['relay', 6n]]);
  const pruned = await new Pruner(pool, { retentionMs: 0, allowShortRetention: true }).prune();
  assert.equal(pruned.deleted, 6);
  await assert.rejects(client.drain('late', 's', () => undefined), ResyncRequiredError);
  assert.equal(await hits(), 0, 'relay, status, retention');

  // The CLI, as a user runs it.
  const env = { DATABASE_URL: db.url };
  const watermark = await cli(['watermark', '--once', '--json'], { env });
  assert.equal(watermark.code, 0, watermark.stderr);
  const shown = await cli(['status', '--json'], { env });
  assert.equal(shown.code, 0, shown.stderr);
  assert.equal(JSON.parse(shown.stdout).safeSeq, '6');
  // Cursor administration, and a new consumer started from now.
  for (const args of [
    ['cursor', 'set', '--consumer', 'admin', '--stream', 's', '--to', 'now'],
    ['cursor', 'set', '--consumer', 'admin', '--stream', 's', '--to', 'start'],
    ['cursor', 'list', '--json'],
    ['cursor', 'delete', '--consumer', 'admin', '--stream', 's'],
    ['tail', '--consumer', 'fresh', '--stream', 's', '--once', '--from', 'now'],
  ]) {
    const r = await cli(args, { env });
    assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
  }
  assert.equal(await hits(), 0, 'CLI');
});
