/**
 * A nats-server of the bench's own (`nats-server -js` on a free port, with a
 * temporary store), so the relay scenario measures a broker nothing else
 * uses. The binary is `TIDEMARK_NATS_SERVER`, else `nats-server` on PATH or
 * /usr/sbin/nats-server.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { freePort } from 'tidemark/embedded';
import { join } from 'node:path';

export interface BenchNats {
  url: string;
  close(): Promise<void>;
}

function binary(): string | undefined {
  if (process.env.TIDEMARK_NATS_SERVER) return process.env.TIDEMARK_NATS_SERVER;
  for (const dir of (process.env.PATH ?? '').split(':').concat('/usr/sbin', '/usr/local/bin')) {
    if (dir && existsSync(join(dir, 'nats-server'))) return join(dir, 'nats-server');
  }
  return undefined;
}


function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.once('data', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** Starts the server; rejects with a reason the report can show when there is no binary or it does not come up. */
export async function startBenchNats(): Promise<BenchNats> {
  const bin = binary();
  if (!bin) throw new Error('nats-server not found (set TIDEMARK_NATS_SERVER)');
  const dir = await mkdtemp(join(tmpdir(), 'tidemark-bench-nats-'));
  const port = await freePort();
  const child: ChildProcess = spawn(bin, ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', dir], { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const close = async () => {
    if (child.exitCode === null) child.kill('SIGTERM');
    await exited;
    await rm(dir, { recursive: true, force: true });
  };
  for (let i = 0; i < 200; i += 1) {
    if (child.exitCode !== null) break;
    if (await accepts(port)) return { url: `nats://127.0.0.1:${port}`, close };
    await new Promise((r) => setTimeout(r, 50));
  }
  await close();
  throw new Error(`nats-server did not accept connections on port ${port}`);
}
