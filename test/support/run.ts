/**
 * The test entry point (`npm test`, and `npm run test:bench` for the bench's
 * smoke run under bench/test): provides a PostgreSQL server, migrates
 * one template database, then runs every test file in parallel under node's
 * test runner. Each test clones the template into a database of its own.
 *
 * With DATABASE_URL set, that server is used (its user must be allowed to
 * create databases); without it, an embedded PostgreSQL is started in a
 * temporary directory and removed afterwards.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../../src/db/embedded.js';
import { migrate } from '../../src/schema/migrate.js';
import { quoteIdent } from '../../src/db/queryable.js';
import { TIERS, tierOf, type Tier } from './tiers.js';

const root = new URL('../../', import.meta.url).pathname;

async function testFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true });
  const files: string[] = [];
  for (const entry of entries) {
    const path = join(dir, entry.name);
    if (entry.isDirectory() && entry.name !== 'support') files.push(...(await testFiles(path)));
    else if (entry.isFile() && entry.name.endsWith('.test.ts')) files.push(relative(root, path));
  }
  return files.sort();
}

/**
 * Compiles src/ into dist/ when a source file is newer than the build: the
 * tests start the CLI as users do (bin/tidemark.js over dist/), and the
 * examples import 'tidemark', i.e. dist/. An up-to-date dist/ is never
 * rewritten, so concurrent runs in one checkout do not read each other's
 * half-written build.
 */
