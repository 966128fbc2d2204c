/**
 * `tidemark cursor list|set|delete`, and `--from` on tail and relay: a
 * consumer's position is administered from the command line, never under a
 * consumer that holds it, never below what retention kept nor above
 * safe_seq.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { jetstreamManager } from '@nats-io/jetstream';
import { connect as natsConnect } from '@nats-io/transport-node';
import { Watermarker } from '../../src/index.js';
import { setCursor } from '../../src/consumer/cursors.js';
import { cli, exited, startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { startNatsServer } from '../support/nats-server.js';

after(closeAdmin);

/** `n` published events on stream `s`, then events 1-3 pruned (the retention floor is 3). */
async function seed(db: TestDb, n: number): Promise<void> {
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) SELECT 's', 'k', 'key-' || i FROM generate_series(1, $1) i`, [n]);
  await publish(db);
  await db.observer.query(`DELETE FROM tidemark.events WHERE seq <= 3`);
  await db.observer.query(`INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('s', 3)`);
}

async function publish(db: TestDb): Promise<void> {
  const watermarker = new Watermarker(db.pool());
  assert.equal((await watermarker.step()).outcome, 'advanced');
  await watermarker.close();
}

async function cursorAt(db: TestDb, consumer: string): Promise<string | undefined> {
  return (await db.observer.query<{ seq: string }>(`SELECT seq::text AS seq FROM tidemark.cursors WHERE consumer = $1`, [consumer])).rows[0]?.seq;
}

test('cursor set creates and moves a cursor to now, start or a seq; refuses below the retention floor and above safe_seq, writing nothing', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  const env = { DATABASE_URL: db.url };

  const created = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', 'now'], { env });
  assert.equal(created.code, 0, created.stderr);
  assert.equal(created.stdout, 'created the cursor of consumer "c" on stream "s" at seq 10\n');
  const start = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', 'start', '--json'], { env });
  assert.equal(start.code, 0, start.stderr);
  assert.deepEqual(JSON.parse(start.stdout), { consumer: 'c', stream: 's', from: '10', to: '3', floor: '3', safeSeq: '10' });

  const below = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', '2'], { env });
  assert.equal(below.code, 2);
  assert.equal(below.stderr, `tidemark: --to: seq 2 is below the retention floor of stream "s": events through seq 3 were pruned, so a consumer would skip them; set it to 3 ('start') or later\n`);
  const above = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', '11'], { env });
  assert.equal(above.code, 2);
  assert.match(above.stderr, /^tidemark: --to: seq 11 is above safe_seq 10: events up to it may still be in flight/);
  const newBelow = await cli(['cursor', 'set', '--consumer', 'fresh', '--stream', 's', '--to', '0'], { env });
  assert.equal(newBelow.code, 2, 'a new cursor is refused below the floor too');
  for (const bad of ['-1', 'later', '1.5', '']) {
    const r = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', bad], { env: { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' } });
    assert.equal(r.code, 2, bad);
    assert.equal(r.stderr, `tidemark: --to: expected a seq (a non-negative integer), now or start, got ${JSON.stringify(bad)}\n`, 'checked before connecting');
  }
  assert.equal(await cursorAt(db, 'c'), '3', 'nothing written by a refusal');
  assert.equal(await cursorAt(db, 'fresh'), undefined);

  const moved = await cli(['cursor', 'set', '--consumer', 'c', '--stream', 's', '--to', '5'], { env });
  assert.equal(moved.stdout, 'moved the cursor of consumer "c" on stream "s" from seq 3 to seq 5\n');

  // The list: 5 events above the cursor (6-10), their age, nobody holding it.
  const list = await cli(['cursor', 'list', '--json'], { env });
  assert.equal(list.code, 0, list.stderr);
  const [row] = JSON.parse(list.stdout) as Record<string, unknown>[];
  assert.equal(row!.consumer, 'c');
  assert.equal(row!.seq, '5');
  assert.equal(row!.lagEvents, '5');
  assert.ok((row!.lagSeconds as number) >= 0);
  assert.equal(row!.heldBy, null);
  assert.ok(!Number.isNaN(Date.parse(row!.updatedAt as string)));
  const text = await cli(['cursor', 'list'], { env });
  assert.match(text.stdout, /^consumer +stream +cursor +lag +lag s +updated +held by\nc +s +5 +5 +\d+\.\d +\S+ +-\n$/);

  const deleted = await cli(['cursor', 'delete', '--consumer', 'c', '--stream', 's', '--json'], { env });
  assert.deepEqual(JSON.parse(deleted.stdout), { consumer: 'c', stream: 's', deleted: true, seq: '5' });
  const again = await cli(['cursor', 'delete', '--consumer', 'c', '--stream', 's'], { env });
  assert.equal(again.code, 0);
  assert.equal(again.stdout, 'the cursor of consumer "c" on stream "s" does not exist; nothing deleted\n');
  assert.equal((await cli(['cursor', 'list'], { env })).stdout, '(no cursors)\n');
});

test('a cursor a consumer holds is neither moved nor deleted: the refusal names the session; an SQL page in progress holds it too', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  const env = { DATABASE_URL: db.url };
  const tail = startCli(['tail', '--consumer', 'live', '--stream', 's', '--from', 'start'], { env });
  t.after(() => tail.kill('SIGKILL'));
  await waitFor('the tail to deliver through seq 10', async () => (await cursorAt(db, 'live')) === '10');
  const pid = (await db.observer.query<{ pid: number }>(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid() AND objsubid = 1 AND granted
      AND ((classid::bigint << 32) | objid::bigint) = tidemark.cursor_lock_key('live', 's')`)).rows[0]!.pid;

  for (const args of [['set', '--to', 'start'], ['delete']]) {
    const r = await cli(['cursor', ...args.slice(0, 1), '--consumer', 'live', '--stream', 's', ...args.slice(1)], { env });
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, new RegExp(`^tidemark: consumer "live" on stream "s" is held by pid ${pid}, application "tidemark-cli"(, from [0-9a-f.:]+)?: stop that consumer first\\n$`));
  }
  const list = JSON.parse((await cli(['cursor', 'list', '--json'], { env })).stdout) as { heldBy: { pid: number; applicationName: string } | null }[];
  assert.deepEqual(list.map((c) => c.heldBy && { pid: c.heldBy.pid, applicationName: c.heldBy.applicationName }), [{ pid, applicationName: 'tidemark-cli' }]);
  tail.kill('SIGINT');
  assert.equal(await exited(tail), 0);
  assert.equal(await cursorAt(db, 'live'), '10', 'the refusals wrote nothing');

  // A page of the SQL contract, open in another session's transaction.
  const sql = await db.session('sql consumer');
  await sql.query(`BEGIN ISOLATION LEVEL REPEATABLE READ`);
  await sql.query(`SELECT * FROM tidemark.read_page('live', 's', 10)`);
  const r = await cli(['cursor', 'set', '--consumer', 'live', '--stream', 's', '--to', 'start'], { env });
  assert.equal(r.code, 1);
  assert.match(r.stderr, new RegExp(`^tidemark: consumer "live" on stream "s" is held by pid ${sql.pid}, application "test:sql consumer"(, from [0-9a-f.:]+)?: stop that consumer first\\n$`));
  await sql.query('ROLLBACK');
  const ok = await cli(['cursor', 'set', '--consumer', 'live', '--stream', 's', '--to', 'start'], { env });
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(await cursorAt(db, 'live'), '3');
});

