import assert from 'node:assert/strict';
import { after, test, type TestContext } from 'node:test';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import { from as copyFrom } from 'pg-copy-streams';
import { append, createMetrics, loadMigrations, migrate, StreamClient, Watermarker } from '../../src/index.js';
import { closeAdmin, testDb, testRole, type TestDb } from '../support/db.js';
import { cli } from '../support/cli.js';

after(closeAdmin);

/** Creates a role through the opt-in function; drops it (roles are cluster-wide) after the test. */
async function grantedRole(t: TestContext, db: TestDb, kind: 'writer' | 'consumer') {
  const role = testRole(t, kind);
  const grant = kind === 'writer' ? `SELECT tidemark.grant_writer($1)` : `SELECT tidemark.grant_consumer($1, ARRAY['c', 'c2'])`;
  await db.observer.query(grant, [role]);
  await db.observer.query(grant, [role]); // idempotent
  // Connections of this pool act as the role (the test superuser assumes it).
  return { role, pool: db.pool({ options: `-c role=${role}` }) };
}

const denied = { code: '42501' };

test('the writer role can append, from SQL and TypeScript, and do nothing else', async (t) => {
  const db = await testDb(t);
  const { pool } = await grantedRole(t, db, 'writer');
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    assert.equal(await append(c, { stream: 's', kind: 'k', key: 'x', payload: { a: 1 } }), 1n);
    const sql = await c.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('s', 'k', 'y', '{}') RETURNING seq`);
    assert.equal(sql.rows[0].seq, '2');
    await c.query('COMMIT');

    const refused: [string, string][] = [
      ['read event contents', `SELECT payload FROM tidemark.events`],
      ['choose seq', `INSERT INTO tidemark.events (seq, stream, kind, key) OVERRIDING SYSTEM VALUE VALUES (100, 's', 'k', 'x')`],
      ['backdate occurred_at', `INSERT INTO tidemark.events (stream, kind, key, occurred_at) VALUES ('s', 'k', 'x', now() - interval '30 days')`],
      ['delete events', `DELETE FROM tidemark.events`],
      ['publish a watermark', `UPDATE tidemark.watermark SET safe_seq = 100`],
      ['run the watermark step', `SELECT * FROM tidemark.watermark_step('me', false, 10, false, 10)`],
      ['run the observing step', `SELECT * FROM tidemark.watermark_step('me')`],
      ['release the lease', `SELECT tidemark.release_lease('me')`],
      ['run the loop', `CALL tidemark.run_watermarker('me', p_run_ms => 0)`],
      ['set the sequence back', `SELECT setval('tidemark.events_seq_seq', 1)`],
      ['draw a number outside the fence', `SELECT nextval('tidemark.events_seq_seq')`],
      ['move cursors', `INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's')`],
      ['touch horizons', `INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('s', 1)`],
      ['grant itself more', `SELECT tidemark.grant_consumer('anyone', ARRAY['x'])`],
    ];
    for (const [what, statement] of refused) {
      await assert.rejects(c.query(statement), denied, `a writer must not ${what}`);
    }
    await assert.rejects(
      pipeline(Readable.from(['100\ts\tk\tx\n']), c.query(copyFrom(`COPY tidemark.events (seq, stream, kind, key) FROM STDIN`))),
      denied,
      'a writer must not COPY a chosen seq',
    );
  } finally {
    c.release();
  }
  const count = await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events');
  assert.equal(count.rows[0].n, 2, 'only the two appends landed');
});

test('the consumer role can tail, record resyncs and bootstrap, and do nothing else', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const owner = db.pool();
  const watermarker = new Watermarker(owner);
  await observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'a'), ('s', 'k', 'b')`);
  await watermarker.step();
  await observer.query(`INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('victim', 's', 1)`);

  const { role, pool } = await grantedRole(t, db, 'consumer');
  const client = new StreamClient(pool, { listen: true, pollIntervalMs: 10 });
  db.defer(() => client.close());
  const seen: bigint[] = [];
  assert.equal((await client.drain('c', 's', (e) => void seen.push(e.seq))).cursor, 2n);
  assert.deepEqual(seen, [1n, 2n]);
  const snap = await client.bootstrap('c2', 's');
  assert.equal(snap.safeSeq, 2n);
  await snap.commit();
  // A horizon above a cursor: the consumer records the resync itself.
  await observer.query(`INSERT INTO tidemark.horizons (stream, pruned_through_seq) VALUES ('s2', 5)`);
  await assert.rejects(client.drain('c', 's2', () => undefined), { code: 'RESYNC_REQUIRED' });

  const c = await pool.connect();
  try {
    const refused: [string, string][] = [
      ['append', `INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`],
      ['delete events', `DELETE FROM tidemark.events`],
      ['publish a watermark', `UPDATE tidemark.watermark SET safe_seq = 100`],
      ['move horizons', `UPDATE tidemark.horizons SET pruned_through_seq = 0`],
      ['delete cursors', `DELETE FROM tidemark.cursors`],
      ['create a cursor for a consumer it was not granted', `INSERT INTO tidemark.cursors (consumer, stream, seq) VALUES ('other', 's', 999)`],
      ['grant itself another consumer', `INSERT INTO tidemark.consumer_grants SELECT oid, 'victim' FROM pg_roles WHERE rolname = current_user`],
      ['write heartbeats', `SELECT tidemark.beat('x', 'y', '{}', 10)`],
      ['run the watermark step', `SELECT * FROM tidemark.watermark_step('me')`],
      ['set the sequence back', `SELECT setval('tidemark.events_seq_seq', 1)`],
      ['draw a number outside the fence', `SELECT nextval('tidemark.events_seq_seq')`],
      ['grant itself more', `SELECT tidemark.grant_writer($1)`],
    ];
    for (const [what, statement] of refused) {
      await assert.rejects(c.query(statement, statement.includes('$1') ? [role] : []), denied, `a consumer must not ${what}`);
    }
    // Other consumers' cursors are invisible to it, so it cannot move them.
    const moved = await c.query(`UPDATE tidemark.cursors SET seq = 1000000 WHERE consumer = 'victim'`);
    assert.equal(moved.rowCount, 0);
    assert.equal((await c.query(`SELECT DISTINCT consumer FROM tidemark.cursors ORDER BY consumer`)).rows.map((r) => r.consumer).join(), 'c,c2');
    await assert.rejects(client.drain('victim', 's', () => undefined), { code: '42501' }, 'nor tail as another consumer');
  } finally {
    c.release();
  }
  await watermarker.close();
});

