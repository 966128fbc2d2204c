/**
 * A private working directory for commands that use the shared embedded
 * server (./.tidemark/pg), and what a test reads of that server from the
 * outside: its postmaster.pid, whether its process lives, whether its port
 * answers.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { startCli } from './cli.js';

/** A postmaster as its postmaster.pid describes it. */
export interface Postmaster {
  pid: number;
  port: number;
  status: string;
}

const dirs = new Set<string>();
const children = new Set<ChildProcess>();
let hooked = false;

/**
 * The shared server is detached, so it outlives this test process too: if
 * the runner ends the process (a file timeout) before the tests' own
 * cleanup ran, stop what they left running on the way out.
 */
function stopAllOnExit(): void {
  if (hooked) return;
  hooked = true;
  const stopAll = () => {
    for (const child of children) child.kill('SIGKILL');
    for (const dir of dirs) {
      const left = postmaster(dir);
      if (left && processAlive(left.pid)) process.kill(left.pid, 'SIGINT');
    }
  };
  process.once('exit', stopAll);
  process.once('SIGTERM', () => {
    stopAll();
    process.exit(143);
  });
}

/** Kills `child` after the test, or when this process is ended first. */
export function track(t: TestContext, child: ChildProcess): ChildProcess {
  stopAllOnExit();
  children.add(child);
  child.once('exit', () => children.delete(child));
  t.after(() => child.kill('SIGKILL'));
  return child;
}

/** A fresh working directory; after the test, a server left running in it is stopped and the directory removed. */
export async function privateDir(t: TestContext): Promise<string> {
  const cwd = await mkdtemp(join(tmpdir(), 'tidemark-shared-'));
  await chmod(cwd, 0o755); // reachable by the server's user when the test runs as root
  stopAllOnExit();
  dirs.add(cwd);
  t.after(async () => {
    const left = postmaster(cwd);
    if (left && processAlive(left.pid)) {
      process.kill(left.pid, 'SIGINT');
      await until('the leftover server to stop', async () => !processAlive(left.pid), 30_000);
    }
    await rm(cwd, { recursive: true, force: true });
    dirs.delete(cwd);
  });
  return cwd;
}

/**
 * Starts `tidemark ...args` in `cwd` as the leader of a process group of its
 * own, as a shell starts a foreground job: `process.kill(-child.pid,
 * 'SIGINT')` then acts as Ctrl-C in a terminal, reaching every process of
 * the group.
 */
export function startCliGroup(args: string[], cwd: string): ChildProcess {
  return startCli(args, { cwd, detached: true });
}

/** The shared server's data directory under `cwd`. */
export function dataDir(cwd: string): string {
  return join(cwd, '.tidemark', 'pg');
}

/** The postmaster.pid of the shared server under `cwd`, if the file exists (line 1 pid, 4 port, 8 status). */
export function postmaster(cwd: string): Postmaster | undefined {
  const file = join(dataDir(cwd), 'postmaster.pid');
  if (!existsSync(file)) return undefined;
  let lines: string[];
  try {
    lines = readFileSync(file, 'utf8').split('\n');
  } catch {
    return undefined; // removed between the two calls
  }
  return { pid: Number(lines[0]), port: Number(lines[3]), status: lines[7]?.trim() ?? '' };
}

/** Whether `pid` runs (not a zombie waiting to be reaped). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.charAt(stat.lastIndexOf(')') + 2) !== 'Z';
  } catch {
    return true;
  }
}

/** Resolves with the error code of connecting to 127.0.0.1:`port`, or 'connected'. */
export function probePort(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

/** Polls `check` every 50 ms until it returns a truthy value; fails after `timeoutMs`. */
export async function until<T>(what: string, check: () => Promise<T | undefined | null | false>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
