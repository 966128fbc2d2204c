import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { InvalidOptionsError, loadMigrations, migrate } from '../../src/index.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

test('migrate on an up-to-date schema applies nothing and succeeds again', async (t) => {
  const db = await testDb(t);
  const pool = db.pool();
  const first = await migrate(pool);
  const second = await migrate(pool);
  assert.deepEqual(first.applied, []);
  assert.deepEqual(second.applied, []);
  const all = await loadMigrations();
  assert.deepEqual(second.alreadyApplied, all.map((m) => m.id));
});

test('concurrent migrate calls on a new schema all succeed and apply each file once', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 8 });
  const results = await Promise.all(Array.from({ length: 6 }, () => migrate(pool, { schema: 'tm_other' })));
  const applied = results.flatMap((r) => r.applied.map((m) => m.id));
  const all = await loadMigrations('tm_other');
  assert.deepEqual(applied.sort((a, b) => a - b), all.map((m) => m.id));
  const history = await db.observer.query('SELECT id, name FROM tm_other.tidemark_migrations ORDER BY id');
  assert.deepEqual(history.rows.map((r) => r.id), all.map((m) => m.id));
  // The new schema works on its own fence: an insert gets a seq.
  const r = await db.observer.query(`INSERT INTO tm_other.events (stream, kind, key) VALUES ('s', 'k', 'x') RETURNING seq`);
  assert.equal(r.rows[0].seq, '1');
});

test('dry run lists pending migrations and writes nothing', async (t) => {
  const db = await testDb(t);
  const result = await migrate(db.pool(), { schema: 'tm_dry', dryRun: true });
  assert.deepEqual(result.applied.map((m) => m.name), (await loadMigrations('tm_dry')).map((m) => m.name));
  const exists = await db.observer.query(`SELECT 1 FROM pg_namespace WHERE nspname = 'tm_dry'`);
  assert.equal(exists.rowCount, 0);
  assert.match(result.applied[0]!.sql, /CREATE TABLE "tm_dry"\.events/);
});

test('an invalid schema name is rejected before anything is written', async (t) => {
  const db = await testDb(t);
  for (const schema of ['Bad', '1abc', 'a-b', 'x"; DROP TABLE y; --', '', 'a'.repeat(49)]) {
    await assert.rejects(migrate(db.pool(), { schema }), (err: unknown) => {
      assert.ok(err instanceof InvalidOptionsError);
      assert.equal(err.option, 'schema');
      return true;
    });
  }
  const schemas = await db.observer.query(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' AND nspname NOT IN ('public', 'information_schema', 'tidemark')`);
  assert.equal(schemas.rows[0].n, 0);
});

test('migrate into public beside another tool\'s migrations table keeps a ledger of its own and never touches theirs', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 1 });
  // TypeORM's ledger, with its own history.
  await db.observer.query(`CREATE TABLE public.migrations (id serial PRIMARY KEY, "timestamp" bigint NOT NULL, name varchar NOT NULL)`);
  await db.observer.query(`INSERT INTO public.migrations ("timestamp", name) VALUES (1600000000000, 'CreateUsers1600000000000'), (1600000000001, 'AddEmail1600000000001')`);
  const before = (await db.observer.query(`SELECT * FROM public.migrations ORDER BY id`)).rows;

  const first = await migrate(pool, { schema: 'public' });
  const all = await loadMigrations('public');
  assert.deepEqual(first.applied.map((m) => m.id), all.map((m) => m.id));
  assert.deepEqual((await db.observer.query(`SELECT * FROM public.migrations ORDER BY id`)).rows, before, 'their table is as it was');
  assert.deepEqual((await db.observer.query(`SELECT id FROM public.tidemark_migrations ORDER BY id`)).rows.map((r) => r.id), all.map((m) => m.id));
  assert.deepEqual((await migrate(pool, { schema: 'public' })).applied, [], 'a second run finds its own ledger');
});

test('a ledger of an earlier version is taken over: renamed when it is all tidemark\'s, copied out of a table it shares', async (t) => {
  const db = await testDb(t);
  const pool = db.pool({ max: 1 });
  const all = await loadMigrations();
  // The template's schema, as an earlier version left it: the ledger called migrations.
  await db.observer.query(`ALTER TABLE tidemark.tidemark_migrations RENAME TO migrations`);
  const stamped = (await db.observer.query(`SELECT applied_at FROM tidemark.migrations WHERE id = 1`)).rows[0].applied_at as Date;
  assert.deepEqual((await migrate(pool)).applied, [], 'nothing applied again');
  assert.equal((await db.observer.query(`SELECT to_regclass('tidemark.migrations') AS r`)).rows[0].r, null);
  const renamed = await db.observer.query(`SELECT id, applied_at FROM tidemark.tidemark_migrations ORDER BY id`);
  assert.deepEqual(renamed.rows.map((r) => r.id), all.map((m) => m.id));
  assert.equal((renamed.rows[0].applied_at as Date).getTime(), stamped.getTime(), 'its history kept');

  // An earlier version that migrated into public wrote its rows into another tool's table.
  await migrate(pool, { schema: 'public' });
  await db.observer.query(`DROP TABLE public.tidemark_migrations`);
  await db.observer.query(`CREATE TABLE public.migrations (id integer PRIMARY KEY, name varchar NOT NULL, run_on timestamp NOT NULL DEFAULT now())`);
  await db.observer.query(`INSERT INTO public.migrations (id, name) VALUES (1000, '20200101_create_users.js')`);
  for (const m of await loadMigrations('public')) await db.observer.query(`INSERT INTO public.migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
  const theirs = (await db.observer.query(`SELECT * FROM public.migrations ORDER BY id`)).rows;
  assert.deepEqual((await migrate(pool, { schema: 'public' })).applied, [], 'what it recorded there counts as applied');
  assert.deepEqual((await db.observer.query(`SELECT id FROM public.tidemark_migrations ORDER BY id`)).rows.map((r) => r.id), all.map((m) => m.id));
  assert.deepEqual((await db.observer.query(`SELECT * FROM public.migrations ORDER BY id`)).rows, theirs, 'their table untouched');
});