test('a dropped role leaves its consumer grants inert: other consumer roles keep working, a namesake gets nothing', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const gone = testRole(t, 'gone');
  await observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['c'])`, [gone]);
  const { pool } = await grantedRole(t, db, 'consumer'); // granted 'c' and 'c2'
  await observer.query(`DROP OWNED BY "${gone}"`);
  await observer.query(`DROP ROLE "${gone}"`);
  const client = new StreamClient(pool, { listen: false });
  assert.equal((await client.drain('c2', 's', () => undefined)).delivered, 0, 'the policy ignores the dropped role');

  // A new role under the old name inherits nothing.
  await observer.query(`CREATE ROLE "${gone}" NOLOGIN`);
  await observer.query(`GRANT USAGE ON SCHEMA tidemark TO "${gone}"; GRANT SELECT, INSERT, UPDATE ON tidemark.cursors TO "${gone}"; GRANT SELECT ON tidemark.consumer_grants TO "${gone}"`);
  const namesake = db.pool({ options: `-c role=${gone}` });
  await assert.rejects(namesake.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 'x')`), denied);
});

test('status as a consumer role shows what that role may read; the writers safe_seq waits for are the owner\'s to see', async (t) => {
  const db = await testDb(t);
  const role = testRole(t, 'tm_status_consumer');
  // A password: the embedded test server asks for one (trust on the system one ignores it).
  await db.observer.query(`CREATE ROLE ${role} LOGIN PASSWORD 'status-pw'`);
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['c'])`, [role]);
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's'), ('other', 's')`);
  const url = new URL(db.url);
  url.username = role;
  url.password = 'status-pw';
  const text = await cli(['status', '--database-url', url.toString()]);
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, /^the writers safe_seq may wait for: visible to the schema owner only$/m);
  const json = await cli(['status', '--json', '--database-url', url.toString()]);
  assert.equal(json.code, 0, json.stderr);
  const status = JSON.parse(json.stdout) as { blockingWritersVisible: boolean; maxSeq: string; consumers: { consumer: string }[] };
  assert.equal(status.blockingWritersVisible, false);
  assert.equal(status.maxSeq, '1');
  assert.deepEqual(status.consumers.map((c) => c.consumer), ['c'], 'only the cursors it may use');
});

