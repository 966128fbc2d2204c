/**
 * The HTTP webhook sink against a local node:http receiver: Standard
 * Webhooks signatures checked independently (and the sign function
 * against the specification's published test vector), what each header
 * carries, transient answers sent again (Retry-After honoured, measured by
 * the receiver's clock), refusals, per-key order under concurrency,
 * timeouts, option checks, and the CloudEvents formats judged by the
 * official `cloudevents` SDK.
 */
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { spawn } from 'node:child_process';
import { createServer, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer } from 'node:net';
import type { AddressInfo, Socket } from 'node:net';
import { after, test } from 'node:test';
import { HTTP, type CloudEvent } from 'cloudevents';
import { ClosedError, InvalidOptionsError, SinkError } from '../../src/errors.js';
import type { RelayMessage, SinkRetry } from '../../src/relay/sink.js';
import { HttpSink, type HttpSinkOptions } from '../../src/relay/sinks/http/sink.js';
import { signature, signingKey } from '../../src/relay/sinks/http/sign.js';
import { BODY_LIMIT, closeEndpoint, endpoint, InFlight, post, retryAfter } from '../../src/relay/sinks/http/request.js';
import { EXACT_PAYLOAD, relayMessage, TEST_ORIGIN } from '../support/memory-sink.js';
import { Receiver, seeded, type Received } from '../support/receiver.js';

