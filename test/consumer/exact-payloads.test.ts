/**
 * What a reader gets is what PostgreSQL stored: payloads and headers with
 * numbers no JavaScript number holds, deep nesting, every escape and
 * characters outside the BMP, appended through the library, the CLI and
 * plain SQL, come out of a StreamClient handler's text, `tail --json`,
 * `tail` (TSV), `read_page`, a NATS body and a RabbitMQ body byte for byte
 * as `SELECT payload::text` gives them; the parsed value refuses to change
 * a number.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, test } from 'node:test';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect as natsConnect } from '@nats-io/transport-node';
import { connect as amqpConnect } from 'amqplib';
import { append, InexactNumberError, StreamClient, Watermarker, type StreamEvent } from '../../src/index.js';
import { firstInexactNumber, parseExact, readsText, streamEventFor, type EventText } from '../../src/consumer/exact-json.js';
import { cli, exited, startCli } from '../support/cli.js';
import { closeAdmin, testDb, waitFor, type TestDb } from '../support/db.js';
import { startNatsServer } from '../support/nats-server.js';

after(closeAdmin);

/** Every character JSON escapes, and some it need not: quote, backslash, slash, DEL, the line separators. */
const ESCAPES = `${Array.from({ length: 31 }, (_, i) => String.fromCharCode(i + 1)).join('')}"\\/\u007f\u2028\u2029`;
const NON_BMP = 'emoji 😀, clef 𝄞, han 𠀀';
const deep = (depth: number): string => `${'{"a": ['.repeat(depth)}1${']}'.repeat(depth)}`;

/** Payloads as JSON text, written through the CLI and SQL as they are. */
const TEXTS = [
  '{"id": 12345678901234567890, "huge": 1e400, "tiny": 1e-400, "negative zero": -0, "trailing": 1.50}',
  `{"deep": ${deep(60)}}`,
  JSON.stringify({ escapes: ESCAPES, nonBmp: NON_BMP, long: `${ESCAPES}${NON_BMP}`.repeat(200) }),
  '{"safe": 9007199254740991, "unsafe": 9007199254740993, "fraction": 0.1, "exponent": 2.5E-3}',
];
const HEADERS = '{"trace": "t-1", "n": 98765432109876543210}';

