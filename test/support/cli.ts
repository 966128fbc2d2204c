/**
 * Runs the tidemark CLI as users run it: `bin/tidemark.js`, the published
 * entry point, over the compiled `dist/` (test/support/run.ts builds it
 * before any test starts). Every test that starts the CLI goes through here.
 */
import { spawn, type ChildProcess } from 'node:child_process';

/** The published entry point. */
export const cliBin = new URL('../../bin/tidemark.js', import.meta.url).pathname;

/** The command line that starts the CLI, for a shell: `${cliShell} tail ...`. */
export const cliShell = `'${process.execPath}' '${cliBin}'`;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

function env(extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const { DATABASE_URL: _ignored, ...base } = process.env;
  return { ...base, ...extra };
}

/**
 * Starts `tidemark ...args`; the caller owns the process. `detached`: as
 * the leader of a process group of its own, as a shell starts a foreground
 * job (`process.kill(-child.pid, 'SIGINT')` then acts as Ctrl-C).
 */
export function startCli(args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; detached?: boolean; stdout?: number } = {}): ChildProcess {
  return spawn(process.execPath, [cliBin, ...args], {
    env: env(options.env ?? {}),
    cwd: options.cwd,
    // `stdout`: a file descriptor of the caller's (a test writing to /dev/full).
    stdio: ['pipe', options.stdout ?? 'pipe', 'pipe'],
    detached: options.detached ?? false,
  });
}

/** Runs `tidemark ...args` to completion, with optional stdin. */
export function cli(args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; input?: string | Uint8Array } = {}): Promise<CliResult> {
  const child = startCli(args, options);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdin!.end(options.input ?? '');
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

/** Collects a running child's stderr and waits for a line matching `pattern`. */
export function watchStderr(child: ChildProcess): { text: () => string; next: (pattern: RegExp, timeoutMs?: number) => Promise<RegExpMatchArray> } {
  let text = '';
  const waiters = new Set<() => void>();
  child.stderr!.on('data', (d: Buffer) => {
    text += d.toString();
    for (const w of [...waiters]) w();
  });
  return {
    text: () => text,
    next: (pattern, timeoutMs = 60_000) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const m = text.match(pattern);
          if (!m) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(m);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`timed out waiting for ${pattern} in stderr:\n${text}`));
        }, timeoutMs);
        waiters.add(check);
        check();
      }),
  };
}

/** Resolves with the exit code (or signal name) once the child has exited. */
export function exited(child: ChildProcess): Promise<number | string> {
  if (child.exitCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal ?? -1)));
}
