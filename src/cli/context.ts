import { resolve } from 'node:path';
import type pg from 'pg';
import { createPool } from '../db/pool.js';
import { attachOrStartEmbeddedPostgres, startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.js';
import { DEFAULT_SCHEMA, validateSchema } from '../db/queryable.js';
import { InvalidOptionsError } from '../errors.js';
import { echoValue } from '../options.js';
import { CliError } from './cli-error.js';
import { inFlagTerms } from './flags.js';

/** Options every command takes. */
export interface GlobalOptions {
  databaseUrl?: string;
  schema: string;
  ephemeral?: boolean;
}

/** A connection for one command: a pool, and the embedded server it may have started. */
export interface Database {
  pool: pg.Pool;
  url: string;
  embedded: boolean;
  close(): Promise<void>;
}

/** Validates the schema and URL before anything connects; throws `CliError`. */
export function checkGlobals(options: GlobalOptions): { schema: string; url: string | undefined } {
  let schema: string;
  try {
    schema = validateSchema(options.schema ?? DEFAULT_SCHEMA, '--schema');
  } catch (err) {
    throw new CliError((err as Error).message);
  }
  const url = options.databaseUrl ?? process.env.DATABASE_URL;
  if (url !== undefined) {
    let ok = false;
    try {
      ok = /^postgres(ql)?:$/.test(new URL(url).protocol);
    } catch {
      ok = false;
    }
    if (!ok) throw new CliError(`--database-url: expected a postgres:// or postgresql:// URL`);
  }
  return { schema, url };
}

/**
 * Connects: `--database-url`, else `DATABASE_URL`, else an embedded
 * PostgreSQL kept under ./.tidemark/pg (created on first use, reused after;
 * shared by concurrent commands and stopped by the last to close), or a
 * throwaway one of this process's own with `--ephemeral`.
 */
export async function openDatabase(options: GlobalOptions, poolSize = 4): Promise<Database> {
  let { url } = checkGlobals(options);
  let embedded: EmbeddedPostgresHandle | undefined;
  let shared: Awaited<ReturnType<typeof attachOrStartEmbeddedPostgres>> | undefined;
  if (!url) {
    if (options.ephemeral) embedded = await startEmbeddedPostgres({ dataDir: resolve('.tidemark', `ephemeral-${process.pid}`), ephemeral: true });
    else shared = await attachOrStartEmbeddedPostgres({ dataDir: resolve('.tidemark', 'pg') });
    url = (embedded ?? shared)!.url;
  }
  const pool = createPool({ connectionString: url, max: poolSize, application_name: 'tidemark-cli' });
  // The shared server's last user stops it; this pool's backends, still
  // exiting after pool.end(), must not count as another user.
  const backends = new Set<number>();
  if (shared) pool.on('connect', (client) => backends.add((client as unknown as { processID: number }).processID));
  let closing: Promise<void> | undefined;
  return {
    pool,
    url,
    embedded: embedded !== undefined || shared !== undefined,
    close() {
      closing ??= (async () => {
        await pool.end();
        await embedded?.stop();
        await shared?.stop({ ownBackends: backends });
      })();
      return closing;
    },
  };
}

/** JSON with bigints as strings. */
export function json(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
}

/** Runs `make`, turning option validation errors into one-line usage errors that name CLI flags. */
export function configured<T>(make: () => T): T {
  try {
    return make();
  } catch (err) {
    if (err instanceof InvalidOptionsError) throw new CliError(inFlagTerms(err));
    throw err;
  }
}

/** Parses a positive integer flag; the message quotes the text as given (cut to 80 characters). */
export function positiveInt(text: string, flag: string): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < 1) throw new CliError(`${flag}: expected a positive integer, got ${echoValue(text)}`);
  return n;
}
