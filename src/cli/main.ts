/**
 * `tidemark` command line: a thin map from argv to the library.
 * Connection: --database-url, else DATABASE_URL, else an embedded PostgreSQL
 * kept under ./.tidemark/ (created on first use, reused after).
 */
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type pg from 'pg';
import { createPool } from '../db/pool.js';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.js';
import { validateSchema, DEFAULT_SCHEMA } from '../db/queryable.js';
import { migrate } from '../schema/migrate.js';
import { Watermarker } from '../watermark/watermarker.js';
import { TidemarkError } from '../errors.js';

const USAGE = `Usage: tidemark <command> [options]

Commands:
  migrate [--dry-run]          apply pending migrations and list them
  watermark --once [--json]    run one watermark step and print its progress

Options:
  --database-url URL   PostgreSQL connection string (default: $DATABASE_URL,
                       else an embedded PostgreSQL under ./.tidemark/)
  --schema NAME        tidemark schema (default: tidemark)
  -h, --help           show this help

Examples:
  npx tidemark migrate
  DATABASE_URL=postgres://localhost/app npx tidemark watermark --once --json
`;

class UsageError extends Error {}

interface Connection {
  pool: pg.Pool;
  close(): Promise<void>;
}

async function connect(url: string | undefined): Promise<Connection> {
  let embedded: EmbeddedPostgresHandle | undefined;
  if (!url) {
    embedded = await startEmbeddedPostgres({ dataDir: resolve('.tidemark', 'pg'), port: 54329 });
    url = embedded.url;
  } else {
    try {
      const parsed = new URL(url);
      if (!/^postgres(ql)?:$/.test(parsed.protocol)) throw new Error();
    } catch {
      throw new UsageError('--database-url: expected a postgres:// or postgresql:// URL');
    }
  }
  const pool = createPool({ connectionString: url, max: 4 });
  return {
    pool,
    async close() {
      await pool.end();
      await embedded?.stop();
    },
  };
}

function bigintJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
}

export async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      'database-url': { type: 'string' },
      schema: { type: 'string', default: DEFAULT_SCHEMA },
      'dry-run': { type: 'boolean', default: false },
      once: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, ...rest] = positionals;
  if (values.help || !command) {
    console.log(USAGE);
    return command || values.help ? 0 : 2;
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument: ${rest[0]}`);
  if (command !== 'migrate' && command !== 'watermark') throw new UsageError(`unknown command: ${command}`);
  if (command === 'watermark' && !values.once) throw new UsageError('watermark: only --once is supported; run the daemon with the library for now');
  const schema = validateSchema(values.schema, '--schema');

  const connection = await connect(values['database-url'] ?? process.env.DATABASE_URL);
  try {
    if (command === 'migrate') {
      const result = await migrate(connection.pool, { schema, dryRun: values['dry-run'] });
      const verb = values['dry-run'] ? 'would apply' : 'applied';
      if (result.applied.length === 0) console.log(`schema ${schema} is up to date (${result.alreadyApplied.length} migrations)`);
      for (const m of result.applied) console.log(`${verb} ${m.name}`);
      return 0;
    }
    const watermarker = new Watermarker(connection.pool, { schema, leaseTtlMs: 5_000 });
    try {
      const progress = await watermarker.step();
      console.log(values.json ? bigintJson(progress) : `${progress.outcome}: safe_seq ${progress.safeSeq} (max seq ${progress.maxSeq ?? '-'})`);
    } finally {
      await watermarker.close();
    }
    return 0;
  } finally {
    await connection.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError || err instanceof TidemarkError || (err as { code?: string }).code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
      console.error(`tidemark: ${(err as Error).message}`);
      process.exit(2);
    }
    console.error(err);
    process.exit(1);
  },
);
