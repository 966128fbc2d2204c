import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { after, test, type TestContext } from 'node:test';
import { promisify } from 'node:util';
import { connect } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import { closeAdmin, testDb, waitFor } from './support/db.js';
import { exited, startCli } from './support/cli.js';
import { root, runExample } from './support/examples.js';
import { freePort, startNatsServer } from './support/nats-server.js';
import { startRedisServer } from './support/redis-server.js';
import { Watermarker } from '../src/index.js';
import { CloudEvent, HTTP } from 'cloudevents';

// The README's relay walkthrough and broker examples, against NATS and RabbitMQ.

after(closeAdmin);

/**
 * A RabbitMQ vhost of the test's own on the shared broker (deleted after
 * the test), so the examples' fixed names cannot meet another run's; its AMQP URL.
 */
async function ownVhost(t: TestContext, label: string): Promise<string> {
  const vhost = `tidemark-${label}-${process.pid}-${Date.now()}`;
  const ctl = (...args: string[]) => promisify(execFile)('rabbitmqctl', args, { timeout: 60_000 });
  await ctl('add_vhost', vhost);
  t.after(() => ctl('delete_vhost', vhost).catch(() => undefined));
  await ctl('set_permissions', '-p', vhost, 'guest', '.*', '.*', '.*');
  return `amqp://guest:guest@127.0.0.1:5672/${encodeURIComponent(vhost)}`;
}

test('the README shows examples/relay.ts and examples/jetstream-consumer.ts verbatim, and they run as shown, again and again', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  for (const name of ['relay.ts', 'jetstream-consumer.ts']) {
    assert.ok(readme.includes((await readFile(new URL(`examples/${name}`, root), 'utf8')).trim()), `README.md embeds examples/${name}`);
  }
  const nats = await startNatsServer(t);
  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const run = (name: string) => runExample(name, { DATABASE_URL: db.url, NATS_URL: nats.url });
  // A stream with nothing in it yet: the consumer reads nothing and ends (it used to wait forever).
  const nc = await connect({ servers: nats.url });
  await (await jetstreamManager(nc)).streams.add({ name: 'TIDEMARK', subjects: ['tidemark.orders.>'] });
  await nc.close();
  assert.equal(await run('jetstream-consumer.ts'), '', 'an empty stream: nothing printed, and the example ends');
  assert.equal(await run('relay.ts'), 'relayed orders through seq 2\n');
  const line = (seq: number, total: number) => `tidemark.orders.order.placed seq ${seq}: {"total": ${total}}\n`;
  assert.equal(await run('jetstream-consumer.ts'), line(1, 42) + line(2, 7));
  assert.equal(await run('relay.ts'), 'relayed orders through seq 4\n', 'a second run relays only the new events');
  assert.equal(await run('jetstream-consumer.ts'), line(1, 42) + line(2, 7) + line(3, 42) + line(4, 7), 'each event once, in seq order');
});

/** The command lines of the README's relay walkthrough, in order: every line of its ```sh blocks before its first subsection. */
async function relayWalkthrough(): Promise<string[]> {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const start = readme.indexOf('## Relaying to a broker');
  return shLines(readme.slice(start, readme.indexOf('\n### ', start)));
}

/** Every line of the ```sh blocks of `text`. */
function shLines(text: string): string[] {
  return [...text.matchAll(/```sh\n([\s\S]*?)```/g)].flatMap((m) => m[1]!.split('\n').filter(Boolean));
}

