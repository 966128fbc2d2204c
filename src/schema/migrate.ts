import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { InvalidOptionsError, TidemarkError } from '../errors.js';
import { checkKnownOptions } from '../options.js';
import { DEFAULT_SCHEMA, fenceKey, notifyChannel, wakeChannel, quoteIdent, validateSchema } from '../db/queryable.js';

/** Options for {@link migrate}. */
export interface MigrateOptions {
  /** Schema holding tidemark's tables and functions. Default `tidemark`. */
  schema?: string;
  /** List what would be applied, apply nothing. Default false. */
  dryRun?: boolean;
}

/** One migration file, with its schema-substituted SQL. */
export interface Migration {
  /** The number in the file name, e.g. 1 for `0001_init.sql`. */
  id: number;
  /** File name, e.g. `0001_init.sql`. */
  name: string;
  /** SQL with the schema, fence key and notification channel substituted. */
  sql: string;
}

/** What {@link migrate} did. */
export interface MigrateResult {
  /** The schema migrated. */
  schema: string;
  /** Migrations applied by this call (or, with `dryRun`, that would be). */
  applied: Migration[];
  /** Migrations that were already recorded. */
  alreadyApplied: number[];
}

const MIGRATIONS_DIR = fileURLToPath(new URL('../../sql/migrations/', import.meta.url));
const FILE_NAME = /^(\d{4})_[a-z0-9_]+\.sql$/;

/** Session-level advisory lock key serialising migrators: 'tdmkmigr'. */
const MIGRATION_LOCK_KEY = 0x74646d6b6d696772n;

/** Reads the bundled migrations in order, with placeholders substituted. */
export async function loadMigrations(schema: string = DEFAULT_SCHEMA): Promise<Migration[]> {
  validateSchema(schema);
  const names = (await readdir(MIGRATIONS_DIR)).filter((n) => FILE_NAME.test(n)).sort();
  const migrations: Migration[] = [];
  for (const [index, name] of names.entries()) {
    const id = Number(FILE_NAME.exec(name)?.[1]);
    if (id !== index + 1) {
      throw new TidemarkError('MIGRATION_FAILED', `migration ${name} is out of sequence: expected number ${index + 1}`);
    }
    const text = await readFile(`${MIGRATIONS_DIR}${name}`, 'utf8');
    const sql = text
      .replaceAll('{{schema}}', quoteIdent(schema))
      .replaceAll('{{fence_key}}', `(${fenceKey(schema)})::bigint`)
      // A validated schema name has no quote to escape.
      .replaceAll('{{notify_channel}}', `'${notifyChannel(schema)}'`)
      .replaceAll('{{wake_channel}}', `'${wakeChannel(schema)}'`);
    migrations.push({ id, name, sql });
  }
  return migrations;
}

/**
 * The ledger of applied migrations, in the tidemark schema. Its own name:
 * versions before 0.1 called it `migrations`, which other tools (TypeORM,
 * Knex, ...) use too, so `migrate --schema public` adopted theirs.
 */
const LEDGER = 'tidemark_migrations';

/**
 * What `<schema>.migrations` holds of tidemark's: the ids of its rows that
 * are a bundled migration's id and file name (none when its id and name
 * columns are not an integer and a text), whether it holds nothing else,
 * and whether it has tidemark's shape (id integer, name text, applied_at
 * timestamptz), so that it can be renamed.
 */
async function oldLedger(client: pg.PoolClient, schema: string, migrations: Migration[]): Promise<{ mine: number[]; onlyMine: boolean; ourShape: boolean }> {
  const columns = await client.query<{ attname: string; type: string }>(
    `SELECT a.attname::pg_catalog.text, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
       FROM pg_catalog.pg_attribute a
      WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)::pg_catalog.oid
        AND a.attnum OPERATOR(pg_catalog.>) 0::pg_catalog.int2 AND NOT a.attisdropped
      ORDER BY a.attnum`,
    [`${quoteIdent(schema)}.migrations`],
  );
  const shape = columns.rows.map((c) => `${c.attname} ${c.type}`).join(', ');
  const type = (name: string) => columns.rows.find((c) => c.attname === name)?.type;
  if (!['integer', 'bigint', 'smallint'].includes(type('id') ?? '') || !/^(text|character varying.*)$/.test(type('name') ?? '')) {
    return { mine: [], onlyMine: false, ourShape: false };
  }
  const rows = await client.query<{ id: string; name: string }>(`SELECT id::pg_catalog.text, name::pg_catalog.text FROM ${quoteIdent(schema)}.migrations`);
  const bundled = new Map(migrations.map((m) => [m.id, m.name]));
  const mine = rows.rows.filter((r) => bundled.get(Number(r.id)) === r.name).map((r) => Number(r.id));
  return { mine, onlyMine: mine.length === rows.rows.length, ourShape: shape === 'id integer, name text, applied_at timestamp with time zone' };
}

/**
 * Takes over the ledger of a version that called it `migrations`: when
 * there is no `tidemark_migrations` yet, a `migrations` table whose rows
 * are all tidemark's, in tidemark's shape, is renamed; one that also holds
 * other rows (another tool's table, which such a version wrote into) is
 * left as it is, and tidemark's rows are copied out of it.
 */