test('status as a writer role shows the watermark, the lease and the greatest seq; streams, cursors and writers are others\' to see', async (t) => {
  const db = await testDb(t);
  const role = testRole(t, 'tm_status_writer');
  await db.observer.query(`CREATE ROLE ${role} LOGIN PASSWORD 'status-pw'`);
  await db.observer.query(`SELECT tidemark.grant_writer($1)`, [role]);
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x'), ('s', 'k', 'y')`);
  await db.observer.query(`UPDATE tidemark.watermark SET safe_seq = 1`);
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's')`);
  const url = new URL(db.url);
  url.username = role;
  url.password = 'status-pw';
  const text = await cli(['status', '--database-url', url.toString()]);
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, /^safe_seq +1$/m);
  assert.match(text.stdout, /^max seq +2$/m);
  assert.match(text.stdout, /^lag +1 events/m);
  assert.match(text.stdout, /^the writers safe_seq may wait for: visible to the schema owner only$/m);
  assert.match(text.stdout, /^streams: visible to the schema owner and consumer roles only$/m);
  assert.match(text.stdout, /^consumers: visible to the schema owner and consumer roles only$/m);
  const json = await cli(['status', '--json', '--database-url', url.toString()]);
  assert.equal(json.code, 0, json.stderr);
  const status = JSON.parse(json.stdout) as Record<string, unknown>;
  assert.equal(status.safeSeq, '1');
  assert.equal(status.maxSeq, '2');
  assert.deepEqual(
    [status.blockingWritersVisible, status.streamsVisible, status.consumersVisible, status.streams, status.consumers],
    [false, false, false, [], []],
  );

  // Still nothing of an event's content, nor of the lease's candidates.
  const writer = db.pool({ options: `-c role=${role}` });
  await assert.rejects(writer.query(`SELECT stream FROM tidemark.events`), denied);
  await assert.rejects(writer.query(`SELECT * FROM tidemark.watermark`), denied);
});

test('a writer role granted before schema version 10 may read the watermark after the upgrade', async (t) => {
  const db = await testDb(t);
  const role = testRole(t, 'tm_old_writer');
  const inheritor = testRole(t, 'tm_old_writer_app');
  await db.observer.query('DROP SCHEMA tidemark CASCADE');
  await db.observer.query('CREATE SCHEMA tidemark');
  await db.observer.query(`CREATE TABLE tidemark.tidemark_migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
  for (const m of (await loadMigrations()).filter((m) => m.id <= 9)) {
    await db.observer.query(m.sql);
    await db.observer.query(`INSERT INTO tidemark.tidemark_migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
  }
  await db.observer.query(`SELECT tidemark.grant_writer($1)`, [role]);
  await db.observer.query(`CREATE ROLE ${inheritor} NOLOGIN IN ROLE ${role}`);
  const writer = db.pool({ options: `-c role=${role}` });
  await assert.rejects(writer.query(`SELECT safe_seq FROM tidemark.watermark`), denied, 'version 9 grants no watermark');

  const { applied } = await migrate(db.pool({ max: 1 }));
  assert.deepEqual(applied.map((m) => m.name).slice(0, 1), ['0010_writer_status.sql']);
  assert.deepEqual((await writer.query(`SELECT safe_seq FROM tidemark.watermark`)).rows, [{ safe_seq: '0' }]);
  const direct = await db.observer.query<{ grantee: string }>(
    `SELECT DISTINCT grantee::text FROM information_schema.column_privileges
      WHERE table_schema = 'tidemark' AND table_name = 'watermark' AND privilege_type = 'SELECT' AND grantee IN ($1, $2)`,
    [role, inheritor],
  );
  assert.deepEqual(direct.rows, [{ grantee: role }], 'the role grant_writer named, not the roles that inherit from it');
});

test('a consumer role granted before schema version 15 may be a group member after the upgrade, of its own consumers only', async (t) => {
  const db = await testDb(t);
  const role = testRole(t, 'tm_old_consumer');
  await db.observer.query('DROP SCHEMA tidemark CASCADE');
  await db.observer.query('CREATE SCHEMA tidemark');
  await db.observer.query(`CREATE TABLE tidemark.tidemark_migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
  for (const m of (await loadMigrations()).filter((m) => m.id <= 14)) {
    await db.observer.query(m.sql);
    await db.observer.query(`INSERT INTO tidemark.tidemark_migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
  }
  await db.observer.query(`SELECT tidemark.grant_consumer($1, ARRAY['billing', 'audit'])`, [role]);

  const { applied } = await migrate(db.pool({ max: 1 }));
  assert.deepEqual(applied.map((m) => m.name).slice(0, 1), ['0015_groups.sql']);
  const member = db.pool({ options: `-c role=${role}` });
  for (const consumer of ['billing', 'audit']) {
    assert.deepEqual((await member.query(`SELECT partition FROM tidemark.group_beat($1, 's', 2, 'm', 60000)`, [consumer])).rows, [{ partition: 0 }, { partition: 1 }]);
  }
  await assert.rejects(member.query(`SELECT * FROM tidemark.group_beat('other', 's', 2, 'm', 60000)`), { code: '42501' });
});

test('metrics read as a writer or consumer role say which parts of the status that role cannot see', async (t) => {
  const db = await testDb(t);
  const writer = await grantedRole(t, db, 'writer');
  const consumer = await grantedRole(t, db, 'consumer');
  await db.observer.query(`INSERT INTO tidemark.cursors (consumer, stream) VALUES ('c', 's')`);
  const visibility = async (pool: typeof writer.pool) => {
    const text = await createMetrics({ pool, processMetrics: false }).registry.metrics();
    assert.match(text, /^tidemark_database_up 1$/m);
    return Object.fromEntries([...text.matchAll(/^tidemark_status_visible\{part="(\w+)"\} (\d)$/gm)].map((m) => [m[1], Number(m[2])]));
  };
  assert.deepEqual(await visibility(writer.pool), { streams: 0, consumers: 0, blocking_writers: 0 });
  assert.deepEqual(await visibility(consumer.pool), { streams: 1, consumers: 1, blocking_writers: 0 });
  assert.deepEqual(await visibility(db.pool()), { streams: 1, consumers: 1, blocking_writers: 1 });
});