/** The text of the README's subsection `### <title>`, up to the next heading. */
async function readmeSubsection(title: string): Promise<string> {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const start = readme.indexOf(`\n### ${title}\n`);
  assert.ok(start >= 0, `README.md has a section "### ${title}"`);
  const end = readme.slice(start + 1).search(/\n##+ /);
  return readme.slice(start, end < 0 ? undefined : start + 1 + end);
}

/**
 * Runs one command line of the README as a shell runs it, from the
 * checkout (`npx tidemark` is this package's bin there), with the
 * addresses of this test's own servers put in for the machine's.
 */
function shell(line: string, env: NodeJS.ProcessEnv): ChildProcess {
  // A process group of its own, as a terminal's foreground job: Ctrl-C is
  // SIGINT to the whole group (npx and the node process it starts).
  // Assignments a line starts with (`PORT=8787 npx ...`) go before the exec, as a shell takes them.
  const [, assignments, command] = /^((?:[A-Za-z_]\w*=\S* )*)([\s\S]*)$/.exec(line)!;
  return spawn('sh', ['-c', `${assignments}exec ${command}`], { cwd: new URL('.', root).pathname, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
}

/** A relay stopped by Ctrl-C: it says so last; npx itself ends by the signal, as in a terminal (exit status 130). */
function stoppedCleanly(r: { code: number | string; stderr: string }): void {
  assert.match(r.stderr, /\ntidemark relay: SIGINT: stopping\ntidemark relay: stopped\n$/, r.stderr);
  assert.ok(r.code === 0 || r.code === 'SIGINT', String(r.code));
}

/** After the test: whatever is left of `child`'s job. */
function killGroup(child: ChildProcess): void {
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    // the job is gone
  }
}

/** Ctrl-C in the terminal of `child`'s job. */
function ctrlC(child: ChildProcess): void {
  process.kill(-child.pid!, 'SIGINT');
}

async function finished(child: ChildProcess): Promise<{ code: number | string; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  return { code: await exited(child), stdout, stderr };
}

test('the README\'s relay walkthrough runs as written, command by command, against NATS and RabbitMQ', { timeout: 240_000 }, async (t) => {
  const lines = await relayWalkthrough();
  assert.deepEqual(lines.map((l) => l.split(' ').slice(0, 3).join(' ')), [
    'npx tidemark relay',
    'npx tsx examples/jetstream-consumer.ts',
    'npx tidemark relay',
    'npx tsx examples/rabbitmq-consumer.ts',
    'npx tidemark relay',
    'npx tsx examples/rabbitmq-consumer.ts',
  ]);
  const nats = await startNatsServer(t);
  const httpPort = await freePort();
  const amqp = await ownVhost(t, 'walkthrough');
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url, NATS_URL: nats.url, AMQP_URL: amqp };
  const ours = (line: string) =>
    line.replaceAll('nats://127.0.0.1:4222', nats.url).replaceAll('amqp://guest:guest@127.0.0.1:5672', amqp).replaceAll('127.0.0.1:9465', `127.0.0.1:${httpPort}`);
  const order = async (stream: string, key: string, total: number) => {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ($1, 'order.placed', $2, $3)`, [stream, key, { total }]);
    const watermarker = new Watermarker(db.pool(), { owner: 'readme' });
    await watermarker.step();
    await watermarker.close(); // lets the lease go: examples/relay.ts steps with a watermarker of its own
  };
  const cursor = async (consumer: string, stream: string) =>
    (await db.observer.query<{ seq: string }>(`SELECT seq::text AS seq FROM tidemark.cursors WHERE consumer = $1 AND stream = $2`, [consumer, stream])).rows[0]?.seq;
  /** A relay command: runs until its cursors reach `through`, then Ctrl-C (SIGINT); it must exit 0. */
  const relayUntil = async (line: string, consumer: string, through: Record<string, string>) => {
    const child = shell(ours(line), env);
    const done = finished(child);
    t.after(() => killGroup(child));
    await waitFor(`${line} to relay through ${JSON.stringify(through)}`, async () => {
      for (const [stream, seq] of Object.entries(through)) if ((await cursor(consumer, stream)) !== seq) return false;
      return true;
    });
    ctrlC(child);
    stoppedCleanly(await done);
  };
  const run = async (line: string) => {
    const r = await finished(shell(ours(line), env));
    assert.equal(r.code, 0, `${line}: ${r.stderr}`);
    return r.stdout;
  };
  const natsLine = (seq: number, stream: string, total: number) => `tidemark.${stream}.order.placed seq ${seq}: {"total": ${total}}\n`;

  await order('orders', 'o-1', 42);
  await order('orders', 'o-2', 7);
  await relayUntil(lines[0]!, 'to-nats', { orders: '2' });
  assert.equal(await run(lines[1]!), natsLine(1, 'orders', 42) + natsLine(2, 'orders', 7));
  // A second stream: --create-stream widens TIDEMARK's subjects; --from now starts its cursor at the present.
  await order('payments', 'p-1', 5); // seq 3: before the relay of payments started, so not relayed
  await order('orders', 'o-3', 1); // seq 4
  const widened = shell(ours(lines[2]!), env);
  const widenedDone = finished(widened);
  t.after(() => killGroup(widened));
  // The two streams are relayed independently, so JetStream holds them in the order each was published:
  // orders' seq 4 goes out before payments' seq 5 is written, which makes that order the order below.
  await waitFor('the payments cursor to start at the present, and orders to be relayed through seq 4', async () =>
    (await cursor('to-nats', 'payments')) === '4' && (await cursor('to-nats', 'orders')) === '4');
  await order('payments', 'p-2', 6); // seq 5
  await waitFor('both cursors to reach seq 5', async () => (await cursor('to-nats', 'orders')) === '4' && (await cursor('to-nats', 'payments')) === '5');
  ctrlC(widened);
  stoppedCleanly(await widenedDone);
  assert.equal(await run(lines[1]!), natsLine(1, 'orders', 42) + natsLine(2, 'orders', 7) + natsLine(4, 'orders', 1) + natsLine(5, 'payments', 6));
  // The TypeScript relay of the same destination goes on from the same cursors.
  assert.equal(await runExample('relay.ts', env), 'relayed orders through seq 7\n');
  assert.equal(await run(lines[1]!), natsLine(1, 'orders', 42) + natsLine(2, 'orders', 7) + natsLine(4, 'orders', 1) + natsLine(5, 'payments', 6) + natsLine(6, 'orders', 42) + natsLine(7, 'orders', 7));

  // RabbitMQ: the consumer declares its queue, the relay fills it, the consumer reads it.
  assert.equal(await run(lines[3]!), '', 'the first run declares the queue; nothing was relayed yet');
  await relayUntil(lines[4]!, 'to-rabbit', { orders: '7' });
  const rabbitLine = (seq: number, total: number) => `orders.order.placed tidemark:${seq}: {"total": ${total}}\n`;
  assert.equal(await run(lines[5]!), [[1, 42], [2, 7], [4, 1], [6, 42], [7, 7]].map(([seq, total]) => rabbitLine(seq!, total!)).join(''));
});

test('the README shows examples/rabbitmq-consumer.ts verbatim, and with the relay command it shows, each event arrives', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  assert.ok(readme.includes((await readFile(new URL('examples/rabbitmq-consumer.ts', root), 'utf8')).trim()), 'README.md embeds examples/rabbitmq-consumer.ts');
  assert.ok(readme.includes('npx tidemark relay --to amqp://guest:guest@127.0.0.1:5672 --consumer to-rabbit --stream orders --exchange tidemark\n'));
  const amqp = await ownVhost(t, 'readme');
  const db = await testDb(t);
  for (const [key, total] of [['o-1', 42], ['o-2', 7]] as const) {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'order.placed', $1, $2)`, [key, { total }]);
  }
  await new Watermarker(db.pool(), { owner: 'readme' }).step();
  const consumer = () => runExample('rabbitmq-consumer.ts', { AMQP_URL: amqp });
  assert.equal(await consumer(), '', 'the first run declares the queue; nothing was relayed yet');
  const relay = startCli(['relay', '--database-url', db.url, '--to', amqp, '--consumer', 'to-rabbit', '--stream', 'orders', '--exchange', 'tidemark']);
  try {
    await waitFor('the relay to commit its cursor', async () => {
      const r = await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = 'to-rabbit'`);
      return r.rows[0]?.seq === '2';
    });
  } finally {
    relay.kill('SIGTERM');
  }
  assert.equal(await exited(relay), 0);
  assert.equal(await consumer(), 'orders.order.placed tidemark:1: {"total": 42}\norders.order.placed tidemark:2: {"total": 7}\n');
});

test('the README\'s CloudEvents command runs as written: every message is a valid CloudEvent whose data is the payload\'s text, shaped as the README shows', async (t) => {
  const section = await readmeSubsection('CloudEvents');
  const [line, ...more] = shLines(section);
  assert.deepEqual(more, [], 'one command');
  const shown = JSON.parse(/```json\n(.*)\n```/.exec(section)![1]!) as Record<string, unknown>;
  const nats = await startNatsServer(t);
  const db = await testDb(t);
  for (const [key, total] of [['o-1', 42], ['o-2', 7]] as const) {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'order.placed', $1, $2)`, [key, { total }]);
  }
  const watermarker = new Watermarker(db.pool(), { owner: 'readme' });
  await watermarker.step();
  await watermarker.close();
  const origin = (await db.observer.query<{ origin: string }>('SELECT origin::text AS origin FROM tidemark.watermark')).rows[0]!.origin;
  const child = shell(line!.replaceAll('nats://127.0.0.1:4222', nats.url), { DATABASE_URL: db.url });
  const done = finished(child);
  t.after(() => killGroup(child));
  await waitFor('the relay to reach seq 2', async () =>
    (await db.observer.query(`SELECT 1 FROM tidemark.cursors WHERE consumer = 'to-cloudevents' AND stream = 'orders' AND seq = 2`)).rowCount === 1);
  ctrlC(child);
  stoppedCleanly(await done);
  const nc = await connect({ servers: nats.url });
  t.after(() => nc.close());
  const jsm = await jetstreamManager(nc);
  for (const [i, [key, total]] of ([['o-1', 42], ['o-2', 7]] as const).entries()) {
    const m = (await jsm.streams.getMessage('CLOUDEVENTS', { seq: i + 1 }))!;
    assert.equal(m.subject, 'ce.orders.order.placed');
    assert.equal(m.header?.get('content-type'), 'application/cloudevents+json');
    const body = new TextDecoder().decode(m.data);
    const event = HTTP.toEvent({ headers: { 'content-type': 'application/cloudevents+json' }, body }) as CloudEvent<unknown>;
    assert.equal(event.validate(), true);
    assert.equal(event.id, `${origin}:${i + 1}`);
    assert.equal(event.subject, key);
    assert.ok(body.endsWith(`,"data":{"total": ${total}}}`), body);
    const parsed = JSON.parse(body) as Record<string, unknown>;
    assert.deepEqual(Object.keys(parsed), Object.keys(shown), 'the attributes the README shows, in its order');
    if (i === 0) assert.deepEqual({ ...parsed, id: '', time: '' }, { ...shown, id: '', time: '' }, 'the README\'s envelope, but for the origin id and the time');
  }
});

test('the README\'s Redis Streams commands run as written: the relay, then redis-cli reads each event once, in seq order, payloads as stored', async (t) => {
  const lines = shLines(await readmeSubsection('Redis Streams'));
  assert.deepEqual(lines.map((l) => l.split(' ').slice(0, 3).join(' ')), ['npx tidemark relay', 'redis-cli XRANGE tidemark:orders']);
  const redis = await startRedisServer(t);
  const db = await testDb(t);
  const ours = (line: string) => line.replaceAll('redis://127.0.0.1:6379', redis.url).replace(/^redis-cli /, `redis-cli -p ${redis.port} `);
  for (const [key, total] of [['o-1', 42], ['o-2', 7]] as const) {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'order.placed', $1, $2)`, [key, { total }]);
  }
  const watermarker = new Watermarker(db.pool(), { owner: 'readme' });
  await watermarker.step();
  await watermarker.close();
  const child = shell(ours(lines[0]!), { DATABASE_URL: db.url });
  const done = finished(child);
  t.after(() => killGroup(child));
  await waitFor('the relay to reach seq 2', async () =>
    (await db.observer.query(`SELECT 1 FROM tidemark.cursors WHERE consumer = 'to-redis' AND stream = 'orders' AND seq = 2`)).rowCount === 1);
  ctrlC(child);
  stoppedCleanly(await done);
  const read = await finished(shell(ours(lines[1]!), {}));
  assert.equal(read.code, 0, read.stderr);
  const out = read.stdout.split('\n');
  // redis-cli prints each entry's id, then its fields and values, one a line.
  assert.deepEqual(out.filter((l) => /^\d+-0$/.test(l)), ['1-0', '2-0'], read.stdout);
  assert.ok(out.includes('{"total": 42}') && out.includes('{"total": 7}'), read.stdout);
});

test('the README\'s HTTP webhooks commands run as written: the receiver it starts checks each signature and prints each relayed event once', async (t) => {
  const lines = shLines(await readmeSubsection('HTTP webhooks'));
  assert.deepEqual(lines.map((l) => l.split(' ').slice(0, 2).join(' ')), ['export TIDEMARK_WEBHOOK_SECRET=whsec_$(openssl', 'PORT=8787 npx', 'npx tidemark']);
  // The first line as a shell runs it: the secret it exports, shared by both terminals.
  const exported = await finished(shell(`sh -c '${lines[0]!.replaceAll("'", "'\\''")}; printf %s "$TIDEMARK_WEBHOOK_SECRET"'`, {}));
  assert.equal(exported.code, 0, exported.stderr);
  const env = { TIDEMARK_WEBHOOK_SECRET: exported.stdout };
  assert.match(exported.stdout, /^whsec_[A-Za-z0-9+/]{43}=$/);
  const port = String(await freePort());
  const db = await testDb(t);
  for (const [key, total] of [['o-1', 42], ['o-2', 7]] as const) {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'order.placed', $1, $2)`, [key, { total }]);
  }
  const watermarker = new Watermarker(db.pool(), { owner: 'readme' });
  await watermarker.step();
  await watermarker.close();
  const receiver = shell(lines[1]!.replaceAll('8787', port), env);
  const received = finished(receiver);
  t.after(() => killGroup(receiver));
  let printed = '';
  receiver.stdout!.on('data', (d: Buffer) => (printed += d.toString()));
  const relay = shell(lines[2]!.replaceAll('8787', port), { ...env, DATABASE_URL: db.url });
  const relayed = finished(relay);
  t.after(() => killGroup(relay));
  await waitFor('the receiver to print both events', async () => printed.split('\n').length > 2);
  ctrlC(relay);
  stoppedCleanly(await relayed);
  ctrlC(receiver);
  await received;
  assert.deepEqual(printed.trim().split('\n').sort(), ['1 orders order.placed o-1: {"total": 42}', '2 orders order.placed o-2: {"total": 7}']);
});
