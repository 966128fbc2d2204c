import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { test } from 'node:test';
import pg from 'pg';
import {
  ClosedError,
  ConnectionLostError,
  CursorContentionError,
  FenceBusyError,
  HandlerError,
  InvalidEventError,
  InvalidOptionsError,
  isRetryable,
  MIN_RETENTION_MS,
  Pruner,
  readStatus,
  ResyncRequiredError,
  StreamClient,
} from '../src/index.js';

/** A PostgreSQL error as node-postgres raises it. */
const pgError = (code: string) => Object.assign(new pg.DatabaseError('server error', 0, 'error'), { code, severity: 'ERROR' });
/** A socket error as Node raises it. */
const systemError = (code: string) => Object.assign(new Error(code), { code, syscall: 'read', errno: -1 });

const table: [string, unknown, boolean][] = [
  ['connection exception (08006)', pgError('08006'), true],
  ['connection does not exist (08003)', pgError('08003'), true],
  ['serialization failure (40001)', pgError('40001'), true],
  ['deadlock (40P01)', pgError('40P01'), true],
  ['lock timeout (55P03)', pgError('55P03'), true],
  ['too many connections (53300)', pgError('53300'), true],
  ['admin shutdown / terminated (57P01)', pgError('57P01'), true],
  ['crash shutdown (57P02)', pgError('57P02'), true],
  ['server starting up (57P03)', pgError('57P03'), true],
  ['cursor held by another session, from read_page (TM001)', pgError('TM001'), true],
  ['resync required, from read_page (TM002)', pgError('TM002'), false],
  ['an advance past the page (TM005)', pgError('TM005'), false],
  ['ECONNRESET', systemError('ECONNRESET'), true],
  ['EPIPE (five capitals, not a SQLSTATE)', systemError('EPIPE'), true],
  ['cursor contention', new CursorContentionError('c', 's'), true],
  ['busy fence', new FenceBusyError('bootstrap', 10), true],
  ['lost connection', new ConnectionLostError('tail'), true],
  ['query canceled (57014)', pgError('57014'), false],
  ['unique violation (23505)', pgError('23505'), false],
  ['syntax error (42601)', pgError('42601'), false],
  ['insufficient privilege (42501)', pgError('42501'), false],
  ['abort', new DOMException('aborted', 'AbortError'), false],
  ['resync required', new ResyncRequiredError('c', 's', 1n, 5n), false],
  ['handler error from application logic', new HandlerError('c', 's', 3n, new TypeError('x is undefined')), false],
  ['handler error over a socket-level cause', new HandlerError('c', 's', 3n, systemError('ECONNRESET')), false],
  ['handler error over a non-retryable SQLSTATE', new HandlerError('c', 's', 3n, pgError('23505')), false],
  ['handler error over a serialization failure in the page transaction', new HandlerError('c', 's', 3n, pgError('40001')), true],
  ['handler error over a lock timeout in the page transaction', new HandlerError('c', 's', 3n, pgError('55P03')), true],
  ['invalid options', new InvalidOptionsError('batchSize', 'bad'), false],
  ['invalid event', new InvalidEventError(0, 'stream', 'bad'), false],
  ['closed', new ClosedError('StreamClient'), false],
  ['plain error', new Error('boom'), false],
  ['not an error', 'boom', false],
  ['undefined', undefined, false],
];

test('isRetryable classifies by SQLSTATE, socket code and tidemark code, never by message', () => {
  for (const [what, err, expected] of table) assert.equal(isRetryable(err), expected, what);
});

test('a refused connection, as the driver really reports it, is retryable', async () => {
  // A port that was free a moment ago: nothing listens on it.
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  const client = new pg.Client({ host: '127.0.0.1', port, user: 'x', database: 'x', connectionTimeoutMillis: 5000 });
  const err = await client.connect().then(() => assert.fail('should not connect'), (e: unknown) => e);
  assert.equal(isRetryable(err), true);
});

test('unknown options are refused by name, not ignored: StreamClient, Pruner, readStatus', async () => {
  const pool = new pg.Pool({ host: '127.0.0.1', port: 1 }); // never connected: options are checked first
  try {
    assert.throws(() => new StreamClient(pool, { bogus: 1 } as never), { code: 'INVALID_OPTIONS', option: 'bogus', message: /^bogus: is not a StreamClient option \(known: schema, batchSize, pollIntervalMs, / });
    assert.throws(() => new StreamClient(pool, { pollIntervalMS: 10 } as never), { option: 'pollIntervalMS' });
    assert.throws(() => new Pruner(pool, { retention: '7d' } as never), { code: 'INVALID_OPTIONS', option: 'retention', message: /is not a Pruner option \(known: schema, retentionMs, / });
    await assert.rejects(readStatus(pool, 'tidemark', { streamCount: false } as never), { code: 'INVALID_OPTIONS', option: 'streamCount', message: /is not a readStatus option \(known: streamCounts\)/ });
    // Every documented option is still accepted.
    assert.equal(new StreamClient(pool, { listen: false, observer: () => undefined, onError: undefined }).options.listen, false);
    assert.equal(new Pruner(pool, { retentionMs: MIN_RETENTION_MS, batchSize: 5, intervalMs: 10, owner: 'o', schema: 's' }).options.batchSize, 5);
  } finally {
    await pool.end();
  }
});

test('a rejected value is quoted cut to 80 characters, with its length', () => {
  const long = 'y'.repeat(20_000);
  const err = (() => {
    try {
      new Pruner(new pg.Pool(), { owner: long });
    } catch (e) {
      return e as InvalidOptionsError;
    }
    assert.fail('should throw');
  })();
  assert.equal(err.option, 'owner');
  assert.equal(err.message, `owner: expected a non-empty string of at most 200 characters without NUL, got "${'y'.repeat(80)}…" (20000 characters)`);
});

test('a rejected NaN or Infinity is echoed as itself, not as JSON\'s null', async () => {
  const { Pruner } = await import('../src/index.js');
  const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' }); // never connects
  assert.throws(() => new Pruner(pool, { retentionMs: Number.NaN }), /retentionMs: .*got NaN/);
  assert.throws(() => new Pruner(pool, { batchSize: Number.POSITIVE_INFINITY }), /batchSize: .*got Infinity/);
  await pool.end();
});
