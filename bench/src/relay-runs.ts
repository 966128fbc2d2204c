/**
 * What the relay scenarios (NATS, Redis, webhooks) share: the backlog they
 * relay, a library relay timed until it reaches the backlog's end, and the
 * peak RSS of a `tidemark relay` process draining a large backlog.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { Relay, type Sink } from 'tidemark';

/** Events per page of the relays measured. */
export const RELAY_BATCH = 500;

/** `n` small events of `stream`, 100,000 per statement, each with a traceparent header. */
export async function preloadBacklog(pool: pg.Pool, stream: string, n: number): Promise<void> {
  for (let done = 0; done < n; done += 100_000) {
    await pool.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload, headers)
       SELECT $1, 'order.placed', 'k' || (g % 64), jsonb_build_object('id', g, 'total', g % 1000, 'note', 'a typical small event body'), '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
         FROM generate_series($2::bigint, $3::bigint) g`,
      [stream, done + 1, Math.min(n, done + 100_000)],
    );
  }
}

/** Relays stream `bench` to `sink` with a fresh cursor (`consumer`); the time until its cursor reached `last`. */
export async function relayBacklog(pool: pg.Pool, sink: Sink, consumer: string, last: bigint): Promise<number> {
  let reached!: () => void;
  const done = new Promise<void>((resolve) => (reached = resolve));
  const relay = new Relay(pool, sink, {
    consumer,
    streams: ['bench'],
    batchSize: RELAY_BATCH,
    listen: false,
    observer: (e) => {
      if (e.type === 'published' && e.cursor >= last) reached();
    },
  });
  const stop = new AbortController();
  const start = performance.now();
  const running = relay.run(stop.signal);
  await Promise.race([done, running]);
  const ms = performance.now() - start;
  stop.abort();
  await running;
  await relay.close();
  return ms;
}

/**
 * Runs `tidemark relay ... --consumer memory --stream <stream> <sinkArgs>`
 * as a child process until its cursor reaches the stream's last event; its
 * peak RSS (VmHWM), or undefined without /proc or a built CLI. `shown`
 * prefixes the command as reported (an environment variable it needs).
 */
export async function relayProcessPeak(
  pool: pg.Pool,
  dbUrl: string,
  stream: string,
  sinkArgs: string[],
  env: NodeJS.ProcessEnv = {},
  shown = '',
): Promise<{ peakMb: number; seconds: number; command: string } | undefined> {
  const bin = fileURLToPath(new URL('../../bin/tidemark.js', import.meta.url));
  const built = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));
  if (!existsSync('/proc/self/status') || !existsSync(built)) return undefined;
  const last = BigInt((await pool.query<{ max: string }>('SELECT max(seq)::text AS max FROM tidemark.events WHERE stream = $1', [stream])).rows[0]!.max);
  const args = ['relay', '--database-url', dbUrl, '--consumer', 'memory', '--stream', stream, ...sinkArgs];
  // Run as a user runs it: through its shebang (env execs node in place, so the pid is node's).
  const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const start = performance.now();
  let peakKb = 0;
  try {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`tidemark relay exited with ${child.exitCode}: ${stderr.trim()}`);
      const status = await readFile(`/proc/${child.pid}/status`, 'utf8').catch(() => '');
      peakKb = Math.max(peakKb, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
      const r = await pool.query<{ seq: string }>(`SELECT seq FROM tidemark.cursors WHERE consumer = 'memory' AND stream = $1`, [stream]);
      if (r.rows[0] && BigInt(r.rows[0].seq) >= last) break;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    const seconds = (performance.now() - start) / 1000;
    const status = await readFile(`/proc/${child.pid}/status`, 'utf8');
    peakKb = Math.max(peakKb, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
    return { peakMb: peakKb / 1024, seconds, command: `${shown}tidemark ${args.map((a) => (a === dbUrl ? '<db>' : a)).join(' ')}` };
  } finally {
    child.kill('SIGTERM');
    await exited;
  }
}
