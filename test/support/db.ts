/**
 * Per-test databases and the tools race tests are scripted with: named
 * connections whose backend pid is known, and polling of pg_locks /
 * pg_stat_activity until a backend reaches a given state. No sleeps.
 */
import { randomBytes } from 'node:crypto';
import type { TestContext } from 'node:test';
import pg from 'pg';
import { fenceKey, quoteIdent } from '../../src/db/queryable.js';
import { createPool, type CreatePoolOptions } from '../../src/db/pool.js';

const adminUrl = process.env.TIDEMARK_TEST_ADMIN_URL;
const template = process.env.TIDEMARK_TEST_TEMPLATE;

/** A connection with its backend pid, for scripting interleavings. */
export interface Session {
  client: pg.Client;
  pid: number;
  query: pg.Client['query'];
}

/** A database of this test's own, cloned from the migrated template. */
export interface TestDb {
  name: string;
  url: string;
  schema: string;
  /** A pool on this database; ended after the test. */
  pool(config?: CreatePoolOptions): pg.Pool;
  /** A dedicated connection; closed after the test. */
  session(name?: string): Promise<Session>;
  /** A connection for observing (pg_locks, sequences); closed after the test. */
  observer: Session;
  /** Runs `fn` after the test, before its connections and pools close (last deferred, first run). */
  defer(fn: () => Promise<unknown> | unknown): void;
}

let admin: pg.Pool | undefined;

function adminPool(): pg.Pool {
  if (!adminUrl || !template) {
    throw new Error('run tests with `npm test` (test/support/run.ts prepares the server and template)');
  }
  admin ??= new pg.Pool({ connectionString: adminUrl, max: 2 });
  return admin;
}

/**
 * Creates this test's database from the migrated template (or, with
 * `migrated: false`, an empty one with no tidemark schema) and drops it
 * after the test.
 */
export async function testDb(t: TestContext, options: { migrated?: boolean } = {}): Promise<TestDb> {
  const pool = adminPool();
  const name = `${template}_${randomBytes(6).toString('hex')}`;
  const from = options.migrated === false ? '' : ` TEMPLATE ${quoteIdent(template!)}`;
  await pool.query(`CREATE DATABASE ${quoteIdent(name)}${from}`);
  const u = new URL(adminUrl!);
  u.pathname = `/${name}`;
  const url = u.toString();
  const pools: pg.Pool[] = [];
  const clients: pg.Client[] = [];
  const deferred: (() => Promise<unknown> | unknown)[] = [];

  const session = async (label = 'session'): Promise<Session> => {
    const client = new pg.Client({ connectionString: url, application_name: `test:${label}` });
    client.on('error', () => undefined);
    await client.connect();
    clients.push(client);
    const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    return { client, pid, query: client.query.bind(client) as pg.Client['query'] };
  };

  t.after(async () => {
    for (const fn of deferred.reverse()) await fn();
    for (const client of clients.reverse()) await client.end().catch(() => undefined);
    let leaked = false;
    for (const p of pools.reverse()) {
      // A pool with a checked-out client never ends: fail loudly instead of hanging.
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        p.end().then(() => true, () => true),
        new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), 10_000))),
      ]);
      clearTimeout(timer);
      leaked ||= !ended;
    }
    // Dropped even after a leak (FORCE ends its sessions), so one failed test
    // leaves nothing behind for the next.
    await pool.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`);
    if (leaked) throw new Error(`a pool of test ${t.name} still had checked-out clients`);
  });

  return {
    name,
    url,
    schema: 'tidemark',
    pool(config = {}) {
      const p = createPool({ connectionString: url, max: 4, ...config });
      pools.push(p);
      return p;
    },
    session,
    observer: await session('observer'),
    defer: (fn) => void deferred.push(fn),
  };
}

/**
 * A fresh name for a cluster-wide role, dropped after the test. Call it after
 * testDb(t): hooks run in order, so the drop comes after the test database
 * (and the privileges granted in it) is gone.
 */
export function testRole(t: TestContext, prefix: string): string {
  const role = `tidemark_test_${prefix}_${randomBytes(4).toString('hex')}`;
  t.after(() => adminPool().query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`));
  return role;
}

