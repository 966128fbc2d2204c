/**
 * Writes sql/schema.sql: the schema every migration builds, as pg_dump
 * prints it, so the current definition of any object can be read in one
 * place instead of by replaying sql/migrations/. CI regenerates it and
 * fails when it differs from the committed file (`git diff --exit-code`):
 * a migration that changes the schema commits the new dump with it.
 *
 *   DATABASE_URL=postgres://... npm run schema
 *
 * Needs a server (DATABASE_URL) and a pg_dump of the same major version on
 * the PATH: dumps differ between major versions, and the committed one is
 * this machine's PostgreSQL 15.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import pg from 'pg';
import { migrate } from '../../src/index.js';

const OUT = new URL('../../sql/schema.sql', import.meta.url);

/** Lines that change from one dump to the next, or from one machine to another, with the schema the same. */
const NOISE = [/^-- Dumped (from|by) /, /^\\(un)?restrict /];

async function main(): Promise<void> {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error('npm run schema: set DATABASE_URL to a PostgreSQL server (the dump is taken with its own pg_dump)');
  const name = `tidemark_schema_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
    const target = new URL(url);
    target.pathname = `/${name}`;
    const pool = new pg.Pool({ connectionString: target.toString(), max: 1 });
    try {
      await migrate(pool);
    } finally {
      await pool.end();
    }
    const dump = execFileSync('pg_dump', ['--schema-only', '--no-owner', '--schema=tidemark', target.toString()], { encoding: 'utf8' });
    const text = dump
      .split('\n')
      .filter((line) => !NOISE.some((re) => re.test(line)))
      .join('\n')
      .replace(/\n{3,}/g, '\n\n');
    const version = (await admin.query<{ v: string }>(`SELECT current_setting('server_version_num') AS v`)).rows[0]!.v;
    const header =
      '-- The tidemark schema as every migration in sql/migrations/ builds it, dumped by\n' +
      `-- \`npm run schema\` (pg_dump --schema-only --no-owner, PostgreSQL major ${Math.floor(Number(version) / 10000)}).\n` +
      '-- Generated: do not edit. CI fails when it differs from a fresh dump.\n';
    await writeFile(OUT, header + text);
    console.log(`wrote sql/schema.sql (${text.split('\n').length} lines)`);
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${name}`).catch(() => undefined);
    await admin.end();
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
