/**
 * The fault proxy itself (test/support/proxy.ts), against the test server:
 * what each mode does to a node-postgres client and to its server session.
 * Whether a statement reached the server is read from pg_stat_activity, so
 * "nothing was forwarded" is observed, not inferred from a wait.
 */
import assert from 'node:assert/strict';
import type { Socket } from 'node:net';
import { after, test, type TestContext } from 'node:test';
import pg from 'pg';
import { closeAdmin, testDb, waitFor, type Session } from '../support/db.js';
import { startProxy, type Proxy } from '../support/proxy.js';

after(closeAdmin);

async function proxied(t: TestContext): Promise<{ proxy: Proxy; url: string; observer: Session; client: (name: string) => pg.Client }> {
  const db = await testDb(t);
  const u = new URL(db.url);
  const proxy = await startProxy({ target: { host: u.hostname, port: Number(u.port) } });
  const clients: pg.Client[] = [];
  // Deferred: runs before testDb drops the database (which ends its sessions).
  db.defer(async () => {
    for (const c of clients) destroy(c);
    await proxy.close();
  });
  const url = proxy.url(db.url);
  return {
    proxy,
    url,
    observer: db.observer,
    client: (name) => {
      const c = new pg.Client({ connectionString: url, application_name: name });
      c.on('error', () => undefined);
      clients.push(c);
      return c;
    },
  };
}

/** Closes a client's socket without the protocol's goodbye (which a blackhole would never answer). */
function destroy(client: pg.Client): void {
  (client as unknown as { connection: { stream: Socket } }).connection.stream.destroy();
}

/**
 * The client's backend pid. The session checks its socket every 100 ms
 * while a statement runs (PostgreSQL otherwise notices a closed client only
 * when it next writes to it), so a dropped sleep ends its session promptly.
 */
async function backendPid(client: pg.Client): Promise<number> {
  await client.query(`SET client_connection_check_interval = 100`);
  return (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
}

async function activity(observer: Session, pid: number): Promise<{ state: string; query: string } | undefined> {
  return (await observer.query<{ state: string; query: string }>('SELECT state, query FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0];
}

/** Settles `promise` into a status after at most `ms`: 'pending' if it has not settled by then. */
async function statusAfter(promise: Promise<unknown>, ms: number): Promise<'pending' | 'resolved' | 'rejected'> {
  let timer: NodeJS.Timeout | undefined;
  const status = await Promise.race([
    promise.then(
      () => 'resolved' as const,
      () => 'rejected' as const,
    ),
    new Promise<'pending'>((resolve) => (timer = setTimeout(() => resolve('pending'), ms))),
  ]);
  clearTimeout(timer);
  return status;
}

test('the proxy passes queries; drop() ends every connection: the client errors and the server session ends', async (t) => {
  const { proxy, observer, client } = await proxied(t);
  const a = client('proxy-a');
  await a.connect();
  assert.equal((await a.query<{ n: number }>('SELECT 41 + 1 AS n')).rows[0]!.n, 42);
  assert.equal(proxy.connections(), 1);
  const pid = await backendPid(a);

  const sleeping = a.query('SELECT pg_sleep(30)');
  await waitFor('the sleep to reach the server', async () => (await activity(observer, pid))?.state === 'active');
  proxy.drop();
  const err = await sleeping.then(
    () => assert.fail('the query answered after drop()'),
    (e: Error) => e,
  );
  t.diagnostic(`drop(): the client got "${err.message}"`);
  await waitFor('the server session to end after drop()', async () => (await activity(observer, pid)) === undefined);
  assert.equal(proxy.connections(), 0);

  // The proxy still passes new connections.
  const b = client('proxy-b');
  await b.connect();
  assert.equal((await b.query<{ n: number }>('SELECT 7 AS n')).rows[0]!.n, 7);
  await b.end();
});

test('reset() resets every connection (the client errors); mode reset refuses new ones until pass', async (t) => {
  const { proxy, observer, client } = await proxied(t);
  const a = client('proxy-a');
  await a.connect();
  const pid = await backendPid(a);
  const sleeping = a.query('SELECT pg_sleep(30)');
  await waitFor('the sleep to reach the server', async () => (await activity(observer, pid))?.state === 'active');
  proxy.reset();
  const err = await sleeping.then(
    () => assert.fail('the query answered after reset()'),
    (e: NodeJS.ErrnoException) => e,
  );
  t.diagnostic(`reset(): the client got ${err.code ?? ''} "${err.message}"`);
  assert.equal(err.code, 'ECONNRESET');
  await waitFor('the server session to end after reset()', async () => (await activity(observer, pid)) === undefined);

  proxy.mode = 'reset';
  await assert.rejects(client('proxy-b').connect(), 'a new connection is reset while the mode is reset');
  proxy.mode = 'pass';
  const c = client('proxy-c');
  await c.connect();
  assert.equal((await c.query<{ n: number }>('SELECT 1 AS n')).rows[0]!.n, 1);
  await c.end();
});

test('a blackholed connection forwards nothing until heal(), then answers; a connection opened meanwhile connects on heal', async (t) => {
  const { proxy, observer, client } = await proxied(t);
  const a = client('proxy-a');
  await a.connect();
  const pid = await backendPid(a);

  proxy.blackhole();
  const answer = a.query<{ n: number }>('SELECT 42 AS n');
  const b = client('proxy-b');
  const connected = b.connect();
  // Bounded wait, then: not answered, and the server never saw the query
  // (its session is idle, its last statement the pid lookup), nor B.
  assert.equal(await statusAfter(answer, 500), 'pending', 'a blackholed query must not be answered');
  assert.equal(await statusAfter(connected, 0), 'pending', 'a connection opened into the blackhole must not complete');
  const seen = await activity(observer, pid);
  assert.equal(seen?.state, 'idle');
  assert.match(seen?.query ?? '', /pg_backend_pid/);
  const bSessions = await observer.query(`SELECT 1 FROM pg_stat_activity WHERE application_name = 'proxy-b'`);
  assert.equal(bSessions.rowCount, 0, 'no server session exists for the connection opened into the blackhole');
  assert.equal(proxy.connections(), 2);

  proxy.heal();
  assert.equal((await answer).rows[0]!.n, 42);
  await connected;
  assert.equal((await b.query<{ n: number }>('SELECT 9 AS n')).rows[0]!.n, 9);
  await a.end();
  await b.end();
});

test('a client that gives up during a blackhole has its server session closed on heal', async (t) => {
  const { proxy, observer, client } = await proxied(t);
  const a = client('proxy-a');
  await a.connect();
  const pid = await backendPid(a);

  proxy.blackhole();
  const answer = a.query('SELECT 1');
  answer.catch(() => undefined);
  destroy(a); // the client gives up, as a response timeout would make it
  assert.equal(await statusAfter(answer, 100), 'rejected');
  // Blackholed: the server side knows nothing yet.
  assert.equal((await activity(observer, pid))?.state, 'idle');

  proxy.heal();
  await waitFor('the server session to end once the path heals', async () => (await activity(observer, pid)) === undefined);
  assert.equal(proxy.connections(), 0);
});