const never = new AbortController().signal;
/** Tests that would wait for ever if a refusal were sent again. */
const BOUNDED = { timeout: 20_000 };
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const KEY = Buffer.from('MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'base64');
/** Spacing, escapes and a number no JavaScript number holds: must arrive byte for byte. */
const PAYLOAD = EXACT_PAYLOAD;
const TRACE = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

function message(seq: number, fields: { key?: string; headersText?: string; stream?: string } = {}): RelayMessage {
  return relayMessage(seq, { headersText: `{"traceparent": "${TRACE}", "tracestate": "k=v"}`, occurredAt: new Date('2026-01-02T03:04:05.678Z'), ...fields });
}

const receivers: Receiver[] = [];
const sinks: HttpSink[] = [];
after(async () => {
  await Promise.all(sinks.map((s) => s.close()));
  await Promise.all(receivers.map((r) => r.stop()));
});

/** A sink to `url`, opened, quick to retry; the retries it reports. */
async function openSink(url: string, options: Omit<HttpSinkOptions, 'url'> = {}): Promise<{ sink: HttpSink; retries: SinkRetry[] }> {
  const sink = new HttpSink({ url, retryMinMs: 1, retryMaxMs: 5, ...options });
  sinks.push(sink);
  const retries: SinkRetry[] = [];
  await sink.open({ schema: 'tidemark', streams: ['orders'], republishWithinMs: 30_000, origin: TEST_ORIGIN, onRetry: (r) => retries.push(r) }, never);
  return { sink, retries };
}

async function setup(respond?: ConstructorParameters<typeof Receiver>[0], options: Omit<HttpSinkOptions, 'url'> = {}) {
  const receiver = await new Receiver(respond).start();
  receivers.push(receiver);
  return { receiver, ...(await openSink(receiver.url, { secret: SECRET, ...options })) };
}

/** The Standard Webhooks check, written out here rather than taken from the sink. */
function verify(r: Received, key: Buffer = KEY): boolean {
  const id = r.headers['webhook-id'] as string;
  const timestamp = r.headers['webhook-timestamp'] as string;
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.`).update(r.body).digest('base64');
  return (r.headers['webhook-signature'] as string).split(' ').includes(`v1,${expected}`);
}

test('sign matches the Standard Webhooks test vector', () => {
  // From the specification's reference libraries (standard-webhooks, svix).
  const body = Buffer.from('{"test": 2432232314}');
  assert.equal(signature(signingKey(SECRET), 'msg_p5jXN8AQM9LWM0D4loKWxJek', 1614265330, body), 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=');
});

test('each event is POSTed signed, its payload byte for byte, its fields and trace context in headers', async () => {
  const { receiver, sink } = await setup();
  const before = Math.floor(Date.now() / 1000);
  const odd = message(7, { key: ' 100% ünï\tkey ', headersText: `{"traceparent": "${TRACE}", "tracestate": "k=v", "x-tenant": "acme", "authorization": "Bearer x", "webhook-id": "forged", "x-n": 5, "x-uni": "é", "bad name": "v"}` });
  await sink.publish([message(5), odd], never);
  assert.equal(receiver.requests.length, 2);
  const r = receiver.requests.find((q) => q.headers['tidemark-seq'] === '7')!;
  assert.ok(verify(r), 'the signature recomputed from the secret matches');
  assert.equal(r.headers['webhook-id'], `${TEST_ORIGIN}:7`);
  const ts = Number(r.headers['webhook-timestamp']);
  assert.ok(ts >= before && ts <= Math.floor(Date.now() / 1000), 'webhook-timestamp: unix seconds, now');
  assert.equal(r.body.toString('utf8'), PAYLOAD, 'the payload text byte for byte');
  assert.equal(r.headers['content-type'], 'application/json');
  assert.equal(r.headers['tidemark-stream'], 'orders');
  assert.equal(r.headers['tidemark-kind'], 'order.placed');
  assert.equal(decodeURIComponent(r.headers['tidemark-key'] as string), ' 100% ünï\tkey ', 'the key, percent-encoded where a header cannot carry it');
  assert.equal(r.headers['tidemark-occurred-at'], '2026-01-02T03:04:05.678Z');
  assert.equal(decodeURIComponent(r.headers['tidemark-headers'] as string), odd.event.headersText);
  assert.equal(r.headers.traceparent, TRACE);
  assert.equal(r.headers.tracestate, 'k=v');
  assert.equal(r.headers['x-tenant'], 'acme');
  assert.equal(r.headers.authorization, undefined, 'an event cannot set credentials');
  assert.equal(r.headers['x-n'], undefined, 'only string headers');
  assert.equal(r.headers['x-uni'], undefined, 'only values a header carries as they are');
  assert.notEqual(r.headers['webhook-id'], 'forged');
  assert.ok(verify(receiver.requests.find((q) => q.headers['tidemark-seq'] === '5')!));
});

test('a raw secret signs with its UTF-8 bytes; none leaves requests unsigned and says so', async () => {
  const raw = 'a plain shared secret of 32 char';
  const { receiver, sink } = await setup(undefined, { secret: raw });
  await sink.publish([message(1)], never);
  assert.ok(verify(receiver.requests[0]!, Buffer.from(raw, 'utf8')));
  assert.match(sink.description, /, signed$/);
  const unsigned = await setup(undefined, { secret: undefined });
  await unsigned.sink.publish([message(1)], never);
  assert.equal(unsigned.receiver.requests[0]!.headers['webhook-signature'], undefined);
  assert.ok(unsigned.receiver.requests[0]!.headers['webhook-id']);
  assert.match(unsigned.sink.description, /UNSIGNED/);
});

test('503 with Retry-After: the same request again, not before the announced time by the receiver clock, reported as a retry', async () => {
  const { receiver, sink, retries } = await setup((r) => (r.n === 0 ? { status: 503, headers: { 'retry-after': '1' } } : { status: 204 }));
  await sink.publish([message(3)], never);
  const [first, second] = receiver.requests;
  assert.equal(receiver.requests.length, 2);
  assert.ok(second!.at - first!.answeredAt! >= 1000 - 1, `sent again after ${second!.at - first!.answeredAt!} ms, announced 1000`);
  assert.equal(second!.headers['webhook-id'], first!.headers['webhook-id'], 'the same webhook-id');
  assert.ok(verify(second!));
  assert.equal(retries.length, 1);
  assert.equal(retries[0]!.seq, 3n);
  assert.equal(retries[0]!.attempt, 1);
  assert.ok(retries[0]!.delayMs >= 1000);
  assert.ok(retries[0]!.error instanceof SinkError && retries[0]!.error.retryable && /503/.test(retries[0]!.error.message));
});

test('Retry-After as an HTTP date, and as seconds', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  assert.equal(retryAfter('Thu, 01 Jan 2026 00:00:05 GMT', now), 5000);
  assert.equal(retryAfter('7', now), 7000);
  assert.equal(retryAfter('soon', now), undefined);
  assert.equal(retryAfter(undefined, now), undefined);
});

test('408, 429 and 5xx are sent again; another 4xx is the event\'s refusal: not retryable, with its seq, status and the start of the answer', BOUNDED, async () => {
  const statuses = [408, 429, 500, 502];
  const { receiver, sink, retries } = await setup((r) => (r.n < statuses.length ? { status: statuses[r.n]! } : { status: 200 }));
  await sink.publish([message(1)], never);
  assert.equal(receiver.requests.length, 5);
  assert.deepEqual(retries.map((r) => r.attempt), [1, 2, 3, 4]);

  const refusing = await setup(() => ({ status: 422, body: `{"error":"amount must be positive"}${'x'.repeat(5000)}` }));
  const err = await refusing.sink.publish([message(9)], never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError);
  assert.equal(err.retryable, false);
  assert.equal(err.seq, 9n);
  assert.match(err.message, /seq 9: .* answered 422: .*amount must be positive/);
  assert.ok(err.message.length < 400, 'a short part of the answer');
  assert.equal(refusing.receiver.requests.length, 1, 'a refusal is not sent again');

  // An answer about the endpoint (credentials, a wrong path): every event's alike, so it names none.
  for (const status of [401, 404]) {
    const endpoint = await setup(() => ({ status }));
    const wide = await endpoint.sink.publish([message(9)], never).then(() => undefined, (e: unknown) => e);
    assert.ok(wide instanceof SinkError && !wide.retryable && wide.seq === undefined, String(wide));
    assert.match(wide.message, new RegExp(`answered ${status} \\(about the endpoint, not the event`));
  }
  assert.equal(refusing.retries.length, 0);
});

test('one key at a time, in seq order, up to concurrency keys in flight', async () => {
  const random = seeded(7);
  const { receiver, sink } = await setup(
    () => {
      const delayMs = Math.floor(random() * 4);
      return random() < 0.2 ? { status: 503, delayMs } : { status: 200, delayMs };
    },
    { concurrency: 4 },
  );
  const messages = Array.from({ length: 300 }, (_, i) => message(i + 1, { key: `k${i % 12}` }));
  await sink.publish(messages, never);
  for (let k = 0; k < 12; k += 1) {
    const ofKey = receiver.requests.filter((r) => r.headers['tidemark-key'] === `k${k}`);
    ofKey.forEach((r, i) => i === 0 || assert.ok(r.at >= ofKey[i - 1]!.answeredAt!, `key k${k}: a request only once the previous one was answered`));
  }
  assert.ok(receiver.maxInFlight <= 4, `at most 4 in flight, saw ${receiver.maxInFlight}`);
  assert.ok(receiver.maxInFlight > 1, 'keys in parallel');
  for (let k = 0; k < 12; k += 1) {
    const accepted = receiver.requests.filter((r) => r.headers['tidemark-key'] === `k${k}` && r.status === 200).map((r) => Number(r.headers['tidemark-seq']));
    assert.deepEqual(accepted, messages.filter((m) => m.event.key === `k${k}`).map((m) => Number(m.event.seq)), `key k${k} in seq order`);
  }
});

test('a request held past ackTimeoutMs fails and is sent again with the same webhook-id', async () => {
  const { receiver, sink, retries } = await setup((r) => (r.n === 0 ? { hold: true } : { status: 200 }), { ackTimeoutMs: 150 });
  await sink.publish([message(4)], never);
  assert.equal(receiver.requests.length, 2);
  assert.equal(receiver.requests[1]!.headers['webhook-id'], receiver.requests[0]!.headers['webhook-id']);
  assert.match((retries[0]!.error as Error).message, /no response within 150 ms \(ackTimeoutMs\)/);
});

test("the URL's credentials go as Basic authorization, its path and query as the request target", async () => {
  const receiver = await new Receiver().start();
  receivers.push(receiver);
  const url = new URL(receiver.url);
  const { sink } = await openSink(`http://us%20er:p%40ss@${url.host}/in/hook?token=a%2Fb&x=1`, { secret: SECRET });
  await sink.publish([message(1)], never);
  const [r] = receiver.requests;
  assert.equal(r!.url, '/in/hook?token=a%2Fb&x=1');
  assert.equal(r!.headers.authorization, `Basic ${Buffer.from('us er:p@ss').toString('base64')}`);
  assert.equal(r!.headers.host, url.host);
});

/** A node:http server on `host` (a free port) answering with `handle`, closed after the tests; its URL, its request count, and how many of its connections closed. */
async function serve(
  handle: Parameters<typeof createServer>[1],
  host = '127.0.0.1',
): Promise<{ server: Server; url: string; requests: () => number; connections: () => number; closed: () => number }> {
  let requests = 0;
  let connections = 0;
  let closed = 0;
  const server = createServer((req, res) => {
    requests += 1;
    handle!(req, res);
  });
  server.on('connection', (socket: Socket) => {
    connections += 1;
    socket.once('close', () => (closed += 1));
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { server, url: `http://${host.includes(':') ? `[${host}]` : host}:${port}/hook`, requests: () => requests, connections: () => connections, closed: () => closed };
}

/** A server whose every answer is `status` with a body that never ends. */
function endlessAnswers(status: number) {
  return serve((req, res) => {
    req.resume();
    res.writeHead(status, { 'content-type': 'text/plain' });
    const chunk = Buffer.alloc(16 * 1024, 'x');
    chunk.write('the start of a long answer');
    // One chunk at a time until the client goes away (a bounded number of chunks in flight, never an end).
    let gone = false;
    res.once('close', () => (gone = true));
    const more = () => {
      if (gone) return;
      if (res.write(chunk)) setImmediate(more);
      else res.once('drain', more);
    };
    more();
  });
}

test(`an answer longer than ${BODY_LIMIT} bytes is not read on: a 2xx acknowledges, a refusal names its start; the connection is closed`, BOUNDED, async () => {
  const ok = await endlessAnswers(200);
  const { sink } = await openSink(ok.url, { ackTimeoutMs: 60_000 });
  await sink.publish([message(1)], never);
  assert.equal(ok.requests(), 1, 'acknowledged once, not sent again');
  await waitFor(() => ok.closed() === 1, 'the connection of the long answer closed');

  const refusing = await endlessAnswers(422);
  const { sink: refused } = await openSink(refusing.url, { ackTimeoutMs: 60_000 });
  const err = await refused.publish([message(2)], never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError && !err.retryable && err.seq === 2n, `a refusal of seq 2: ${String(err)}`);
  assert.match(err.message, /answered 422: "the start of a long answer/);
  await waitFor(() => refusing.closed() === 1, 'the connection of the long refusal closed');
});

test('an IPv6 literal URL reaches the receiver', async (t) => {
  const server = await serve((req, res) => req.resume().once('end', () => res.writeHead(204).end()), '::1').catch((e: unknown) => e as Error);
  if (server instanceof Error) return t.skip(`this machine cannot listen on ::1 (${server.message})`);
  const { sink } = await openSink(server.url);
  await sink.publish([message(1), message(2, { key: 'other' })], never);
  assert.equal(server.requests(), 2);
});

/** A TCP server that answers every request with `answer` (raw HTTP/1.1 text), for answers node:http would not write. */
async function rawAnswers(answer: string | (() => string)): Promise<{ url: string; requests: () => number }> {
  let requests = 0;
  const server = createTcpServer((socket) => {
    let seen = '';
    socket.on('data', (d: Buffer) => {
      seen += d.toString('latin1');
      // One request per empty line after its headers: the sink's bodies are small and come in the same write.
      while (seen.includes('\r\n\r\n')) {
        const end = seen.indexOf('\r\n\r\n') + 4;
        const length = Number(/content-length: (\d+)/i.exec(seen.slice(0, end))?.[1] ?? 0);
        if (seen.length < end + length) return;
        seen = seen.slice(end + length);
        requests += 1;
        socket.write(typeof answer === 'string' ? answer : answer());
      }
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  after(() => server.close());
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, requests: () => requests };
}

test('a 204 or 304 with a Content-Length and no body is that answer, whole', BOUNDED, async () => {
  const ok = await rawAnswers('HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n');
  const { sink: okSink, retries } = await openSink(ok.url);
  await okSink.publish([message(1), message(2)], never);
  assert.equal(ok.requests(), 2);
  assert.equal(retries.length, 0);
  const notModified = await rawAnswers('HTTP/1.1 304 Not Modified\r\nContent-Length: 42\r\n\r\n');
  const { sink } = await openSink(notModified.url);
  const err = await sink.publish([message(3)], never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError && !err.retryable && err.seq === undefined, `a 304 is about the endpoint: ${String(err)}`);
  assert.match(err.message, /answered 304/);
  assert.equal(notModified.requests(), 1);
});

test('a 100 Continue nobody asked for fails that try, named in its retry, and the request is sent again', BOUNDED, async () => {
  let answered = 0;
  const server = await rawAnswers(() => (answered++ === 0 ? 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n' : 'HTTP/1.1 204 No Content\r\n\r\n'));
  const { sink, retries } = await openSink(server.url);
  await sink.publish([message(1)], never);
  assert.equal(server.requests(), 2);
  assert.equal(retries.length, 1);
  assert.match((retries[0]!.error as Error).message, /answered 100 Continue to a request that did not ask for it/);
});

test('a try that timed out waiting for a connection leaves the connection it later gets to the next request', BOUNDED, async () => {
  const held: ServerResponse[] = [];
  const server = await serve((req, res) => {
    req.resume();
    req.once('end', () => (held.length === 0 ? held.push(res) : res.writeHead(204).end()));
  });
  const ep = endpoint(new URL(server.url), server.url, 1, 5_000);
  after(() => closeEndpoint(ep));
  const first = post(ep, {}, Buffer.from('{}'), 60_000, new InFlight());
  await waitFor(() => held.length === 1, 'the first request arrived');
  // The pool's one connection is busy: this one waits for it, and gives up first.
  const stale = await post(ep, {}, Buffer.from('{}'), 1, new InFlight());
  assert.ok('failure' in stale && stale.failure === 'timeout');
  held[0]!.writeHead(204).end();
  assert.deepEqual(await first, { status: 204, retryAfterMs: undefined, snippet: '' });
  const next = await post(ep, {}, Buffer.from('{}'), 60_000, new InFlight());
  assert.ok('status' in next && next.status === 204);
  assert.equal(server.requests(), 2, 'the stale try was never sent');
  assert.equal(server.connections(), 1, 'one connection for both requests');
});

test('a request undici will not send is the event\'s refusal, not a network failure sent again', async () => {
  const receiver = await new Receiver().start();
  receivers.push(receiver);
  const ep = endpoint(new URL(receiver.url), receiver.url, 1, 5_000);
  after(() => closeEndpoint(ep));
  const answer = await post(ep, { 'x-bad': 'a\nb' }, Buffer.from('{}'), 5_000, new InFlight());
  assert.ok('failure' in answer && answer.failure === 'unsendable', JSON.stringify(answer));
  assert.equal(receiver.requests.length, 0);
});

test('cloudevents-binary copies traceparent and tracestate only when a header carries them as they are', async () => {
  const { receiver, sink } = await setup(undefined, { format: 'cloudevents-binary' });
  await sink.publish([message(1, { headersText: `{"traceparent": "${TRACE}", "tracestate": "k=v\\nx"}` })], never);
  const [r] = receiver.requests;
  assert.equal(r!.headers.traceparent, TRACE);
  assert.equal(r!.headers.tracestate, undefined);
});

test('connectTimeoutMs bounds getting a connection: a listener that never accepts fails the try as a connect timeout', BOUNDED, async (t) => {
  // A listening socket whose queue is full: the kernel drops further SYNs, so a connect neither succeeds nor fails.
  const script = "import socket,time\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen(0)\nprint(s.getsockname()[1],flush=True)\nf=[]\nfor i in range(3):\n c=socket.socket();c.setblocking(False)\n try: c.connect(('127.0.0.1',s.getsockname()[1]))\n except BlockingIOError: pass\n f.append(c)\ntime.sleep(30)\n";
  const child = spawn('python3', ['-c', script], { stdio: ['ignore', 'pipe', 'ignore'] });
  const port = await new Promise<number | Error>((resolve) => {
    child.once('error', resolve);
    child.stdout!.once('data', (d: Buffer) => resolve(Number(String(d).trim())));
  });
  after(() => child.kill());
  if (port instanceof Error) return t.skip(`needs python3 for a listener that never accepts (${port.message})`);
  await new Promise((resolve) => setTimeout(resolve, 200)); // the fillers' connects queued first
  const { sink, retries } = await openSink(`http://127.0.0.1:${port}/hook`, { connectTimeoutMs: 200, ackTimeoutMs: 60_000, retryMinMs: 60_000, retryMaxMs: 60_000 });
  const stop = new AbortController();
  const publishing = sink.publish([message(1)], stop.signal);
  await waitFor(() => retries.length === 1, 'the first try failed');
  assert.match((retries[0]!.error as Error).message, /no connection within 200 ms \(connectTimeoutMs\)/);
  stop.abort(new Error('stop'));
  await publishing.catch(() => undefined);
});

test('close fails a request in flight, which is not sent again', BOUNDED, async () => {
  const { receiver, sink } = await setup(() => ({ hold: true }), { ackTimeoutMs: 60_000 });
  const publishing = sink.publish([message(1)], never);
  await waitFor(() => receiver.requests.length === 1, 'the request arrived');
  await sink.close();
  await assert.rejects(publishing, ClosedError);
  assert.equal(receiver.requests.length, 1);
});

async function waitFor(done: () => boolean, what: string): Promise<void> {
  for (let i = 0; !done(); i += 1) {
    if (i > 2000) assert.fail(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

test('an abort ends a publish that is sending again, with the abort reason', async () => {
  const { sink } = await setup(() => ({ status: 503, headers: { 'retry-after': '60' } }));
  const stop = new AbortController();
  const reason = new Error('stop');
  const publishing = sink.publish([message(1)], stop.signal);
  setImmediate(() => stop.abort(reason));
  await assert.rejects(publishing, (e) => e === reason);
});

test('a refusal abandons the other keys in flight and rejects at once', BOUNDED, async () => {
  const { sink } = await setup((r) => (r.headers['tidemark-key'] === 'bad' ? { status: 400 } : { hold: true }), { ackTimeoutMs: 60_000 });
  const started = performance.now();
  const err = await sink.publish([message(1, { key: 'slow' }), message(2, { key: 'bad' })], never).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof SinkError && err.seq === 2n && !err.retryable);
  assert.ok(performance.now() - started < 30_000);
});

test('batchSize: consecutive events of one key in one request, a JSON array, in order', async () => {
  const { receiver, sink } = await setup(undefined, { batchSize: 3 });
  await sink.publish([1, 2, 3, 4].map((i) => message(i, { key: 'a' })).concat([message(5, { key: 'b' })]), never);
  assert.ok(receiver.requests.every((r) => verify(r)));
  const lone = receiver.requests.find((r) => r.headers['tidemark-key'] === 'b')!;
  assert.equal(JSON.parse(lone.body.toString()).length, 1, 'a lone event is an array of one too');
  const bodies = receiver.requests.filter((r) => r !== lone).map((r) => ({ id: r.headers['webhook-id'], items: JSON.parse(r.body.toString()) as { seq: string; id: string }[] }));
  const a = bodies.sort((x, y) => Number(x.items[0]!.seq) - Number(y.items[0]!.seq));
  assert.deepEqual(a.map((b) => b.items.map((i) => i.seq)), [['1', '2', '3'], ['4']]);
  assert.equal(a[0]!.id, `${TEST_ORIGIN}:1-3`);
  assert.equal(a[0]!.items[0]!.id, `${TEST_ORIGIN}:1`);
  assert.ok(receiver.requests[0]!.body.toString().includes(`"payload":${PAYLOAD}`), 'each payload as its text');
});

function toEvent(r: Received): CloudEvent<unknown> {
  const event = HTTP.toEvent({ headers: r.headers as Record<string, string>, body: r.body.toString('utf8') });
  assert.ok(!Array.isArray(event));
  return event as CloudEvent<unknown>;
}

test('cloudevents: a structured CloudEvent the SDK validates, its data the payload', async () => {
  const { receiver, sink } = await setup(undefined, { format: 'cloudevents', ceSource: '/shop/{stream}' });
  await sink.publish([message(11, { key: 'o 1' })], never);
  const r = receiver.requests[0]!;
  assert.equal(r.headers['content-type'], 'application/cloudevents+json');
  const ce = toEvent(r);
  assert.equal(ce.validate(), true);
  assert.equal(ce.id, `${TEST_ORIGIN}:11`);
  assert.equal(ce.source, '/shop/orders');
  assert.equal(ce.subject, 'o 1');
  assert.equal(ce.traceparent, TRACE);
  assert.ok(r.body.toString().endsWith(`"data":${PAYLOAD}}`), 'data: the payload text as it is');
  assert.ok(verify(r));
});

test('cloudevents-binary: ce-* headers percent-encoded as the HTTP binding says, the SDK validates, traceparent plain', async () => {
  const { receiver, sink } = await setup(undefined, { format: 'cloudevents-binary' });
  await sink.publish([message(12, { key: 'naïve "key" 100%' })], never);
  const r = receiver.requests[0]!;
  assert.equal(r.headers['content-type'], 'application/json');
  assert.equal(r.headers['ce-subject'], 'na%C3%AFve%20%22key%22%20100%25');
  assert.equal(r.headers['ce-traceparent'], undefined);
  assert.equal(r.headers.traceparent, TRACE);
  const ce = toEvent(r);
  assert.equal(ce.validate(), true);
  assert.equal(ce.id, `${TEST_ORIGIN}:12`);
  assert.equal(ce.specversion, '1.0');
  assert.equal(decodeURIComponent(r.headers['ce-subject'] as string), 'naïve "key" 100%');
  assert.equal(r.body.toString('utf8'), PAYLOAD);
});

test('options are checked when the sink is made, each refusal naming its option; description hides credentials and query', () => {
  const bad: [Partial<HttpSinkOptions> & Record<string, unknown>, string, RegExp][] = [
    [{ url: 'ftp://x/' }, 'url', /http:\/\/ or https:\/\//],
    [{ url: 'not a url' }, 'url', /does not parse/],
    [{ url: 'https://x/#frag' }, 'url', /fragment/],
    [{ secret: 'short' }, 'secret', /at least 16/],
    [{ secret: 'whsec_not base64!!' }, 'secret', /base64/],
    [{ secret: 'whsec_AAAA' }, 'secret', /3 bytes/],
    [{ concurrency: 0 }, 'concurrency', /between 1 and 1024/],
    [{ batchSize: 1.5 }, 'batchSize', /integer/],
    [{ ackTimeoutMs: -1 }, 'ackTimeoutMs', /integer/],
    [{ connectTimeoutMs: 0 }, 'connectTimeoutMs', /integer/],
    [{ retryMinMs: 50, retryMaxMs: 10 }, 'retryMaxMs', /at least retryMinMs/],
    [{ format: 'cloudevents-binary', batchSize: 2 }, 'batchSize', /one event per request/],
    [{ format: 'xml' as never }, 'format', /one of/],
    [{ ceType: '{kind}' }, 'ceType', /cloudevents formats/],
    [{ retries: 3 }, 'retries', /not a HttpSink option/],
  ];
  for (const [options, option, message] of bad) {
    assert.throws(() => new HttpSink({ url: 'https://hooks.example.com/x', ...options } as HttpSinkOptions), (e: unknown) => {
      assert.ok(e instanceof InvalidOptionsError, String(e));
      assert.equal(e.option, option);
      assert.match(e.message, message);
      assert.ok(!e.message.includes('not base64!!') && !e.message.includes('short"'), 'a secret is never echoed');
      return true;
    });
  }
  const sink = new HttpSink({ url: 'https://user:pw@hooks.example.com/in?token=abc', secret: SECRET });
  assert.equal(sink.description, 'POST https://***@hooks.example.com/in?***, signed');
  void sink.close();
});