async function build(): Promise<void> {
  const built = await stat(join(root, 'dist/index.js')).then((s) => s.mtimeMs, () => 0);
  const sources = await readdir(join(root, 'src'), { recursive: true });
  const newest = Math.max(...(await Promise.all(sources.map((f) => stat(join(root, 'src', f)).then((s) => s.mtimeMs)))));
  if (newest <= built) return;
  await promisify(execFile)(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'], { cwd: root });
}

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

async function main(): Promise<number> {
  // `--in DIR`: the test files under DIR instead of test/ (`npm run test:bench`: bench/test).
  // `--tier unit|integration|e2e`: the files of that tier only (tierOf; `npm run test:unit` ...).
  const args = process.argv.slice(2);
  const option = (name: string): string | undefined => {
    const at = args.indexOf(name);
    if (at < 0) return undefined;
    const value = args.splice(at, 2)[1];
    if (!value) throw new Error(`${name} needs a value`);
    return value;
  };
  const dir = option('--in') ?? 'test';
  const tier = option('--tier');
  // `--server-tests`: only the files whose tests use the server this run
  // provides (they call testDb). The others start their own servers or none,
  // and do the same whichever server this is: .ci/run's second pass, on the
  // embedded server, leaves them to the first.
  const serverTests = args.includes('--server-tests');
  if (serverTests) args.splice(args.indexOf('--server-tests'), 1);
  if (tier !== undefined && !TIERS.includes(tier as Tier)) throw new Error(`--tier: expected one of ${TIERS.join(', ')}, got ${tier}`);
  const filters = args;
  let files = await testFiles(join(root, dir));
  if (filters.length > 0) files = files.filter((f) => filters.some((x) => f.includes(x)));
  const texts = new Map(await Promise.all(files.map(async (f) => [f, await readFile(join(root, f), 'utf8')] as const)));
  const tiers = new Map(files.map((f) => [f, tierOf(f, texts.get(f)!)] as const));
  if (tier !== undefined) files = files.filter((f) => tiers.get(f) === tier);
  if (serverTests) {
    const uses = (f: string) => /\btestDb\(/.test(texts.get(f)!);
    console.log(`# not run here (--server-tests: they do not use this server): ${files.filter((f) => !uses(f)).join(', ')}`);
    files = files.filter(uses);
  }
  // TIDEMARK_TEST_EXCLUDE=a,b leaves out the files whose path contains a or b, and says so:
  // .ci/run runs the broker tests against one PostgreSQL only (they test the brokers' side).
  const excluded = (process.env.TIDEMARK_TEST_EXCLUDE ?? '').split(',').filter(Boolean);
  if (excluded.length > 0) {
    const left = files.filter((f) => !excluded.some((x) => f.includes(x)));
    console.log(`# not run here (TIDEMARK_TEST_EXCLUDE): ${files.filter((f) => !left.includes(f)).join(', ') || 'nothing matched'}`);
    files = left;
  }
  if (files.length === 0) {
    console.error(`no test files match ${filters.join(' ')}`);
    return 1;
  }

  await build();
  // Unit tests need no server: none is started, nor a template migrated.
  if (files.every((f) => tiers.get(f) === 'unit')) return runFiles(files, {});

  // `npx tidemark`, as the README's commands run it (test/readme*.test.ts
  // runs them as written), installs this checkout into npm's npx cache on
  // first use from a path, and that install runs the prepare script: a
  // build rewriting dist/ while other tests load it. Once, before any test.
  if (files.some((f) => f.includes('readme'))) {
    await promisify(execFile)('npx', ['--yes', 'tidemark', '--version'], { cwd: root, timeout: 120_000 });
  }

  let embedded: EmbeddedPostgresHandle | undefined;
  let dataDir: string | undefined;
  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    dataDir = await mkdtemp(join(tmpdir(), 'tidemark-test-pg-'));
    embedded = await startEmbeddedPostgres({
      dataDir,
      ephemeral: true,
      // Test data is disposable: trade durability for speed.
      settings: { fsync: 'off', synchronous_commit: 'off', full_page_writes: 'off', max_connections: 400, max_prepared_transactions: 20 },
    });
    adminUrl = embedded.url;
  }

  const template = `tidemark_tpl_${process.pid}_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  const version = (await admin.query<{ server_version: string }>('SHOW server_version')).rows[0]?.server_version;
  console.log(`# PostgreSQL ${version} (${embedded ? 'embedded' : 'DATABASE_URL'}); template ${template}`);
  await admin.query(`CREATE DATABASE ${quoteIdent(template)}`);
  const templatePool = new pg.Pool({ connectionString: withDatabase(adminUrl, template), max: 1 });
  await migrate(templatePool);
  await templatePool.end();

  // The runner starts files in the order given: the slowest tier first, so
  // the last files to finish are short ones and the run has no long tail.
  const rank: Record<Tier, number> = { e2e: 0, integration: 1, unit: 2 };
  const ordered = [...files].sort((a, b) => rank[tiers.get(a)!] - rank[tiers.get(b)!]);
  try {
    return await runFiles(ordered, { TIDEMARK_TEST_ADMIN_URL: adminUrl, TIDEMARK_TEST_TEMPLATE: template });
  } finally {
    // Drop the template and any database a crashed test left behind.
    const leftovers = await admin.query<{ datname: string }>(
      `SELECT datname FROM pg_database WHERE datname = $1 OR datname LIKE $2`,
      [template, `${template}_%`],
    );
    for (const { datname } of leftovers.rows) {
      await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(datname)} WITH (FORCE)`).catch(() => undefined);
    }
    await admin.end();
    await embedded?.stop();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  }
}

/** Runs `files` under node's test runner, in parallel; resolves with its exit code. */
function runFiles(files: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const concurrency = process.env.TIDEMARK_TEST_CONCURRENCY ?? '4';
  const timeout = process.env.TIDEMARK_TEST_TIMEOUT_MS ?? '300000';
  return new Promise<number>((resolve) => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', '--test', `--test-concurrency=${concurrency}`, `--test-timeout=${timeout}`, `--test-reporter=${process.env.TIDEMARK_TEST_REPORTER ?? 'spec'}`, ...files],
      { cwd: root, stdio: 'inherit', env: { ...process.env, ...env } },
    );
    child.on('exit', (status, signal) => resolve(status ?? (signal ? 1 : 0)));
  });
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