async function adoptOldLedger(client: pg.PoolClient, schema: string, migrations: Migration[]): Promise<void> {
  const s = quoteIdent(schema);
  const found = await client.query<{ ours: boolean; old: boolean }>(
    'SELECT pg_catalog.to_regclass($1::text) IS NOT NULL AS ours, pg_catalog.to_regclass($2::text) IS NOT NULL AS old',
    [`${s}.${LEDGER}`, `${s}.migrations`],
  );
  if (found.rows[0]!.ours || !found.rows[0]!.old) return;
  const { mine, onlyMine, ourShape } = await oldLedger(client, schema, migrations);
  if (mine.length === 0) return;
  await client.query("BEGIN; SET LOCAL search_path = ''");
  try {
    if (ourShape && onlyMine) {
      await client.query(`ALTER TABLE ${s}.migrations RENAME TO ${LEDGER}`);
    } else {
      await client.query(`CREATE TABLE ${s}.${LEDGER} (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT pg_catalog.now())`);
      await client.query(`INSERT INTO ${s}.${LEDGER} (id, name) SELECT m.id, m.name FROM ROWS FROM (pg_catalog.unnest($1::integer[]), pg_catalog.unnest($2::text[])) AS m(id, name)`, [
        mine,
        mine.map((id) => migrations.find((m) => m.id === id)!.name),
      ]);
    }
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

/**
 * Applies pending migrations in order, each in its own transaction with its
 * history row written first. Concurrent callers are serialised by an advisory
 * lock, so several processes may call `migrate` at once; all succeed.
 *
 * @example
 * const { applied } = await migrate(pool, { schema: 'tidemark' });
 */
export async function migrate(pool: pg.Pool, options: MigrateOptions = {}): Promise<MigrateResult> {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', `expected an object, got ${String(options)}`);
  checkKnownOptions(options, { schema: true, dryRun: true } satisfies Record<keyof MigrateOptions, true>, 'migrate');
  if (options.dryRun !== undefined && typeof options.dryRun !== 'boolean') throw new InvalidOptionsError('dryRun', `expected a boolean, got ${String(options.dryRun)}`);
  const schema = validateSchema(options.schema ?? DEFAULT_SCHEMA);
  const migrations = await loadMigrations(schema);
  const s = quoteIdent(schema);
  const client = await pool.connect();
  let locked = false;
  try {
    // Every name in the migrator's own statements is qualified and every
    // parameter typed: an unqualified call with an untyped parameter would
    // prefer a same-named function taking text in any schema on the
    // session's search_path (public, say), run with the migrator's rights.
    await client.query('SELECT pg_catalog.pg_advisory_lock($1::bigint)', [MIGRATION_LOCK_KEY.toString()]);
    locked = true;
    if (!options.dryRun) await adoptOldLedger(client, schema, migrations);
    const existing = await client.query<{ found: boolean; old: boolean }>(
      'SELECT pg_catalog.to_regclass($1::text) IS NOT NULL AS found, pg_catalog.to_regclass($2::text) IS NOT NULL AS old',
      [`${s}.${LEDGER}`, `${s}.migrations`],
    );
    const recorded = new Set<number>();
    if (existing.rows[0]?.found) {
      const rows = await client.query<{ id: number }>(`SELECT id FROM ${s}.${LEDGER} ORDER BY id`);
      for (const row of rows.rows) recorded.add(row.id);
    } else if (options.dryRun && existing.rows[0]?.old) {
      // What adoptOldLedger would take over, without taking it.
      for (const id of (await oldLedger(client, schema, migrations)).mine) recorded.add(id);
    }
    const pending = migrations.filter((m) => !recorded.has(m.id));
    const result: MigrateResult = { schema, applied: [], alreadyApplied: [...recorded] };
    if (options.dryRun) return { ...result, applied: pending };

    for (const migration of pending) {
      try {
        // The migration runs with an empty search_path: PostgreSQL then
        // looks only in pg_catalog (and, for tables and types, this
        // session's own temporary schema), so every function, operator and
        // type its DDL binds (defaults, CHECK constraints, policies, SQL
        // function bodies) is PostgreSQL's own, whatever another role has
        // created in public. An unqualified name for a new object fails
        // ("no schema has been selected") instead of landing somewhere:
        // with pg_catalog listed, a superuser's would land in pg_catalog.
        await client.query("BEGIN; SET LOCAL search_path = ''");
        await client.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
        await client.query(
          `CREATE TABLE IF NOT EXISTS ${s}.${LEDGER} (
             id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT pg_catalog.now())`,
        );
        await client.query(`INSERT INTO ${s}.${LEDGER} (id, name) VALUES ($1, $2)`, [migration.id, migration.name]);
        await client.query(migration.sql);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw new TidemarkError('MIGRATION_FAILED', `migration ${migration.name} failed; nothing of it was applied`, {
          cause: err,
        });
      }
      result.applied.push(migration);
    }
    return result;
  } finally {
    // A connection that may still hold the session-level migration lock must
    // not go back to the pool, or every later migrate() would wait on it.
    let unlockError: Error | undefined;
    if (locked) {
      await client.query('SELECT pg_catalog.pg_advisory_unlock($1::bigint)', [MIGRATION_LOCK_KEY.toString()]).catch((err: Error) => {
        unlockError = err;
      });
    }
    client.release(unlockError);
  }
}