/** Writes the events: the texts through SQL and the CLI (flags and NDJSON), values through the library. */
async function write(db: TestDb, stream: string): Promise<void> {
  for (const text of TEXTS) {
    await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload, headers) VALUES ($1, 'sql', 'k\t1\n\\', $2, $3)`, [stream, text, HEADERS]);
  }
  const env = { DATABASE_URL: db.url };
  for (const text of TEXTS) {
    const r = await cli(['append', '--stream', stream, '--kind', 'cli', '--key', 'k', '--payload', text, '--headers', HEADERS], { env });
    assert.equal(r.code, 0, r.stderr);
  }
  const ndjson = TEXTS.map((text) => `{"stream": ${JSON.stringify(stream)}, "kind": "ndjson", "key": "k", "payload": ${text}, "headers": ${HEADERS}}`).join('\n');
  const r = await cli(['append', '--ndjson'], { env, input: `${ndjson}\n` });
  assert.equal(r.code, 0, r.stderr);
  const pool = db.pool();
  await append(pool, { stream, kind: 'library', key: 'k', payload: { escapes: ESCAPES, nonBmp: NON_BMP, zero: -0, nested: JSON.parse(deep(60)) as object }, headers: { trace: 't' } });
  const watermarker = new Watermarker(pool);
  assert.equal((await watermarker.step()).outcome, 'advanced');
  await watermarker.close();
}

interface Stored {
  seq: string;
  kind: string;
  key: string;
  payload: string;
  headers: string;
  occurred_at: Date;
}

async function stored(db: TestDb, stream: string): Promise<Stored[]> {
  const r = await db.observer.query<Stored>(
    `SELECT seq, kind, key, payload::text AS payload, headers::text AS headers, occurred_at FROM tidemark.events WHERE stream = $1 ORDER BY seq`,
    [stream],
  );
  assert.equal(r.rows.length, 3 * TEXTS.length + 1);
  return r.rows;
}

test('the parser refuses exactly the numbers a JavaScript number would change, and names the first', () => {
  const inexact = ['12345678901234567890', '9007199254740993', '1e400', '-1e400', '1e-400', '0.12345678901234567', '1' + '0'.repeat(400)];
  const exact = ['0', '-0', '0.0000000000000000', '-0.00000000000000000000', '1.50', '0.1', '9007199254740991', '123456789012345', '1234567890123456', '1e21', '2.5E-3', '5e-324', '1.7976931348623157e308', '100000000000000000000'];
  for (const n of inexact) assert.deepEqual(firstInexactNumber(`{"x": ${n}}`), { text: n, at: 6 }, n);
  for (const n of exact) assert.equal(firstInexactNumber(`{"x": ${n}}`), undefined, n);
  // Numbers inside strings are text, escaped quotes included.
  assert.equal(firstInexactNumber('{"a": "12345678901234567890 \\" 1e400", "b\\\\": [1, 2]}'), undefined);
  assert.deepEqual(firstInexactNumber('{"a": "\\"", "b": [1, 1e400]}'), { text: '1e400', at: 21 });
  const err = (() => {
    try {
      parseExact('{"id": 12345678901234567890}', { seq: 7n, field: 'payload' });
    } catch (e) {
      return e;
    }
    return undefined;
  })();
  assert.ok(err instanceof InexactNumberError);
  assert.equal(err.code, 'INEXACT_NUMBER');
  assert.equal(err.seq, 7n);
  assert.equal(err.number, '12345678901234567890');
  assert.match(err.message, /^seq 7: the payload holds the number 12345678901234567890 \(at character 7\), which a JavaScript number cannot hold exactly; read event\.payloadText/);
  assert.deepEqual(parseExact('{"a": [1.50, -0, "x"]}', { seq: 1n, field: 'payload' }), { a: [1.5, -0, 'x'] });
});

test('a handler, tail --json, tail (TSV) and read_page give PostgreSQL\'s own text; the parsed payload never changes a number', async (t) => {
  const db = await testDb(t);
  await write(db, 'exact');
  const rows = await stored(db, 'exact');

  // A handler: the text byte for byte; the parsed value, or a loud refusal.
  const client = new StreamClient(db.pool(), { listen: false });
  t.after(() => client.close());
  const seen: StreamEvent[] = [];
  await client.drain('handler', 'exact', (event) => {
    seen.push(event);
  });
  assert.deepEqual(
    seen.map((e) => [e.seq.toString(), e.payloadText, e.headersText]),
    rows.map((r) => [r.seq, r.payload, r.headers]),
  );
  for (const event of seen) {
    const payload = firstInexactNumber(event.payloadText);
    if (payload === undefined) assert.deepEqual(event.payload, JSON.parse(event.payloadText));
    else assert.throws(() => event.payload, (err: unknown) => err instanceof InexactNumberError && err.seq === event.seq && err.number === payload.text);
    if (event.kind === 'library') assert.deepEqual(event.headers, { trace: 't' });
    else assert.throws(() => event.headers, (err: unknown) => err instanceof InexactNumberError && err.field === 'headers' && err.number === '98765432109876543210');
  }
  assert.ok(seen.some((e) => firstInexactNumber(e.payloadText) === undefined && e.payloadText.includes('😀')), 'some payloads parse');

  // tail --json: the whole line, with the stored text spliced in.
  const json = await cli(['tail', '--consumer', 'json', '--stream', 'exact', '--once', '--json'], { env: { DATABASE_URL: db.url } });
  assert.equal(json.code, 0, json.stderr);
  const line = (r: Stored) =>
    `{"seq":"${r.seq}","stream":"exact","kind":"${r.kind}","key":${JSON.stringify(r.key)},"payload":${r.payload},"headers":${r.headers},"occurredAt":"${r.occurred_at.toISOString()}"}`;
  assert.equal(json.stdout, rows.map((r) => `${line(r)}\n`).join(''));

  // TSV: COPY's escapes; undoing them gives the stored text back.
  const tsv = await cli(['tail', '--consumer', 'tsv', '--stream', 'exact', '--once'], { env: { DATABASE_URL: db.url } });
  assert.equal(tsv.code, 0, tsv.stderr);
  const lines = tsv.stdout.split('\n');
  assert.equal(lines.pop(), '');
  const unescape = (field: string) => field.replace(/\\(.)/g, (_, c: string) => ({ t: '\t', n: '\n', r: '\r' })[c] ?? c);
  assert.deepEqual(
    lines.map((l) => l.split('\t').map(unescape)),
    rows.map((r) => [r.seq, r.kind, r.key, r.payload]),
  );
  assert.equal(lines[0]!.split('\t')[2], 'k\\t1\\n\\\\', 'the key with a tab, a line break and a backslash stays on its line');

  // read_page: the same text.
  const page = await db.observer.query<{ payload: string; headers: string }>(
    `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT payload::text AS payload, headers::text AS headers FROM tidemark.read_page('sql', 'exact', 100); ROLLBACK`,
  );
  const result = (page as unknown as { rows: { payload: string; headers: string }[] }[])[1]!;
  assert.deepEqual(
    result.rows.map((r) => [r.payload, r.headers]),
    rows.map((r) => [r.payload, r.headers]),
  );
});

test('the relay\'s NATS and RabbitMQ bodies, and its headers, are PostgreSQL\'s text byte for byte', { timeout: 120_000 }, async (t) => {
  const db = await testDb(t);
  await write(db, 'exact');
  const rows = await stored(db, 'exact');
  const last = rows.at(-1)!.seq;
  const cursorAt = async (consumer: string) =>
    (await db.observer.query<{ seq: string }>(`SELECT seq::text AS seq FROM tidemark.cursors WHERE consumer = $1`, [consumer])).rows[0]?.seq === last;
  const env = { DATABASE_URL: db.url };

  // NATS, on a server of the test's own.
  const server = await startNatsServer(t);
  const nats = startCli(['relay', '--to', server.url, '--consumer', 'to-nats', '--stream', 'exact', '--create-stream'], { env });
  await waitFor('the NATS relay to reach the last event', () => cursorAt('to-nats'));
  nats.kill('SIGINT');
  assert.equal(await exited(nats), 0);
  const nc = await natsConnect({ servers: server.url });
  t.after(() => nc.close());
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const consumer = await js.consumers.get('TIDEMARK');
  const messages = await consumer.fetch({ max_messages: rows.length, expires: 5_000 });
  const got: [string, string, string][] = [];
  for await (const m of messages) {
    got.push([m.headers!.get('Tidemark-Seq'), Buffer.from(m.data).toString('utf8'), m.headers!.get('Tidemark-Headers')]);
    if (got.length === rows.length) break;
  }
  assert.deepEqual(got, rows.map((r) => [r.seq, r.payload, r.headers]));
  assert.equal((await jsm.streams.info('TIDEMARK')).state.messages, rows.length);

  // RabbitMQ, the shared broker: an exchange and a queue of the test's own.
  const exchange = `exact-${randomUUID()}`;
  const amqp = await amqpConnect('amqp://guest:guest@127.0.0.1:5672');
  t.after(() => amqp.close());
  const ch = await amqp.createChannel();
  await ch.assertExchange(exchange, 'topic', { durable: false, autoDelete: false });
  const { queue } = await ch.assertQueue('', { exclusive: true });
  await ch.bindQueue(queue, exchange, '#');
  t.after(() => ch.deleteExchange(exchange).catch(() => undefined));
  const rabbit = startCli(['relay', '--to', 'amqp://guest:guest@127.0.0.1:5672', '--consumer', 'to-rabbit', '--stream', 'exact', '--exchange', exchange], { env });
  await waitFor('the RabbitMQ relay to reach the last event', () => cursorAt('to-rabbit'));
  rabbit.kill('SIGINT');
  assert.equal(await exited(rabbit), 0);
  const bodies: [string, string, string][] = [];
  for (;;) {
    const m = await ch.get(queue, { noAck: true });
    if (m === false) break;
    const h = m.properties.headers!;
    bodies.push([String(h['tidemark-seq']), m.content.toString('utf8'), String(h['tidemark-headers'])]);
  }
  assert.deepEqual(bodies, rows.map((r) => [r.seq, r.payload, r.headers]));
});

test('the relay\'s events (a readsText handler) parse payload and headers on first read, to what the others get; an inexact number throws on every read', () => {
  const fields = (payloadText: string): EventText => ({ seq: 7n, stream: 's', kind: 'k', key: 'a', payloadText, headersText: '{"trace": "t"}', occurredAt: new Date(0) });
  const text = readsText(() => undefined);
  const plain = () => undefined;
  const exact = '{"total": 42, "items": [1.5, "x"]}';
  const lazy = streamEventFor(text, fields(exact));
  const eager = streamEventFor(plain, fields(exact));
  assert.deepEqual([lazy.payload, lazy.headers], [eager.payload, eager.headers]);
  assert.equal(lazy.payload, lazy.payload, 'parsed once, then kept');
  assert.deepEqual({ ...eager }.payload, { total: 42, items: [1.5, 'x'] }, "an application's handler gets own properties ({ ...event } keeps them)");
  const inexact = streamEventFor(text, fields('{"id": 12345678901234567890}'));
  assert.equal(inexact.payloadText, '{"id": 12345678901234567890}');
  for (let read = 0; read < 2; read += 1) assert.throws(() => inexact.payload, (err: unknown) => err instanceof InexactNumberError && err.seq === 7n && err.field === 'payload');
  assert.deepEqual(inexact.headers, { trace: 't' });
});
