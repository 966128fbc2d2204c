/**
 * A redis-server of one test's own (`/usr/bin/redis-server`), on a free
 * port of 127.0.0.1 with its append-only file (`appendfsync always`) in a
 * temporary directory, which the test may kill (SIGKILL) and restart on the
 * same port and directory: what Redis acknowledged survives. It is removed
 * after the test (`t.after`); a test process that is killed instead leaves
 * nothing behind either: a watchdog kills the server and removes its
 * directory once the test process is gone, as test/support/nats-server.ts does.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, unlink, writeFile } from 'node:fs/promises';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { freePort } from './nats-server.js';

const REDIS_SERVER = '/usr/bin/redis-server';

/** A running private redis-server and what a test may do to it. */
export interface RedisServer {
  /** `redis://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** The directory of the append-only file, kept across restarts. */
  readonly dir: string;
  /** Whether a server process is running. */
  readonly running: boolean;
  /** SIGKILLs the server (a crash); resolves once the process exited. */
  kill(): Promise<void>;
  /** Starts the server again on the same port and directory (after `kill`, or killing it first); resolves once it answers PING with PONG (its data loaded). */
  restart(): Promise<void>;
  /** SIGSTOPs the server and resolves once every thread of it stopped: connections stay open, nothing is read or answered. */
  pause(): Promise<void>;
  /** SIGCONTs a paused server. */
  resume(): void;
}

/** One attempt: resolves true once the server answers PING with +PONG (not -LOADING), false when refused, cut or not ready. */
function pongs(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: '127.0.0.1', port }, () => socket.write('PING\r\n'));
    let seen = '';
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(2000, () => done(false));
    socket.on('data', (d: Buffer) => {
      seen += d.toString('latin1');
      if (seen.includes('\r\n')) done(seen.startsWith('+PONG'));
    });
    socket.on('error', () => done(false));
    socket.on('close', () => done(false));
  });
}

/** Starts a private redis-server for test `t`; it is killed and its directory removed when the test ends. `config`: extra `--name value` arguments. */
export async function startRedisServer(t: TestContext, config: string[] = []): Promise<RedisServer> {
  const dir = await mkdtemp(join(tmpdir(), 'tidemark-redis-'));
  const pidFile = join(dir, 'server.pid.test');
  const logFile = join(dir, 'server.log');
  // As in nats-server.ts: the watchdog outlives a killed test process and kills the pid in the pid file.
  const watchdog = spawn(
    '/bin/sh',
    ['-c', 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; [ -f "$2" ] && kill -9 "$(cat "$2")" 2>/dev/null; rm -rf "$3"', 'tidemark-redis-watchdog', String(process.pid), pidFile, dir],
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
  const args = () => [
    '--bind', '127.0.0.1', '--port', String(port), '--dir', dir, '--logfile', logFile,
    '--appendonly', 'yes', '--appendfsync', 'always', '--save', '', '--daemonize', 'no', ...config,
  ];
  const startOnce = async (): Promise<boolean> => {
    const proc = spawn(REDIS_SERVER, args(), { stdio: 'ignore' });
    child = proc;
    exited = new Promise((resolve) => proc.once('exit', () => void unlink(pidFile).then(resolve, resolve)));
    const gone = exited.then(() => false);
    if (proc.pid !== undefined) await writeFile(pidFile, String(proc.pid));
    const deadline = Date.now() + 30_000;
    for (;;) {
      const ok = await Promise.race([pongs(port), gone]);
      if (ok) return true;
      if (proc.exitCode !== null || proc.signalCode !== null) return false;
      if (Date.now() > deadline) throw new Error(`redis-server on port ${port} did not answer PING within 30 s; see ${logFile}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  };
  const isRunning = () => child !== undefined && child.exitCode === null && child.signalCode === null;
  const kill = async () => {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill('SIGKILL');
    await exited;
  };

  let started = false;
  for (let attempt = 0; attempt < 5 && !started; attempt += 1) {
    started = await startOnce();
    if (!started) port = await freePort();
  }
  if (!started) {
    const log = await readFile(logFile, 'utf8').catch(() => '');
    throw new Error(`redis-server did not start:\n${log.slice(-2000)}`);
  }

  t.after(async () => {
    if (disposed) return;
    disposed = true;
    await kill();
    process.off('exit', onExit);
    watchdog.kill();
    await rm(dir, { recursive: true, force: true });
  });

  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    dir,
    get running() {
      return isRunning();
    },
    kill,
    async pause() {
      const pid = child?.pid;
      if (pid === undefined || !isRunning()) throw new Error('redis-server is not running');
      child!.kill('SIGSTOP');
      // The signal is delivered asynchronously: until each thread shows state T, the server may still answer.
      const stopped = async () => {
        const tasks = await readdir(`/proc/${pid}/task`);
        const states = await Promise.all(tasks.map(async (task) => (await readFile(`/proc/${pid}/task/${task}/stat`, 'utf8')).replace(/^.*\) /s, '')[0]));
        return states.every((state) => state === 'T' || state === 't');
      };
      const deadline = Date.now() + 10_000;
      while (!(await stopped())) {
        if (Date.now() > deadline) throw new Error('redis-server did not stop within 10 s of SIGSTOP');
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    },
    resume: () => void child?.kill('SIGCONT'),
    async restart() {
      await kill();
      if (!(await startOnce())) {
        const log = await readFile(logFile, 'utf8').catch(() => '');
        throw new Error(`redis-server did not start again on port ${port}:\n${log.slice(-2000)}`);
      }
    },
  };
}
