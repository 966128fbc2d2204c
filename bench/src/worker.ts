/**
 * A child process of the benchmark, so that it can be killed (SIGKILL) or
 * measured (CPU) on its own:
 *   consume <contender> <url> <cursor> <batch>   record deliveries until killed or SIGTERM
 *   write <contender> <url> <writers> <tx/s> <events/tx> <ms> <idBase> <keyPrefix>   open-loop load; sends commit times over IPC
 *   watermark <tidemark|reference> <url> <stepMs|default>   run a watermarker until told to stop; sends its hold times
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { recordDelivered } from './checker.js';
import { contenderById } from './contenders/index.js';
import { runLoad, setIdBase } from './load.js';
import { runWatermarkerChild } from './scenarios/watermarkers.js';

/** Starts `worker.ts` (or `.js` when compiled) with the same loader as this process. */
export function spawnWorker(args: string[]): ChildProcess {
  const file = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? './worker.ts' : './worker.js', import.meta.url));
  // The loader flags (tsx, when running from source), not the test runner's.
  const execArgv = process.execArgv.filter((arg) => !arg.startsWith('--test'));
  return spawn(process.execPath, [...execArgv, file, ...args], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
}

async function main(argv: string[]): Promise<void> {
  const [mode, ...rest] = argv;
  const stop = new AbortController();
  process.on('SIGTERM', () => stop.abort());
  process.on('message', (m) => {
    if (m === 'stop') stop.abort();
  });
  if (mode === 'consume') {
    const [id, url, cursor, batch] = rest as [string, string, string, string];
    const contender = contenderById(id);
    process.send?.({ type: 'ready' });
    await contender.consume(url, (tx, events) => recordDelivered(tx, cursor, events), {
      name: cursor,
      batchSize: Number(batch),
      signal: stop.signal,
    });
  } else if (mode === 'write') {
    const [id, url, writers, rate, perTx, ms, base, prefix] = rest as [string, string, string, string, string, string, string, string];
    setIdBase(Number(base));
    const commits: [number, number][] = [];
    const result = await runLoad(contenderById(id), url, {
      writers: Number(writers),
      txPerSec: Number(rate),
      eventsPerTx: () => Number(perTx),
      durationMs: Number(ms),
      keyPrefix: prefix,
      onCommit: (events, at) => {
        for (const e of events) commits.push([e.id, at]);
      },
    });
    await send({ type: 'write', commits, result: { ...result, latency: result.latency.toJSON() } });
  } else if (mode === 'watermark') {
    const [kind, url, step] = rest as [string, string, string];
    const hold = await runWatermarkerChild(kind, url, step, stop.signal);
    await send({ type: 'watermark', hold: hold.toJSON() });
  } else {
    throw new Error(`worker: unknown mode ${String(mode)}`);
  }
}

function send(message: unknown): Promise<void> {
  return new Promise((resolve, reject) => process.send!(message, (err: Error | null) => (err ? reject(err) : resolve())));
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).then(
    () => process.exit(0),
    (err: unknown) => {
      process.stderr.write(`bench worker: ${(err as Error).stack ?? String(err)}\n`);
      process.exit(1);
    },
  );
}