test('tail --from now starts a new consumer at safe_seq and leaves an existing cursor where it is', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  const env = { DATABASE_URL: db.url };
  const first = await cli(['tail', '--consumer', 'late', '--stream', 's', '--once', '--from', 'now'], { env });
  assert.equal(first.code, 0, first.stderr);
  assert.equal(first.stdout, '', 'nothing published before it started');
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'new')`);
  await publish(db);
  const second = await cli(['tail', '--consumer', 'late', '--stream', 's', '--once', '--from', 'now'], { env });
  assert.equal(second.stdout, '11\tk\tnew\t{}\n', 'the cursor it made is kept: the new event arrives');
  const refused = await cli(['tail', '--consumer', 'late', '--stream', 's', '--once', '--from', 'now', '--bootstrap'], { env });
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /^tidemark: --from: sets where a new consumer starts; --bootstrap moves this one to the present/);
  // Without --from a new consumer starts at 0, below the floor: it must resync.
  const plain = await cli(['tail', '--consumer', 'old', '--stream', 's', '--once'], { env });
  assert.equal(plain.code, 3);
});

test('relay --from now publishes only what is published after it started', { timeout: 120_000 }, async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  const server = await startNatsServer(t);
  const relay = startCli(['relay', '--to', server.url, '--consumer', 'to-nats', '--stream', 's', '--create-stream', '--from', 'now'], { env: { DATABASE_URL: db.url } });
  t.after(() => relay.kill('SIGKILL'));
  const stderr = watchStderr(relay);
  await stderr.next(/publishing to/);
  assert.equal(await cursorAt(db, 'to-nats'), '10');
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'new')`);
  await publish(db);
  await waitFor('the relay to publish seq 11', async () => (await cursorAt(db, 'to-nats')) === '11');
  relay.kill('SIGINT');
  assert.equal(await exited(relay), 0, stderr.text());
  const nc = await natsConnect({ servers: server.url });
  t.after(() => nc.close());
  const info = await (await jetstreamManager(nc)).streams.info('TIDEMARK');
  assert.equal(info.state.messages, 1);
});

