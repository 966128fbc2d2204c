/**
 * A nats-server of one test's own (`/usr/sbin/nats-server -js`), on a free
 * port of 127.0.0.1 with a temporary JetStream store, which the test may
 * kill (SIGKILL), stop and start again on the same port and store. It is
 * removed after the test (`t.after`); a test process that is killed instead
 * leaves nothing behind either: a watchdog kills the server and removes its
 * directory once the test process is gone, as test/support/private-pg.ts
 * does for PostgreSQL.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, unlink, writeFile } from 'node:fs/promises';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';

const NATS_SERVER = '/usr/sbin/nats-server';

/** How {@link startNatsServer} configures the server. */
export interface NatsServerOptions {
  /** Extra server configuration (nats-server config syntax), e.g. `max_payload: 2048`. */
  config?: string;
  /** Start with JetStream (`-js`). Default true. */
  jetstream?: boolean;
}

/** A running private nats-server and what a test may do to it. */
export interface NatsServer {
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** The JetStream store directory (`-sd`), kept across restarts. */
  readonly storeDir: string;
  /** Whether a server process is running. */
  readonly running: boolean;
  /** SIGKILLs the server (no shutdown: a crash); resolves once the process exited. */
  kill(): Promise<void>;
  /** Stops the server cleanly (SIGTERM); resolves once the process exited. */
  stop(): Promise<void>;
  /** Starts the server again on the same port and store; resolves once it accepts clients. */
  start(): Promise<void>;
  /** SIGSTOPs the server and resolves once every thread of it stopped: connections stay open, nothing is read or answered. */
  pause(): Promise<void>;
  /** SIGCONTs a paused server. */
  resume(): void;
}

/** A port nothing listens on right now: the embedded server's helper, shared. */
export { freePort } from '../../src/db/embedded.js';
import { freePort } from '../../src/db/embedded.js';

/** One attempt: connects to the port and resolves true once the server's INFO line arrives, false when refused or cut. */
function greets(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: '127.0.0.1', port });
    let seen = '';
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(2000, () => done(false));
    socket.on('data', (d: Buffer) => {
      seen += d.toString('latin1');
      if (seen.startsWith('INFO ')) done(true);
    });
    socket.on('error', () => done(false));
    socket.on('close', () => done(false));
  });
}

/**
 * Starts a private nats-server for test `t`; it is killed and its directory
 * removed when the test ends.
 */
export async function startNatsServer(t: TestContext, options: NatsServerOptions = {}): Promise<NatsServer> {
  const dir = await mkdtemp(join(tmpdir(), 'tidemark-nats-'));
  const storeDir = join(dir, 'store');
  await mkdir(storeDir);
  const configFile = join(dir, 'nats.conf');
  await writeFile(configFile, `# tidemark test/support/nats-server.ts\n${options.config ?? ''}\n`);
  const pidFile = join(dir, 'server.pid');
  const logFile = join(dir, 'server.log');

  // The server is this process's child, so it outlives a killed test process:
  // the watchdog (detached, so it survives the test's process group too)
  // waits for this process to go, then kills the pid in the pid file and
  // removes the directory. The pid file is written at spawn and removed once
  // the process exited, so the watchdog never kills a recycled pid of ours.
  const watchdog = spawn(
    '/bin/sh',
    ['-c', 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; [ -f "$2" ] && kill -9 "$(cat "$2")" 2>/dev/null; rm -rf "$3"', 'tidemark-nats-watchdog', String(process.pid), pidFile, dir],
    { detached: true, stdio: 'ignore' },
  );
  watchdog.unref();

  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  let disposed = false;
  const onExit = () => {
    if (child?.pid !== undefined && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  };
  process.on('exit', onExit);

  let port = await freePort();
  const args = () => {
    const a = ['-a', '127.0.0.1', '-p', String(port), '-c', configFile, '-l', logFile];
    return options.jetstream === false ? a : ['-js', '-sd', storeDir, ...a];
  };

  const startOnce = async (): Promise<boolean> => {
    const proc = spawn(NATS_SERVER, args(), { stdio: 'ignore' });
    child = proc;
    // `exited` settles only after the pid file is gone, so a restart's new
    // pid file can never be removed by the old process's exit.
    exited = new Promise((resolve) => proc.once('exit', () => void unlink(pidFile).then(resolve, resolve)));
    const gone = exited.then(() => false);
    if (proc.pid !== undefined) await writeFile(pidFile, String(proc.pid));
    const deadline = Date.now() + 30_000;
    for (;;) {
      // The process ending first (a port taken since freePort, a bad config) wins the race.
      const ok = await Promise.race([greets(port), gone]);
      if (ok) return true;
      if (proc.exitCode !== null || proc.signalCode !== null) return false;
      if (Date.now() > deadline) throw new Error(`nats-server on port ${port} did not accept clients within 30 s; see ${logFile}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  };
  const isRunning = () => child !== undefined && child.exitCode === null && child.signalCode === null;
  const waitExit = async (signal: NodeJS.Signals) => {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill(signal);
    await exited;
  };

  // The first start may lose its port to another process between freePort
  // and the bind: try a fresh port a few times. Restarts keep the port.
  let started = false;
  for (let attempt = 0; attempt < 5 && !started; attempt += 1) {
    started = await startOnce();
    if (!started) port = await freePort();
  }
  if (!started) {
    const log = await readFile(logFile, 'utf8').catch(() => '');
    throw new Error(`nats-server did not start:\n${log.slice(-2000)}`);
  }

  t.after(async () => {
    if (disposed) return;
    disposed = true;
    await waitExit('SIGKILL');
    process.off('exit', onExit);
    watchdog.kill();
    await rm(dir, { recursive: true, force: true });
  });

  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    get running() {
      return isRunning();
    },
    kill: () => waitExit('SIGKILL'),
    async pause() {
      const pid = child?.pid;
      if (pid === undefined || !isRunning()) throw new Error('nats-server is not running');
      child!.kill('SIGSTOP');
      // The signal is delivered asynchronously: until each thread shows state T, the server may still answer.
      const stopped = async () => {
        const tasks = await readdir(`/proc/${pid}/task`);
        const states = await Promise.all(tasks.map(async (task) => (await readFile(`/proc/${pid}/task/${task}/stat`, 'utf8')).replace(/^.*\) /s, '')[0]));
        return states.every((state) => state === 'T' || state === 't');
      };
      const deadline = Date.now() + 10_000;
      while (!(await stopped())) {
        if (Date.now() > deadline) throw new Error('nats-server did not stop within 10 s of SIGSTOP');
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    },
    resume: () => void child?.kill('SIGCONT'),
    stop: () => waitExit('SIGTERM'),
    async start() {
      if (isRunning()) throw new Error('nats-server is already running');
      if (!(await startOnce())) {
        const log = await readFile(logFile, 'utf8').catch(() => '');
        throw new Error(`nats-server did not start again on port ${port}:\n${log.slice(-2000)}`);
      }
    },
  };
}
