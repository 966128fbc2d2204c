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
  assert.deepEqual(applied.sort(), all.map((m) => m.id));
  const history = await db.observer.query('SELECT id, name FROM tm_other.migrations ORDER BY id');
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