test('--from creates a missing cursor even while a consumer holds its lock, never moves one that exists, and is refused in its own terms', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  const env = { DATABASE_URL: db.url };
  // A second relay or tail started with --from while the first runs (it
  // holds the lock) must wait as a standby, not fail on the lock.
  const holder = await db.session('holder');
  await holder.query(`SELECT pg_advisory_lock(tidemark.cursor_lock_key('held', 's'))`);
  const pool = db.pool();
  assert.deepEqual(await setCursor(pool, 'held', 's', 'now', { onlyIfNew: true }), { consumer: 'held', stream: 's', from: null, to: 10n, floor: 3n, safeSeq: 10n });
  assert.deepEqual(await setCursor(pool, 'held', 's', 'start', { onlyIfNew: true }), { consumer: 'held', stream: 's', from: 10n, to: 10n, floor: 3n, safeSeq: 10n });
  await holder.query(`SELECT pg_advisory_unlock_all()`);

  const above = await cli(['tail', '--consumer', 'x', '--stream', 's', '--once', '--from', '999'], { env });
  assert.equal(above.code, 2);
  assert.match(above.stderr, /^tidemark: --from: seq 999 is above safe_seq 10: /);
  assert.equal(await cursorAt(db, 'x'), undefined);

  // A seq valid for one relayed stream and not another creates neither cursor.
  await db.observer.query(`INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('t', 8)`);
  const relay = await cli(['relay', '--to', 'nats://127.0.0.1:1', '--consumer', 'r', '--stream', 's', '--stream', 't', '--from', '5'], { env });
  assert.equal(relay.code, 2, relay.stderr);
  assert.match(relay.stderr, /^tidemark: --from: seq 5 is below the retention floor of stream "t"/);
  assert.equal(await cursorAt(db, 'r'), undefined, 'no cursor for s either');

  // `now` skips forward, never back: a bootstrap may leave a cursor above the published safe_seq.
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('ahead', 's', 12)`);
  const now = await cli(['cursor', 'set', '--consumer', 'ahead', '--stream', 's', '--to', 'now'], { env });
  assert.equal(now.stdout, 'moved the cursor of consumer "ahead" on stream "s" from seq 12 to seq 12\n');
});

test('--from racing a consumer that creates the same cursor: the consumer\'s page fails with 40001 and its retry starts where --from put the cursor', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  // A consumer of the SQL contract whose snapshot was taken before the cursor existed.
  const consumer = await db.session('consumer');
  await consumer.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await consumer.query('SELECT 1');
  assert.deepEqual(await setCursor(db.pool(), 'race', 's', 'now', { onlyIfNew: true }), { consumer: 'race', stream: 's', from: null, to: 10n, floor: 3n, safeSeq: 10n });
  // The page cannot see the row, and may not create one over it: a serialization failure, not a page from seq 0.
  await assert.rejects(consumer.query(`SELECT * FROM tidemark.read_page('race', 's', 100)`), (err: unknown) => (err as { code?: string }).code === '40001');
  await consumer.query('ROLLBACK');
  await consumer.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  const page = await consumer.query(`SELECT seq FROM tidemark.read_page('race', 's', 100)`);
  assert.deepEqual(page.rows, [], 'the retry starts at the cursor --from made: nothing published before it');
  await consumer.query('ROLLBACK');
});
