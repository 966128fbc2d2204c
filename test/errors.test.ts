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
  ResyncRequiredError,
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