/** Ends the shared admin pool; call from a file's `after` hook. */
export async function closeAdmin(): Promise<void> {
  await admin?.end();
  admin = undefined;
}

/** Polls `check` every 2 ms until it returns a truthy value, or fails after `timeoutMs`. */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined | null | false>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}

/** Waits until backend `pid` is blocked waiting for a heavyweight lock. */
export async function waitUntilWaiting(observer: Session, pid: number, what = `backend ${pid} to wait on a lock`): Promise<void> {
  await waitFor(what, async () => {
    const r = await observer.query('SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted', [pid]);
    return r.rowCount! > 0;
  });
}

/** Backends of this database waiting for a heavyweight lock (none while a step runs beside writers). */
export async function lockWaiters(observer: Session): Promise<number[]> {
  const r = await observer.query<{ pid: number }>(
    `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE NOT l.granted AND a.datname = current_database() ORDER BY 1`,
  );
  return r.rows.map((row) => row.pid);
}

/** The fence lock rows in pg_locks for this database: who holds or waits for which side (pid null: a prepared transaction). */
export async function fenceLocks(observer: Session, schema = 'tidemark'): Promise<{ pid: number | null; mode: string; granted: boolean }[]> {
  const key = fenceKey(schema);
  const classid = Number(BigInt.asUintN(64, key) >> 32n);
  const objid = Number(BigInt.asUintN(32, key));
  const r = await observer.query<{ pid: number | null; mode: string; granted: boolean }>(
    `SELECT pid, mode, granted FROM pg_locks
      WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1
      ORDER BY pid`,
    [classid, objid],
  );
  return r.rows;
}

/** The identity sequence's last allocated value (null before the first nextval). */
export async function lastAllocatedSeq(observer: Session, schema = 'tidemark'): Promise<bigint | null> {
  const r = await observer.query<{ last_value: string | null }>(
    `SELECT last_value FROM pg_sequences WHERE schemaname = $1 AND sequencename = 'events_seq_seq'`,
    [schema],
  );
  const v = r.rows[0]?.last_value;
  return v === null || v === undefined ? null : BigInt(v);
}

/** The published safe_seq. */
export async function safeSeq(observer: Session, schema = 'tidemark'): Promise<bigint> {
  const r = await observer.query<{ safe_seq: string }>(`SELECT safe_seq FROM ${quoteIdent(schema)}.watermark`);
  return BigInt(r.rows[0]!.safe_seq);
}

/** Inserts one event with plain SQL on `session`, returning its seq. */
export async function insertEvent(session: Pick<pg.ClientBase, 'query'>, stream = 's', schema = 'tidemark'): Promise<bigint> {
  const r = await session.query<{ seq: string }>(
    `INSERT INTO ${quoteIdent(schema)}.events (stream, kind, key, payload) VALUES ($1, 'k', 'key', '{}') RETURNING seq`,
    [stream],
  );
  return BigInt(r.rows[0]!.seq);
}

/** Waits until some backend waits for the exclusive side of the fence, and returns its pid. */
export async function waitForExclusiveWaiter(observer: Session, schema = 'tidemark'): Promise<number> {
  return waitFor('a watermarker waiting for the exclusive fence', async () => {
    const locks = await fenceLocks(observer, schema);
    return locks.find((l) => l.mode === 'ExclusiveLock' && !l.granted)?.pid;
  });
}

/** Waits until a backend running a statement that contains `fragment` waits on a lock; returns its pid. */
export async function waitForBlockedStatement(observer: Session, fragment: string): Promise<number> {
  return waitFor(`a statement containing ${fragment} to wait on a lock`, async () => {
    const r = await observer.query<{ pid: number }>(
      `SELECT a.pid FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.query LIKE $1 AND a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()`,
      [`%${fragment}%`],
    );
    return r.rows[0]?.pid;
  });
}

/** The SQLSTATE a statement fails with; fails the test when it succeeds. */
export async function failsWith(run: Promise<unknown>): Promise<string> {
  try {
    await run;
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
  throw new Error('expected the statement to fail');
}
